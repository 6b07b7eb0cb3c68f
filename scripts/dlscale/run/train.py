"""One rank of a cell: the CLI contract shared by every framework.

    python -m dlscale.run.train --cell FILE --rank-dir DIR

FILE holds the cell as one serialised value (dlscale.study.cell.Cell.to_json; the launcher writes
it at
DIR/cell.json): nobody re-parses a dozen flags on this side. The rank discovers who it is from the
launcher's environment, checks that against the cell's world size and ranks per node
(pre-flight), trains the cell's rank-side subset (TrainSpec.from_cell) with the framework's
adapter under the shared timing loop, and writes its own part file (rank_start, step...,
rank_end) in DIR. It marks how far it got (dlscale.run.first_contact: started, setting up,
first step, first step done) for the launcher's first-contact deadline.
"""

from __future__ import annotations

import argparse
import os
import resource
import socket
import sys
import time
from pathlib import Path

from dlscale import __version__
from dlscale.frameworks.train_spec import TrainSpec
from dlscale.models.zoo import record_of_cell
from dlscale.rank.network import rendezvous
from dlscale.rank.node_probes import PACKAGES_FILE, cpu_affinity, node_description, package_list
from dlscale.rank.provenance import host_facts, process_age_s, site_environment
from dlscale.rank.rank_context import discover
from dlscale.rank.timing import SYNC_AUDIT_ENV, SyncAudit, run_timed
from dlscale.registry.frameworks import get_adapter
from dlscale.run import first_contact
from dlscale.run.diagnosis import node_view
from dlscale.store.metrics import RankWriter, first_step_overhead, rank_summary
from dlscale.study.cell import Cell
from dlscale.study.protocol import IDLE_PROBE, RANK_END, RANK_START, STEP


class PreflightError(RuntimeError):
    pass


FAULT_ENV = "DLSCALE_FAULT"


def fault_hook(rank: int, rank_dir: str):
    """Fault injection for tests: DLSCALE_FAULT="<text in the cell path>:<rank>:<step>:<action>"
    makes that rank of the matching cell, before that step (warm-up counts; `setup`: before the
    framework's set-up, the process group or communicator), exit with the code
    <action>, hang (sleep) when <action> is `hang`, or sleep N seconds and go on when it is
    `sleepN` (a rank that compiles slowly). Several faults, each for its own cell, are separated
    by `;` (the first that matches this rank applies)."""
    specs = [s.rsplit(":", 3) for s in os.environ.get(FAULT_ENV, "").split(";") if s]
    mine = [s for s in specs if s[0] in rank_dir and int(s[1]) == rank]
    if not mine:
        return None
    _, _, f_step, code = mine[0]

    def before_step(step: int | str) -> None:
        if str(step) != f_step:
            return
        if code == "hang":
            print(
                f"[dlscale.run.train] {FAULT_ENV}: rank {rank} hangs before step {step}",
                file=sys.stderr,
                flush=True,
            )
            time.sleep(24 * 3600)
        if code == "oom":  # a rank that runs out of memory (dlscale.store.does_not_fit)
            raise MemoryError(f"{FAULT_ENV}: rank {rank} out of memory before step {step}")
        if code.startswith("sleep"):
            print(
                f"[dlscale.run.train] {FAULT_ENV}: rank {rank} sleeps {code[5:]} s "
                f"before step {step}",
                file=sys.stderr,
                flush=True,
            )
            time.sleep(float(code[5:]))
            return
        print(
            f"[dlscale.run.train] {FAULT_ENV}: rank {rank} exits with {code} before step {step}",
            file=sys.stderr,
            flush=True,
        )
        os._exit(int(code))

    return before_step


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="dlscale.run.train", description="one data-parallel training rank"
    )
    p.add_argument(
        "--cell",
        required=True,
        metavar="FILE",
        help="the cell, serialised (dlscale.study.cell.Cell.to_json)",
    )
    p.add_argument(
        "--rank-dir", required=True, metavar="DIR", help="where the rank writes its part file"
    )
    return p


def preflight(ctx, expect_world: int | None, expect_rpn: int | None) -> None:
    """Fail the cell early and clearly when the launch does not match the cell."""
    problems = []
    if expect_world is not None and ctx.world_size != expect_world:
        problems.append(f"world size is {ctx.world_size}, the cell needs {expect_world}")
    if expect_rpn is not None and ctx.local_world_size != expect_rpn:
        problems.append(
            f"{ctx.local_world_size} rank(s) on node {ctx.node}, the cell needs {expect_rpn}"
        )
    if problems:
        raise PreflightError(
            f"pre-flight check failed on rank {ctx.rank} ({ctx.launcher}): " + "; ".join(problems)
        )


def describe_node(adapter, ctx, rank_dir: str) -> dict:
    """The node's system description (dlscale.rank.node_probes), by its local rank 0 only: once per
    node, after setup and before the timed window (the other ranks wait for it at the first
    collective of the warm-up). The environment's package list goes beside the part file
    (PACKAGES_FILE); the launcher keeps one copy per distinct list in the study's folder."""
    started = time.perf_counter()
    try:
        packages = package_list()
    except Exception:  # the packages section then says why
        packages = None
    system = node_description(
        ask_controller=ctx.rank == 0, packages=packages, build_info=adapter.build_info
    )
    if packages is not None and system["packages"].get("available"):
        name = PACKAGES_FILE.format(sha256=system["packages"]["sha256"])
        try:
            (Path(rank_dir) / name).write_text(packages)
        except OSError as exc:
            system["packages"]["list_not_kept"] = str(exc)
    system["probe_seconds"] = round(time.perf_counter() - started, 4)  # the whole cost
    return system


def open_dataset(cell: Cell):
    """A convergence cell's dataset (dlscale.data.inspect_dataset), checked against its model:
    the same image shape and number of classes, or a clear error naming both."""
    from dlscale.data import inspect_dataset
    from dlscale.models import get_spec

    info = inspect_dataset(cell.data_path, cell.data_format, key="convergence.dataset")
    model = get_spec(cell.model)
    height, width, channels = info.image_shape
    if model.family != "vision" or tuple(model.input_shape) != (channels, height, width):
        raise ValueError(
            f"model {cell.model} takes inputs of shape {tuple(model.input_shape)}, but dataset "
            f"{cell.dataset} holds {height}x{width}x{channels} images (channels {channels})"
        )
    if model.num_classes != info.num_classes:
        raise ValueError(
            f"model {cell.model} has {model.num_classes} classes, dataset {cell.dataset} "
            f"{info.num_classes}"
        )
    return info


def stage_dataset(cell: Cell, info):
    """A convergence cell's dataset copied to its hardware's stage_dir, once per node
    (dlscale.data.staging: the first rank of a node copies, the others wait; an identical copy
    is reused), and what that took; the dataset where it is and None without a stage_dir."""
    if not cell.stage_dir:
        return info, None
    from dlscale.data.staging import stage

    staged, seconds, copied = stage(info, cell.stage_dir)
    return staged, {
        "stage_dir": cell.stage_dir,
        "path": staged.path,
        "seconds": seconds,
        "bytes_copied": copied,
        "reused": copied == 0,  # the copy was there already, or another rank of the node made it
    }


def dataset_description(cell: Cell, info, staging: dict | None = None) -> dict:
    """What a convergence cell's ranks train on, for its rank_start record (`staging`: from
    stage_dataset, or None when the ranks read the dataset where it is)."""
    return {
        "data": f"real: {cell.dataset} ({cell.data_format}), {info.train_samples} training and "
        f"{info.val_samples} validation samples",
        "dataset": {
            "name": cell.dataset,
            "format": cell.data_format,
            "path": str(cell.data_path),
            "train_samples": info.train_samples,
            "val_samples": info.val_samples,
            "num_classes": info.num_classes,
            "image_shape": list(info.image_shape),
        },
        "staging": staging
        or {"stage_dir": None, "reason": "no stage_dir in the hardware entry: read in place"},
    }


def main(argv: list[str] | None = None) -> int:
    # where the rank's time goes before its timed work (rank_end `phases`; benchmarks/
    # cell_phases.py): seconds since the process started at each point
    age = process_age_s()
    clock = time.perf_counter()
    stamps = {"interpreter_and_imports": age}

    def stamp(name: str) -> None:
        nonlocal clock
        now = time.perf_counter()
        stamps[name] = round(now - clock, 4)
        clock = now

    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        cell = Cell.read(args.cell)
    except (OSError, ValueError, TypeError) as exc:
        parser.error(f"--cell {args.cell}: {exc}")
    ctx = discover()
    # each node's first rank records its node's view (one `ip` per node, not per rank)
    view = node_view() if ctx.local_rank == 0 else {"host": socket.gethostname()}
    first_contact.mark(args.rank_dir, ctx.rank, first_contact.STARTED, **view)
    preflight(ctx, cell.world_size, cell.ranks_per_node)
    # MASTER_ADDR resolved here and the collectives' interface chosen or checked, before any
    # framework waits on a peer (dlscale.rank.network: a network the ranks cannot use fails now)
    network = rendezvous(ctx, cell.device)
    spec = TrainSpec.from_cell(cell)
    record_of_cell(cell.model, cell.model_source)  # a study's own model, known to this rank
    adapter = get_adapter(spec.framework)(spec, ctx)
    stamp("framework_import")
    convergence = cell.workload == "convergence"
    info, staging = stage_dataset(cell, open_dataset(cell)) if convergence else (None, None)
    writer = RankWriter(args.rank_dir, ctx.rank)
    fault = fault_hook(ctx.rank, args.rank_dir)
    before_step = first_contact.step_hook(args.rank_dir, ctx.rank, fault)
    try:
        if fault:
            fault("setup")
        first_contact.mark(args.rank_dir, ctx.rank, first_contact.SETTING_UP)
        adapter.setup()
        stamp("setup")  # process group, model, optimizer
        first_contact.mark(args.rank_dir, ctx.rank, first_contact.FIRST_STEP)
        system = describe_node(adapter, ctx, args.rank_dir) if ctx.local_rank == 0 else None
        stamp("describe_node")
        site = site_environment(args.rank_dir)  # the entry's modules and env, as seen here
        start = rank_start(cell, adapter, ctx, system, info, staging, site, network)
        writer.write(RANK_START, start)
        if convergence:
            converge(cell, adapter, info, writer, before_step)
        else:
            measure(cell, adapter, writer, stamps, before_step)
        # a cell of one step never calls the hook before step 1
        first_contact.mark(args.rank_dir, ctx.rank, first_contact.FIRST_STEP_DONE)
    except Exception as exc:
        if not adapter.out_of_memory(exc):
            raise
        # does not fit at this size: a result (dlscale.store.does_not_fit), recorded before the
        # rank ends
        from dlscale.store.does_not_fit import DOES_NOT_FIT_EXIT, record_rank

        record_rank(args.rank_dir, ctx.rank, exc, adapter.memory_per_rank())
        print(
            f"[dlscale.run.train] rank {ctx.rank} does not fit: {exc}", file=sys.stderr, flush=True
        )
        return DOES_NOT_FIT_EXIT
    finally:
        writer.close()
        adapter.teardown()
    return 0


def rank_start(
    cell: Cell,
    adapter,
    ctx,
    system: dict | None,
    info,
    staging,
    site: dict | None = None,
    network: dict | None = None,
) -> dict:
    """The rank_start record: the host's facts (load average just before the timed window),
    the adapter's description and execution, who this rank is and, on its node's first rank,
    the node's description; a convergence cell's dataset; the hardware entry's modules and env
    as this rank saw them (`site`: dlscale.rank.provenance.site_environment), where it has any;
    what MASTER_ADDR resolved to here and the collectives' interface (`network`:
    dlscale.rank.network.rendezvous)."""
    spec = adapter.spec
    facts = host_facts()  # load average just before the timed window
    return {
        **facts,
        **adapter.describe(),
        **adapter.execution(),
        "dlscale_version": __version__,
        "local_rank": ctx.local_rank,
        "node_index": ctx.node_index,
        "launcher": ctx.launcher,
        "device": spec.device,
        "gpu": adapter.gpu,  # the physical board (dlscale.rank.devices), None on a CPU
        "threads": spec.threads,
        "per_rank_batch": spec.per_rank_batch,
        "timer": adapter.step_timer().method,
        "master": f"{ctx.master_addr}:{ctx.master_port}",
        **({"network": network} if network is not None else {}),
        "cpu_affinity": cpu_affinity(),
        **({"system": system} if system is not None else {}),
        **({"site_env": site} if site is not None else {}),
        **(dataset_description(cell, info, staging) if cell.workload == "convergence" else {}),
    }


def measure(cell: Cell, adapter, writer: RankWriter, stamps: dict, before_step) -> None:
    """A throughput cell's rank: the shared timing loop (dlscale.rank.timing.run_timed,
    audited where DLSCALE_SYNC_AUDIT=1), then its idle_probe, step and rank_end records
    (`stamps`: the rank's phases before its timed work)."""
    spec = adapter.spec
    audit = SyncAudit(adapter) if os.environ.get(SYNC_AUDIT_ENV) == "1" else None
    run = run_timed(adapter, before_step, audit)
    if audit:
        audit.uninstall()
    writer.write(IDLE_PROBE, run["idle_probe"])
    for i, seconds in enumerate(run["step_seconds"]):
        writer.write(STEP, {"step": i, "seconds": seconds, "samples": spec.per_rank_batch})
    peak_rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    writer.write(
        RANK_END,
        {
            **rank_summary(
                run["step_seconds"], spec.per_rank_batch, peak_rss_mb, run["window_seconds"]
            ),
            "first_step_seconds": run["first_step_seconds"],
            "compile_seconds": first_step_overhead(run["first_step_seconds"], run["step_seconds"]),
            "mode": cell.mode,
            "rewarm_steps": run["rewarm_steps"],
            "first_step_deadline": run["first_step_deadline"],
            "peak_device_memory_mb": adapter.peak_device_memory_mb(),
            "memory": adapter.memory_per_rank(),
            "energy": run["energy"],
            "telemetry": run["telemetry"],
            "phases": {**stamps, **run["phases"]},
            "breakdown": run["breakdown"],
            "allreduce": run["allreduce"],
            # the attention kernel that ran, a trace: measured after the window
            **run.get("after_window", {}),
            **({"sync_audit": run["sync_audit"]} if "sync_audit" in run else {}),
        },
    )


NOT_IN_CONVERGENCE = "not measured in a convergence cell (it trains by epochs on real data)"


def converge(cell: Cell, adapter, info, writer: RankWriter, before_step=None) -> int:
    """A convergence cell's rank (dlscale.run.convergence_loop): an epoch record per epoch, then
    rank_end
    with the rank's training time, samples and throughput over its epochs."""
    from dlscale.run.convergence_loop import run_convergence

    run = run_convergence(adapter, cell, info, writer.write, before_step=before_step)
    peak_rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    writer.write(
        RANK_END,
        {
            **run,
            "peak_rss_mb": peak_rss_mb,
            "first_step_seconds": run["warmup_pass_seconds"],
            "compile_seconds": run["warmup_pass_seconds"] if cell.mode == "compiled" else None,
            "mode": cell.mode,
            "peak_device_memory_mb": adapter.peak_device_memory_mb(),
            "energy": {"available": False, "reason": NOT_IN_CONVERGENCE},
            "breakdown": {"available": False, "reason": NOT_IN_CONVERGENCE},
            "allreduce": {"available": False, "reason": NOT_IN_CONVERGENCE},
        },
    )
    return 0


def exit_now(code: int) -> None:
    """End the rank without the interpreter's finalisation, which takes about 1 s once torch
    is loaded (benchmarks/cell_phases.py) and holds up the cell's end: by now every record is
    written and closed and the framework torn down. A rank with child processes (data-loading
    workers) exits normally, so they are reaped."""
    import multiprocessing

    sys.stdout.flush()
    sys.stderr.flush()
    if multiprocessing.active_children():
        sys.exit(code)
    os._exit(code)


if __name__ == "__main__":
    exit_now(main())

"""A preflight: one short job per (hardware entry, environment) before the matrix's cells run.

The driver (dlscale.workflow.preflight) submits it with the entry's partition, GPUs and task
geometry, and holds that entry's cells behind it (a Slurm dependency). Inside the allocation

    <the environment's python> -m dlscale.run.preflight_job job --spec SPEC --output RESULT

runs with the interpreter a cell's launcher runs with, and the entry's modules and environment
loaded as a cell's launcher loads them (dlscale.run.site_env). It checks, in order, and stops at
the first failure:
  1. on the first node, for a GPU entry: `nvidia-smi` sees the site file's GPUs (count and model),
     and the environment's CUDA build runs on the node's driver, read against the driver table
     (dlscale.registry.cuda_drivers.driver_runs: the same table the login-side check reads);
     the GPU/NUMA topology (`nvidia-smi topo -m`) is recorded;
  2. the ranks, started by the cell launcher's own functions (dlscale.run.launch: srun over
     the probe's nodes, one rank per GPU or per the entry's ranks per node, with the binding
     the cells get): a GPU rank first checks what Slurm bound it to (its CPU affinity and the
     GPUs it sees) against the entry's gpu_binding (dlscale.rank.devices.binding_check; two
     ranks of a node on one GPU fail it too), so a site default, a cli_filter or a job_submit
     plugin that binds otherwise fails the entry here, naming the rank, what it got and what it
     should have got; then each imports its
     framework's adapter (the framework itself), sees its GPU, and joins one communicator
     (torch.distributed, NCCL on GPUs and gloo on CPUs, where the environment has torch) whose
     all-reduce bus bandwidth is measured (median of ALLREDUCE_REPEATS after a warm-up).
The ranks' phase is bounded (RANKS_TIMEOUT_S, communicator set-up included). The result is one
JSON file (`passed`, every check with what it saw, the fix of the first failure); the job exits 1
on a failure, which Slurm's dependency turns into the cancellation of the entry's cells.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import re
import socket
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path

from dlscale.rank.devices import binding_check
from dlscale.rank.network import NetworkError, rendezvous
from dlscale.rank.node_probes import gpu_facts
from dlscale.rank.rank_context import discover
from dlscale.registry.cuda_drivers import driver_runs, fitting_lines
from dlscale.registry.cuda_probes import built_cuda_version, site_packages
from dlscale.registry.frameworks import FRAMEWORKS
from dlscale.registry.launchers import on_slurm
from dlscale.store.metrics_summary import shared_gpus
from dlscale.store.preflight_results import RESULT_VERSION, summary, write_result
from dlscale.study.cell import Cell, tail_lines

RANKS_TIMEOUT_S = 180  # the ranks' phase: start-up, imports, communicator set-up, all-reduces
COMMUNICATOR_TIMEOUT_S = 120  # torch.distributed's own timeout for the set-up and each collective
ALLREDUCE_BYTES = {"cuda": 64 << 20, "cpu": 4 << 20}
ALLREDUCE_WARMUP, ALLREDUCE_REPEATS = 2, 5
RANK_FILE = "preflight-rank{rank}.json"
MODULE = "dlscale.run.preflight_job"


def check(name: str, ok: bool, detail: str, fix: str | None = None) -> dict:
    return {"name": name, "ok": bool(ok), "detail": detail, "fix": None if ok else fix}


# ------------------------------------------------------------------------ the first node's checks
def gpu_checks(entry: dict, gpus: dict, cuda: str | None, ranks_per_node: int) -> list[dict]:
    """Count, model and driver of a GPU entry's node (`gpus`: node_probes.gpu_facts) against
    the site file (`entry`) and the environment's CUDA build (`cuda`, None: no CUDA build)."""
    if not gpus.get("available"):
        return [
            check(
                "GPUs visible",
                False,
                gpus.get("reason", "nvidia-smi gave nothing"),
                "the job must see the node's GPUs: check the entry's partition, gpus_per_node "
                "and gpu_request, and that nvidia-smi runs on the node (modules)",
            )
        ]
    count, models, drivers = gpus["count"], gpus["models"], gpus["drivers"]
    want = int(entry.get("gpus_per_node") or ranks_per_node)
    checks = [
        check(
            "GPU count",
            count >= ranks_per_node,
            f"{count} GPU(s) visible to the job; the site file says {want} per node and the "
            f"cells run {ranks_per_node} rank(s) per node",
            "correct gpus_per_node in config/hardware.yaml, or request the GPUs "
            "(gpu_request, gpu_type)",
        )
    ]
    model = entry.get("device_model")
    if model:
        checks.append(
            check(
                "GPU model",
                models == [model],
                f"nvidia-smi names {', '.join(models)}; the site file says {model}",
                f"set device_model to what the nodes have ({', '.join(models)}) or choose the "
                "entry's partition/constraint so its nodes have the stated GPU",
            )
        )
    driver = drivers[0] if len(drivers) == 1 else None
    if driver is None:
        checks.append(
            check(
                "driver",
                False,
                f"the node's GPUs report different drivers: {', '.join(drivers)}",
                "report the node to the site",
            )
        )
    elif cuda is None:
        checks.append(check("driver", True, f"driver {driver}; the environment has no CUDA build"))
    else:
        runs, why = driver_runs(
            {"nvidia_driver": driver, "cuda_forward_compat": entry.get("cuda_forward_compat")},
            cuda,
        )
        lines = fitting_lines({"nvidia_driver": driver})
        checks.append(
            check(
                "CUDA build on the node's driver",
                runs,
                f"the environment's CUDA {cuda} build on driver {driver}: {why}",
                f"state the nodes' driver in the entry (nvidia_driver: {driver}), which picks a "
                f"CUDA line the driver runs ({', '.join(lines) or 'none in the table'}), "
                "or use the site's CUDA forward-compatibility package (cuda_forward_compat)",
            )
        )
    return checks


def environment_cuda(prefix: str = sys.prefix) -> str | None:
    """The CUDA version the running environment's framework build was made for (its files)."""
    sp = site_packages(Path(prefix))
    return None if sp is None else built_cuda_version(sp)


# ------------------------------------------------------------------------------------ the job
def run_job(spec: dict, output: Path) -> int:
    """In the preflight's allocation: the node's checks, then the ranks'; the result file."""
    from dlscale.run.launch import wait_all
    from dlscale.run.launchers import REGISTERED, ContainerError
    from dlscale.run.site_env import SiteEnvError, job_environment

    cell, entry = Cell.from_dict(spec["cell"]), spec["entry"]
    started = time.time()
    result = {
        "version": RESULT_VERSION,
        "key": spec["key"],
        "hardware": cell.hardware,
        "environment": spec["environment"],
        "environment_id": cell.environment,
        "framework": cell.framework,
        "slurm_job": os.environ.get("SLURM_JOB_ID"),
        "host": socket.gethostname(),
        "nodes": cell.nodes,
        "ranks": cell.world_size,
        "started_at": started,
    }
    checks: list[dict] = []
    # the entry's modules and env, loaded as a cell's launcher loads them; the ranks inherit them
    try:
        site = job_environment(cell.modules, dict(cell.env))
    except SiteEnvError as exc:
        checks.append(
            check(
                "modules and env",
                False,
                str(exc),
                "correct the entry's modules (`module avail` on a compute node) or env",
            )
        )
    else:
        os.environ.clear()
        os.environ.update(site.environment)
        result["site_environment"] = site.record()
    # A container entry's framework build is the image's: its ranks (inside the container, as
    # a cell's) say which CUDA it was made for, and the node's GPU checks follow theirs.
    container = dict(cell.container)
    cuda = None if container else environment_cuda()
    result["cuda_build"] = cuda
    gpus = None
    if cell.device == "cuda" and not checks:
        gpus = gpu_facts()
        result["gpus"] = {k: v for k, v in gpus.items() if k != "devices"}
        if not container:
            checks += gpu_checks(entry, gpus, cuda, cell.ranks_per_node)
    if all(c["ok"] for c in checks):
        rank_dir = output.parent / f"{output.stem}.ranks"
        rank_dir.mkdir(parents=True, exist_ok=True)
        argv = [sys.executable, "-m", MODULE, "rank", "--spec", spec["path"]]
        argv += ["--rank-dir", str(rank_dir)]
        start = REGISTERED[cell.launcher].start
        try:
            failed = wait_all(start(cell, argv, rank_dir), timeout=RANKS_TIMEOUT_S)
        except ContainerError as exc:
            checks.append(check("container", False, str(exc), "bind the paths named"))
            failed = (-1, 1)
        if container:
            builds = rank_builds(cell, rank_dir)
            result["container"] = {**container, "ranks": builds}
            cuda = result["cuda_build"] = next((b["cuda_build"] for b in builds), None)
            if gpus is not None:
                checks = gpu_checks(entry, gpus, cuda, cell.ranks_per_node) + checks
        checks += rank_checks(cell, rank_dir, failed)
        result["allreduce"] = allreduce_summary(rank_dir)
    result["checks"] = checks
    result["passed"] = all(c["ok"] for c in checks)
    bad = next((c for c in checks if not c["ok"]), None)
    result["failed"] = bad
    result["finished_at"] = time.time()
    write_result(output, result)
    print(f"preflight {summary(result)}", flush=True)
    return 0 if result["passed"] else 1


def rank_checks(cell: Cell, rank_dir: Path, failed) -> list[dict]:
    """Every rank's own record (binding, import, device, communicator) and whether two ranks of
    a node take one GPU; a rank with none is named with the end of its log (and of srun's,
    where srun itself refused the step, e.g. a binding Slurm cannot satisfy)."""
    records, missing = {}, []
    for rank in range(cell.world_size):
        path = rank_dir / RANK_FILE.format(rank=rank)
        try:
            records[rank] = json.loads(path.read_text())
        except (OSError, ValueError):
            missing.append(rank)
    checks = []
    for name in ("binding", "framework import", "device", "network", "communicator"):
        bad = [
            (r, c) for r, rec in sorted(records.items()) for c in rec["checks"] if c["name"] == name
        ]
        if bad:
            failing = [(r, c) for r, c in bad if not c["ok"]]
            if failing:
                r, c = failing[0]
                detail = c["detail"] if name == "binding" else f"rank {r}: {c['detail']}"
                checks.append(check(name, False, detail, c["fix"]))
            else:
                checks.append(check(name, True, f"{len(bad)} rank(s): {bad[0][1]['detail']}"))
        if name == "binding":
            checks += shared_boards(cell, records)
    unreachable = unreachable_nodes(rank_dir / "srun.log") if missing else {}
    if unreachable:
        nodes = ", ".join(unreachable)
        checks.append(
            check(
                "nodes reachable",
                False,
                f"srun could not start rank(s) {', '.join(map(str, missing))} of "
                f"{cell.world_size}: "
                + "; ".join(f"node {n}: {why}" for n, why in unreachable.items()),
                f"node(s) {nodes} cannot be reached from the job's first node (the node's "
                "network or its slurmd is down): ask the site, or keep the study off it (the "
                f"entry's sbatch_options: --exclude={','.join(unreachable)})",
            )
        )
    elif missing:
        log = rank_dir / f"rank{missing[0]}.log"
        srun_log = rank_dir / "srun.log"
        srun_text = tail_lines(srun_log, 8) if srun_log.exists() else ""
        srun_said = f"\nthe end of srun's log:\n{srun_text}" if srun_text.strip() else ""
        why = (
            f"not every rank finished within {RANKS_TIMEOUT_S} s"
            if failed is not None and failed[1] is None
            else "ranks ended without a record"
        )
        checks.append(
            check(
                "ranks started",
                False,
                f"{why}: rank(s) {', '.join(map(str, missing))} of {cell.world_size}; the end "
                f"of rank {missing[0]}'s log:\n{tail_lines(log, 15)}{srun_said}",
                "read the ranks' logs beside the result; a rank that never starts points at the "
                "environment or the modules",
            )
        )
    return checks


def unreachable_nodes(srun_log: Path) -> dict[str, str]:
    """The nodes srun could not start tasks on, with srun's reason (`Task launch for StepId=...
    failed on node n2: Communication connection failure`), in the order srun named them."""
    try:
        text = srun_log.read_text(errors="replace")
    except OSError:
        return {}
    found: dict[str, str] = {}
    for node, why in re.findall(r"[Tt]ask launch for \S+ failed on node (\S+): (.+)", text):
        found.setdefault(node, why.strip())
    return found


def rank_builds(cell: Cell, rank_dir: Path) -> list[dict]:
    """Where each rank's interpreter ran (sys.prefix, sys.executable) and the CUDA version its
    framework build was made for: in a container entry, the image's environment."""
    builds = []
    for rank in range(cell.world_size):
        try:
            record = json.loads((rank_dir / RANK_FILE.format(rank=rank)).read_text())
        except (OSError, ValueError):
            continue
        builds.append({k: record.get(k) for k in ("rank", "prefix", "executable", "cuda_build")})
    return builds


def shared_boards(cell: Cell, records: dict) -> list[dict]:
    """A failed `binding` check where two ranks of a node take one GPU (each rank's record names
    the board it takes: dlscale.rank.devices.binding_check); nothing where each has its own."""
    shared = shared_gpus([rec for rec in records.values() if rec.get("gpu")])
    if not shared:
        return []
    first = shared[0]
    return [
        check(
            "binding",
            False,
            f"gpu_binding {cell.gpu_binding}: ranks {', '.join(map(str, first['ranks']))} on "
            f"{first['node']} all take GPU {first['gpu']}; each rank should have a GPU of its own",
            "a site default, a cli_filter or a job_submit plugin bound the ranks otherwise than "
            "the launcher stated, or the job holds no GPU next to some rank (closest takes the "
            "job's GPUs next to each rank's NUMA node): ask the site, or choose another "
            "gpu_binding in config/hardware.yaml",
        )
    ]


def allreduce_summary(rank_dir: Path) -> dict | None:
    """Rank 0's all-reduce measurement (every rank takes part in each one)."""
    try:
        record = json.loads((rank_dir / RANK_FILE.format(rank=0)).read_text())
    except (OSError, ValueError):
        return None
    return record.get("allreduce")


# ----------------------------------------------------------------------------------- a rank
def run_rank(spec: dict, rank_dir: Path) -> int:
    ctx = discover()
    cell = Cell.from_dict(spec["cell"])
    record = {
        "rank": ctx.rank,
        "node": ctx.node,
        "checks": [],
        "prefix": sys.prefix,  # the rank's environment: a container's, where the entry has one
        "executable": sys.executable,
        "cuda_build": environment_cuda(),
    }
    checks = record["checks"]
    if cell.device == "cuda" and on_slurm(cell.launcher):
        # first, before any import: what Slurm bound this rank to, against gpu_binding
        got = binding_check(
            cell.gpu_binding,
            ctx.local_rank,
            ctx.local_world_size,
            who=f"rank {ctx.rank} (local rank {ctx.local_rank} on {ctx.node})",
        )
        checks.append(check("binding", got.pop("ok"), got.pop("detail"), got.pop("fix")))
        record["binding"], record["gpu"] = got, got["gpu"]
        if not checks[-1]["ok"]:
            return _write_rank(rank_dir, ctx.rank, record, 1)
    record_of = FRAMEWORKS[cell.framework]
    modules = [record_of.adapter, *record_of.imports]
    t0 = time.perf_counter()
    try:
        versions = {name: _imported_version(name) for name in modules}
    except Exception as exc:  # an import failure is what this check is for
        checks.append(
            check(
                "framework import",
                False,
                f"{type(exc).__name__}: {exc}",
                "the environment or the entry's modules are missing a library (rebuild the "
                "environment with scripts/setup.sh, or add the module)",
            )
        )
        return _write_rank(rank_dir, ctx.rank, record, 1)
    shown = ", ".join(f"{n} {v}" for n, v in versions.items() if v)
    checks.append(check("framework import", True, f"{shown} in {time.perf_counter() - t0:.1f} s"))
    # MASTER_ADDR resolved here, the collectives' interface chosen or the site's checked, as a
    # cell's rank does (dlscale.rank.network), in every framework's environment
    try:
        record["network"] = rendezvous(ctx, cell.device)
    except NetworkError as exc:
        checks.append(
            check(
                "network",
                False,
                f"rank {ctx.rank} on {ctx.node}: {exc}",
                "the nodes must resolve each other's names to addresses they can reach; name "
                "the interface they share in the entry's env (GLOO_SOCKET_IFNAME, "
                "NCCL_SOCKET_IFNAME)",
            )
        )
        return _write_rank(rank_dir, ctx.rank, record, 1)
    checks.append(check("network", True, network_detail(record["network"])))
    try:
        import torch
        import torch.distributed as dist
    except ImportError:
        checks.append(
            check(
                "communicator",
                True,
                f"not checked: {cell.framework}'s environment has no torch.distributed; its "
                "collective is first formed by the cells",
            )
        )
        return _write_rank(rank_dir, ctx.rank, record, 0)
    device = torch.device("cpu")
    if cell.device == "cuda":
        from dlscale.rank.devices import DeviceChoiceError, pick_gpu

        try:
            count = torch.cuda.device_count()
            index = pick_gpu(ctx.local_rank, ctx.local_world_size, count)
            torch.cuda.set_device(index)
            device = torch.device("cuda", index)
            torch.ones(1, device=device).sum().item()  # a kernel runs on the board
        except (DeviceChoiceError, RuntimeError, AssertionError) as exc:
            checks.append(
                check(
                    "device",
                    False,
                    f"{type(exc).__name__}: {exc}",
                    "check the entry's gpu_binding and the CUDA build against the driver",
                )
            )
            return _write_rank(rank_dir, ctx.rank, record, 1)
        checks.append(check("device", True, f"{torch.cuda.get_device_name(index)}"))
    if ctx.world_size == 1:
        checks.append(check("communicator", True, "one rank: no communicator to form"))
        return _write_rank(rank_dir, ctx.rank, record, 0)
    backend = "nccl" if cell.device == "cuda" else "gloo"
    try:
        dist.init_process_group(
            backend,
            init_method=f"tcp://{ctx.master_addr}:{ctx.master_port}",
            rank=ctx.rank,
            world_size=ctx.world_size,
            timeout=timedelta(seconds=COMMUNICATOR_TIMEOUT_S),
        )
        record["allreduce"] = measure_allreduce(dist, torch, device, cell.device, ctx.world_size)
        dist.destroy_process_group()
    except Exception as exc:  # the communicator's own error is the diagnosis
        checks.append(
            check(
                "communicator",
                False,
                f"{backend} over {ctx.world_size} ranks: {type(exc).__name__}: {exc}",
                "the ranks cannot reach each other: check the network interface the "
                "collective uses (env: NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME) and the "
                "nodes' firewall",
            )
        )
        return _write_rank(rank_dir, ctx.rank, record, 1)
    bw = record["allreduce"]["busbw_gbps"]
    checks.append(
        check("communicator", True, f"{backend}, {ctx.world_size} ranks, {bw:.2f} GB/s bus")
    )
    return _write_rank(rank_dir, ctx.rank, record, 0)


def network_detail(net: dict) -> str:
    """What the network check saw: MASTER_ADDR's address here, the interface and why."""
    if net["interface"] is None:
        return f"MASTER_ADDR {net['master_addr']} is {net['master_resolved']}: {net['chosen_by']}"
    return (
        f"MASTER_ADDR {net['master_addr']} is {net['master_resolved']} on {net['node']}; "
        f"{net['interface']} ({net['address']}), {net['chosen_by']}"
    )


def _imported_version(name: str) -> str | None:
    module = importlib.import_module(name)
    return getattr(module, "__version__", None)


def measure_allreduce(dist, torch, device, kind: str, world: int) -> dict:
    """Bus bandwidth of an all-reduce (nccl-tests' convention: bytes x 2(n-1)/n / time)."""
    size = ALLREDUCE_BYTES[kind]
    buf = torch.ones(size // 4, dtype=torch.float32, device=device)
    seconds = []
    for i in range(ALLREDUCE_WARMUP + ALLREDUCE_REPEATS):
        if kind == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        dist.all_reduce(buf)
        if kind == "cuda":
            torch.cuda.synchronize()
        if i >= ALLREDUCE_WARMUP:
            seconds.append(time.perf_counter() - t0)
    median = statistics.median(seconds)
    return {
        "bytes": size,
        "ranks": world,
        "n": len(seconds),
        "warmup": ALLREDUCE_WARMUP,
        "median_s": median,
        "min_s": min(seconds),
        "max_s": max(seconds),
        "busbw_gbps": size * 2 * (world - 1) / world / median / 1e9,
    }


def _write_rank(rank_dir: Path, rank: int, record: dict, code: int) -> int:
    path = rank_dir / RANK_FILE.format(rank=rank)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record, sort_keys=True))
    tmp.replace(path)
    return code


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=f"python -m {MODULE}", description=__doc__)
    sub = parser.add_subparsers(dest="what", required=True)
    job = sub.add_parser("job", help="in the preflight's allocation (the driver submits it)")
    job.add_argument("--spec", type=Path, required=True)
    job.add_argument("--output", type=Path, required=True)
    rank = sub.add_parser("rank", help="one rank (started by `job`)")
    rank.add_argument("--spec", type=Path, required=True)
    rank.add_argument("--rank-dir", type=Path, required=True)
    args = parser.parse_args(argv)
    spec = json.loads(args.spec.read_text())
    spec["path"] = str(args.spec)
    if args.what == "job":
        return run_job(spec, args.output)
    return run_rank(spec, args.rank_dir)


if __name__ == "__main__":
    sys.exit(main())

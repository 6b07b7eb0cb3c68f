"""Where ranks start.

`python -m dlscale.run.launch --cell-json CELL --output metrics.jsonl` runs one cell (CELL is
`dlscale.study.cell.Cell.to_json()`):
  1. loads the hardware entry's modules and sets its env (dlscale.run.site_env, once: the ranks
     start with that environment), writes the cell for its ranks (.ranks/cell.json) and starts
     nodes x ranks_per_node ranks of `python -m dlscale.run.train --cell .ranks/cell.json`,
     either as local processes (launcher `local`: the embedded default, one simulated node per
     group of ranks) or with `srun` inside the cell's Slurm allocation (launcher `srun`);
  2. waits for all of them; if one fails, the others are stopped and the cell fails with the
     rank, its exit code and the last lines of its log; communicator set-up and the first step
     are bounded from outside the ranks (dlscale.run.first_contact), and a failed cell's record
     and log end with the communication libraries' diagnosis (dlscale.run.diagnosis);
  3. merges the ranks' part files into the cell's metrics file (dlscale.store.metrics),
     validated and renamed into place only when complete, in a folder of its own that keeps
     this measurement with its logs (measurements/<time>-<job>/, dlscale.store.measurements);
     the cell's metrics.jsonl is a hard link to it.

The other half, inside a rank, is dlscale.rank.rank_context (`discover()` reads who-am-I from the
launcher's environment: dlscale's local launcher, srun, or torchrun).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from dlscale.rank.node_probes import job_allocation
from dlscale.rank.provenance import git_commit
from dlscale.run import first_contact
from dlscale.run.diagnosis import diagnosis, render
from dlscale.run.launchers import ContainerError, launcher_for
from dlscale.run.launchers.srun import allocation_nodes, pack_nodes
from dlscale.run.site_env import SiteEnvError, job_environment
from dlscale.store import metrics
from dlscale.store.does_not_fit import DOES_NOT_FIT
from dlscale.store.does_not_fit import rank_records as fit_records
from dlscale.store.does_not_fit import reason as fit_reason
from dlscale.store.measurements import keep_measurement
from dlscale.study.cell import (
    CELL_SPEC_FILE,
    ENVIRONMENTS_DIR,
    FAILURE_FILE,
    RANK_DIR,
    SITE_ENV_FILE,
    SLURM_JOB_FILE,
    Cell,
    study_dir_of,
    tail_lines,
)
from dlscale.study.protocol import RANK_END


# ----------------------------------------------------------------------------- the ranks' command
def train_argv(rank_dir: Path, python: str) -> list[str]:
    """The one CLI contract every framework's rank obeys (dlscale.run.train): the cell, serialised
    whole in the rank folder (write_cell_spec), and the folder the rank writes its part file to."""
    return [
        python,
        "-m",
        "dlscale.run.train",
        "--cell",
        str(rank_dir / CELL_SPEC_FILE),
        "--rank-dir",
        str(rank_dir),
    ]


def write_cell_spec(cell: Cell, rank_dir: Path) -> Path:
    """The cell as its ranks read it (dlscale.run.train: Cell.read)."""
    path = rank_dir / CELL_SPEC_FILE
    path.write_text(cell.to_json())
    return path


def _stop(procs, grace: float = 10.0) -> None:
    for _, p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGTERM)
    deadline = time.time() + grace
    for _, p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.time()))
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


FIRST_CONTACT_FAILED = (-3, 124)  # wait_all's failure when the first-contact deadline passed
# wait_all's failure when srun reported a rank's failure but could not end the step: a node of
# the step is unreachable (its ranks' ends never reach srun), and srun would wait for it until
# Slurm declares the node down (SlurmdTimeout, minutes) or the job's time limit
STEP_STUCK = (-4, 124)
STEP_END_GRACE_S = 10.0  # from srun's report of a failed rank to the step's end, at most
# what srun prints once a rank failed and it ends the step (srun.log)
_STEP_FAILING = re.compile(
    r"tasks? [\d,-]+: (?:Exited with exit code [1-9]|Killed)|Terminating Step"
)


class StepWatch:
    """srun's own log of the ranks' step (srun.log): once srun reports a failed rank, the step
    must end within STEP_END_GRACE_S (srun stops the other ranks, Slurm's KillWait); a step
    still running then waits on a node srun cannot reach (expired)."""

    def __init__(self, log: Path, grace_s: float | None = None):
        self.log = log
        self.grace_s = STEP_END_GRACE_S if grace_s is None else grace_s
        self.failing_since: float | None = None
        self._checked = 0.0

    def expired(self) -> bool:
        now = time.monotonic()
        if self.failing_since is None and now - self._checked >= 0.5:
            self._checked = now
            try:
                text = self.log.read_text(errors="replace")
            except OSError:
                text = ""
            if _STEP_FAILING.search(text):
                self.failing_since = now
        return self.failing_since is not None and now - self.failing_since > self.grace_s


def _task_ids(spec: str) -> set[int]:
    """srun's task list (`0`, `0-3`, `0,2-3`)."""
    ids: set[int] = set()
    for part in spec.split(","):
        low, _, high = part.partition("-")
        ids.update(range(int(low), int(high or low) + 1))
    return ids


def unreported_nodes(srun_text: str, hosts: list[str], ranks_per_node: int, world: int) -> dict:
    """node -> its ranks whose end srun never reported (srun.log: `n1: task 0: Exited with exit
    code 1`), ranks placed node-major as the launcher places them: the nodes srun could not
    reach."""
    reported: set[int] = set()
    for spec in re.findall(r"tasks? ([\d,-]+):", srun_text):
        reported |= _task_ids(spec)
    nodes: dict[str, list[int]] = {}
    for rank in range(world):
        if rank not in reported and rank // ranks_per_node < len(hosts):
            nodes.setdefault(hosts[rank // ranks_per_node], []).append(rank)
    return nodes


def wait_all(
    procs,
    timeout: float | None = None,
    watch: first_contact.Watch | None = None,
    step: StepWatch | None = None,
) -> tuple[int, int] | None:
    """Wait for every rank; on the first failure stop the rest. Returns (rank, code) of a
    failure. With `timeout` (s; the launcher has none, Slurm's time limit bounds a job) the
    ranks still running then are stopped too, and the first of them is the failure. With
    `watch` (the launcher's), all are stopped when not every rank completed its first step by
    the first-contact deadline: FIRST_CONTACT_FAILED. With `step` (an srun step's), the step is
    stopped when srun reported a failed rank and could not end the step within its grace:
    STEP_STUCK."""
    pending = dict((p.pid, (r, p)) for r, p in procs)
    deadline = None if timeout is None else time.monotonic() + timeout
    while pending:
        if deadline is not None and time.monotonic() > deadline:
            rank, p = next(iter(pending.values()))
            _stop(list(pending.values()))
            return rank, p.returncode
        if watch is not None and watch.expired():
            _stop(list(pending.values()))
            return FIRST_CONTACT_FAILED
        if step is not None and step.expired():
            _stop(list(pending.values()), grace=2.0)
            return STEP_STUCK
        for pid, (rank, p) in list(pending.items()):
            code = p.poll()
            if code is None:
                continue
            del pending[pid]
            if code != 0:
                _stop([rp for rp in pending.values()])
                return rank, code
        time.sleep(0.05)
    return None


def record_slurm_job(output: Path) -> None:
    """slurm_job.json beside the cell's metrics (kept with its measurement): the job measuring
    the cell and what Slurm allocated it (partition, nodes, TRES, GRES per node and GPU indices,
    as `scontrol show job -d` reports them), and the GPUs the job's environment names."""
    if "SLURM_JOB_ID" not in os.environ:
        return
    job = {
        "slurm_job_id": os.environ["SLURM_JOB_ID"],
        "array_job_id": os.environ.get("SLURM_ARRAY_JOB_ID"),
        "array_task_id": os.environ.get("SLURM_ARRAY_TASK_ID"),
        "host": socket.gethostname(),
        "time": time.time(),
        "allocation": job_allocation(os.environ["SLURM_JOB_ID"]),
        # a packed cell (dlscale.workflow.packing): its pack, slot and the nodes of its step
        "pack": {
            "id": os.environ["DLSCALE_PACK"],
            "slot": int(os.environ.get("DLSCALE_PACK_SLOT", 0)),
            "nodes": pack_nodes(),
        }
        if os.environ.get("DLSCALE_PACK")
        else None,
        "gpus": {
            k.lower(): os.environ[k]
            for k in ("SLURM_JOB_GPUS", "SLURM_GPUS_ON_NODE", "CUDA_VISIBLE_DEVICES")
            if k in os.environ
        },
    }
    _write_beside(output, SLURM_JOB_FILE, job)


def _write_beside(output: Path, name: str, record: dict) -> None:
    """A JSON side file in the cell's folder, renamed into place whole."""
    tmp = output.parent / f".{name}.tmp"
    tmp.write_text(json.dumps(record, indent=1, sort_keys=True))
    os.replace(tmp, output.parent / name)


class Terminated(Exception):
    """SIGTERM reached the launcher: Slurm cancelled the job, its time limit passed, or its
    node is going away (Slurm sends SIGTERM, then SIGKILL after KillWait)."""


def _on_sigterm(signum, frame):
    raise Terminated()


def record_failure(
    output: Path,
    rank_dir: Path,
    cell: Cell,
    *,
    reason: str,
    rank: int | None,
    exit_code: int | None,
    suspects: list[int] | None = None,
) -> dict:
    """failure.json beside the cell's (absent) metrics file: what failed, where, the last lines,
    and the diagnosis (dlscale.run.diagnosis) of the failing ranks: the one that failed, else
    `suspects` (the ranks the others waited for), else the first unfinished ones (ranks that
    never wrote rank_end); their log tails are kept."""
    unfinished = []
    for r in range(cell.world_size):
        part = metrics.rank_file(rank_dir, r)
        if not part.exists() or f'"{RANK_END}"' not in part.read_text(errors="replace"):
            unfinished.append(r)
    known = rank is not None and rank >= 0
    failing = [rank] if known else (suspects or unfinished)[:4]
    tails = {str(r): tail_lines(rank_dir / f"rank{r}.log") for r in failing}
    # A rank is blamed only when one failed: the launcher saw it exit, or srun named it below;
    # when the whole job was terminated (rank -2) no rank is at fault.
    record = {
        "status": "failed",
        "reason": reason,
        "rank": rank if known else None,
        "exit_code": exit_code,
        "unfinished_ranks": unfinished,
        "log_tail": tails,
        "time": time.time(),
        "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
        "host": socket.gethostname(),
    }
    if (rank_dir / "srun.log").exists():
        record["srun_tail"] = tail_lines(rank_dir / "srun.log")
        # srun names the first task that failed: "srun: error: n2: task 1: Exited with exit code 3"
        first = re.search(r"task (\d+): Exited with exit code (\d+)", record["srun_tail"])
        if first and not known:
            record["rank"], record["exit_code"] = int(first.group(1)), int(first.group(2))
            failed_log = rank_dir / f"rank{first.group(1)}.log"
            record["log_tail"] = {first.group(1): tail_lines(failed_log)}
    fit = fit_records(
        rank_dir
    )  # out of memory: a result, "does not fit" (dlscale.store.does_not_fit)
    if fit:
        record.update(status=DOES_NOT_FIT, reason=fit_reason(fit), does_not_fit=fit)
    failing = [int(r) for r in record["log_tail"]]
    failing += [r for r in unfinished if r not in failing]  # the peers' view of it too
    record["diagnosis"] = diagnosis(rank_dir, cell, failing, study_dir_of(output))
    _write_beside(output, FAILURE_FILE, record)
    return record


def keep_package_lists(rank_dir: Path, environments: Path) -> None:
    """The nodes' package lists (dlscale.rank.node_probes.PACKAGES_FILE), once per study: a list is
    named by its sha256, so one already kept is the same list."""
    for path in sorted(rank_dir.glob("packages-*.txt")):
        target = environments / path.name.removeprefix("packages-")
        if target.exists():
            continue
        try:
            environments.mkdir(parents=True, exist_ok=True)
            tmp = environments / f".{target.name}.{os.getpid()}.tmp"
            shutil.copyfile(path, tmp)
            os.replace(tmp, target)
        except OSError as exc:  # the hash is in the metrics all the same
            print(f"[dlscale.run.launch] package list not kept: {exc}", file=sys.stderr)


def _run_ranks(
    cell: Cell, argv: list[str], rank_dir: Path, base: Mapping[str, str]
) -> tuple[int, int] | None:
    """Start the cell's ranks in environment `base` with the launcher that starts them here
    (dlscale.run.launchers.launcher_for) and wait for all of them; a SIGTERM stops them.
    Returns (rank, exit code) of the failure (wait_all), or None."""
    launcher = launcher_for(cell)
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    procs = []
    seconds = first_contact.deadline_s(cell)
    watch = first_contact.Watch(rank_dir, cell.world_size, seconds) if seconds else None
    step = StepWatch(rank_dir / "srun.log") if launcher.watches_step else None
    try:
        procs = launcher.start(cell, argv, rank_dir, base)
        failed = wait_all(procs, watch=watch, step=step)
    except ContainerError as exc:
        print(f"[dlscale.run.launch] {exc}", file=sys.stderr)
        (rank_dir / "srun.log").write_text(f"{exc}\n")
        failed = (-1, 1)
    except Terminated:
        _stop(procs, grace=2.0)
        failed = (-2, 143)
    finally:
        signal.signal(signal.SIGTERM, previous)
    return failed


# what a rank says when its rendezvous port was taken: torch's TCPStore (EADDRINUSE), Horovod's
# rendezvous server and TensorFlow's gRPC server (the OS's "Address already in use")
PORT_TAKEN = re.compile(r".*(?:address already in use|EADDRINUSE).*", re.IGNORECASE)


def port_taken(rank_dir: Path) -> str | None:
    """The line of a rank's log that says its rendezvous port was in use, or None. The launcher
    chose the port free (dlscale.run.launchers.ports), and another program listened on it
    before the rank did: another study's ranks on this machine, which chose it in the same
    seconds."""
    for log in sorted(rank_dir.glob("*.log")):
        found = PORT_TAKEN.search(log.read_text(errors="replace"))
        if found:
            return f"{log.name}: {found.group(0).strip()}"
    return None


def _clear_attempt(rank_dir: Path) -> None:
    """A failed start's files gone from the rank folder (logs, part files, first-contact marks);
    the cell's spec and its site record stay for the next start."""
    for path in rank_dir.iterdir():
        if path.name in (CELL_SPEC_FILE, SITE_ENV_FILE):
            continue
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink()


def stuck_step_reason(rank_dir: Path, cell: Cell) -> tuple[str, list[int]]:
    """Why a step that srun could not end failed, naming the nodes srun heard nothing from
    (unreachable: down, cut off or hung) and their ranks; those ranks are the suspects."""
    text = (rank_dir / "srun.log").read_text(errors="replace")
    try:
        hosts = pack_nodes() or allocation_nodes()
    except (OSError, KeyError, subprocess.CalledProcessError):
        hosts = []
    silent = unreported_nodes(text, hosts, cell.ranks_per_node, cell.world_size)
    failed = re.search(r"task (\d+): Exited with exit code (\d+)", text)
    first = (
        f"rank {failed.group(1)} exited with code {failed.group(2)}" if failed else "a rank failed"
    )
    where = "; ".join(f"node {n} (rank(s) {', '.join(map(str, r))})" for n, r in silent.items())
    reason = (
        f"{first}, and srun could not end the step within {STEP_END_GRACE_S:.0f} s: no word "
        f"from {where or 'some of its nodes'}, unreachable from {socket.gethostname()} (its "
        "network or its slurmd down) or hung"
    )
    return reason, [r for ranks in silent.values() for r in ranks]


def _cell_failed(
    output: Path, rank_dir: Path, cell: Cell, failed: tuple[int, int], reason: str | None = None
) -> int:
    """Record and report a failed rank (or srun step, SIGTERM, the first-contact deadline, or
    invalid metrics: `reason`); the cell's log ends with the diagnosis. Returns the cell's exit
    code."""
    rank, code = failed
    suspects = None
    if failed == FIRST_CONTACT_FAILED:
        reason, suspects = first_contact.failure_reason(
            rank_dir, cell.world_size, first_contact.deadline_s(cell)
        )
    elif failed == STEP_STUCK:
        reason, suspects = stuck_step_reason(rank_dir, cell)
    reason = reason or {
        -2: "terminated by SIGTERM (job cancelled, time limit, or node failure)",
        -1: f"srun step exited with code {code}",
    }.get(rank, f"rank {rank} exited with code {code}")
    rec = record_failure(
        output, rank_dir, cell, reason=reason, rank=rank, exit_code=code, suspects=suspects
    )
    print(
        f"[dlscale.run.launch] cell FAILED: {reason}; unfinished ranks {rec['unfinished_ranks']}"
        f"\n{render(rec['diagnosis'])}",
        file=sys.stderr,
    )
    return code or 1


def run_cell(
    cell: Cell, output: Path, *, git_commit: str | None, python: str = sys.executable
) -> int:
    launcher = cell.launcher
    rank_dir = output.parent / RANK_DIR
    shutil.rmtree(rank_dir, ignore_errors=True)
    rank_dir.mkdir(parents=True)
    (output.parent / FAILURE_FILE).unlink(missing_ok=True)
    record_slurm_job(output)
    write_cell_spec(cell, rank_dir)
    try:  # the hardware entry's modules and env (dlscale.run.site_env), once for all ranks
        site = job_environment(cell.modules, dict(cell.env))
    except SiteEnvError as exc:
        record_failure(output, rank_dir, cell, reason=str(exc), rank=None, exit_code=None)
        print(f"[dlscale.run.launch] cell FAILED: {exc}", file=sys.stderr)
        return 1
    if cell.modules or cell.env:  # what each rank records (dlscale.rank.provenance)
        (rank_dir / SITE_ENV_FILE).write_text(json.dumps(site.record()))
        print(
            f"[dlscale.run.launch] modules {list(cell.modules)} ({site.module_init}), env "
            f"{list(site.env)}",
            file=sys.stderr,
        )
    if cell.workload == "script":  # a user's training script (dlscale.run.script_cell)
        from dlscale.run.script_cell import run_script

        return run_script(
            cell,
            output,
            rank_dir,
            site.environment,
            git_commit=git_commit,
            python=python,
            launch=sys.modules[__name__],  # its ranks start and fail as every cell's
        )
    argv = train_argv(rank_dir, python)
    print(
        f"[dlscale.run.launch] {launcher}: {cell.nodes} node(s) x {cell.ranks_per_node} "
        f"rank(s): {' '.join(argv)}",
        file=sys.stderr,
        flush=True,
    )
    started = time.time()
    failed = _run_ranks(cell, argv, rank_dir, site.environment)
    taken = port_taken(rank_dir) if failed is not None else None
    if taken:  # the ranks once more, on a port drawn anew; a second failure is the cell's
        print(
            f"[dlscale.run.launch] the rendezvous port was taken before rank 0 listened "
            f"({taken}): the ranks once more, on another port",
            file=sys.stderr,
            flush=True,
        )
        _clear_attempt(rank_dir)
        started = time.time()
        failed = _run_ranks(cell, argv, rank_dir, site.environment)
    wall = time.time() - started
    for log in sorted(rank_dir.glob("*.log")):
        print(f"----- {log.name} -----\n{log.read_text(errors='replace')}", file=sys.stderr)
    if failed is not None:
        return _cell_failed(output, rank_dir, cell, failed)
    try:
        rank_records = metrics.read_rank_files(rank_dir, cell.world_size)
        records = metrics.assemble(
            cell=cell,
            git_commit=git_commit,
            slurm_job_id=os.environ.get("SLURM_JOB_ID"),
            rank_records=rank_records,
            wall_seconds=wall,
            started=started,
        )
        folder = keep_measurement(
            output,
            records,
            metrics.write_atomic,
            slurm_job_id=os.environ.get("SLURM_JOB_ID"),
            extra_files=[*sorted(rank_dir.glob("*.log")), output.parent / SLURM_JOB_FILE],
        )
    except metrics.MetricsError as exc:
        return _cell_failed(output, rank_dir, cell, (None, None), f"invalid metrics: {exc}")
    study_dir = study_dir_of(output)  # a metrics file outside a study keeps them beside it
    keep_package_lists(rank_dir, (study_dir or output.parent) / ENVIRONMENTS_DIR)
    shutil.rmtree(rank_dir, ignore_errors=True)
    summary = records[-1]["value"]
    print(
        f"[dlscale.run.launch] ok: {summary['throughput_samples_per_s']:.1f} samples/s over "
        f"{summary['world_size']} rank(s) on {summary['nodes_seen']} in {wall:.1f} s; kept in "
        f"{folder}",
        file=sys.stderr,
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="dlscale-launch", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--cell-json", required=True, help="the cell (dlscale.study.cell.Cell.to_json)"
    )
    parser.add_argument("--output", required=True, type=Path, help="the cell's metrics.jsonl")
    # not a workflow param: a new commit must not make every cell rerun
    parser.add_argument(
        "--git-commit",
        default=None,
        help="the commit of the code that runs (default: that of the project this dlscale "
        "package is part of, or 'not a git checkout' with a hash of the workflow sources)",
    )
    parser.add_argument(
        "--python", default=sys.executable, help="interpreter of the cell's framework environment"
    )
    args = parser.parse_args(argv)
    try:
        cell = Cell.from_json(args.cell_json)
    except (ValueError, TypeError) as exc:
        parser.error(f"--cell-json: {exc}")
    commit = args.git_commit or git_commit()
    return run_cell(cell, args.output, git_commit=commit, python=args.python)


if __name__ == "__main__":
    sys.exit(main())

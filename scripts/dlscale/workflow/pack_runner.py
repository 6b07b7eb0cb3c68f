"""Inside a pack's allocation (dlscale.workflow.packing): its cells side by side on disjoint
nodes, each as its own job step with exactly its nodes and ranks.

    python -m dlscale.workflow.pack_runner <study>/logs/packs/<pack>/manifest.json

The cells start in the manifest's order (the plan's: dlscale.workflow.packing.list_schedule),
each once as many healthy nodes as it needs are free and every cell before it has started, on
the first free ones; a node runs one cell at a time. With the manifest's `concurrent` false
(config pack_steps: serial) one cell runs at a time. A node that left the allocation (sbatch
--no-kill keeps the job going without a failed node) or that Slurm reports DOWN, DRAINED,
FAILING or NOT_RESPONDING is left out for the cells still to start; a cell that needs more
nodes than remain healthy fails at once, naming them. Each cell's own command (what its own
job would run: dlscale.workflow.jobstep's payload, the launcher) runs with DLSCALE_PACK_NODES
naming its nodes, so the launcher's srun step takes exactly those
(dlscale.run.launchers.srun.start_srun: --nodelist); a cell past its own time limit (the
`runtime_min` its own job would have) is stopped, SIGTERM then SIGKILL. Its state
(`<slot>.json` beside the manifest: running, done, failed or timeout, with nodes, start, end,
exit status and, once it ended, `beside`: the cells whose steps overlapped it in time) is what
the driver reports. A failing or timed-out cell never ends the pack: the runner itself exits 0
once every cell has a final state.

A cell whose state is already final is not run again (a requeued allocation resumes where it
stopped).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from pathlib import Path

from dlscale.store.pack_files import FINAL_STATES, cell_state, read_manifest, write_json
from dlscale.workflow import jobstep
from dlscale.workflow.packing import RUNNER

BAD_NODE_STATES = ("DOWN", "DRAIN", "FAIL", "NOT_RESPONDING", "POWER_DOWN", "POWERED_DOWN")
GRACE_S = 30  # after SIGTERM, before SIGKILL


def allocation_nodes() -> list[str]:
    nodelist = os.environ.get("SLURM_JOB_NODELIST") or os.environ.get("SLURM_NODELIST", "")
    if not nodelist:
        return [socket.gethostname()]
    return subprocess.run(
        ["scontrol", "show", "hostnames", nodelist], check=True, capture_output=True, text=True
    ).stdout.split()


def job_nodes(job_id: str | None) -> list[str] | None:
    """The allocation's nodes now (`scontrol show job`: a node that failed under sbatch
    --no-kill leaves the job's NodeList), or None where Slurm does not answer."""
    if not job_id:
        return None
    try:
        out = subprocess.run(
            ["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True, timeout=30
        ).stdout
        fields = dict(f.split("=", 1) for f in out.split() if "=" in f)
        nodelist = fields.get("NodeList")
        if not nodelist or nodelist == "(null)":
            return None
        return (
            subprocess.run(
                ["scontrol", "show", "hostnames", nodelist],
                capture_output=True,
                text=True,
                timeout=30,
            ).stdout.split()
            or None
        )
    except (OSError, subprocess.SubprocessError):
        return None


def unusable(nodes: list[str], job_id: str | None) -> dict[str, str]:
    """The nodes among `nodes` a cell may not use: gone from the allocation, or in a state
    Slurm reports unusable (bad_nodes)."""
    now = job_nodes(job_id)
    gone = {n: "left the allocation" for n in nodes if now is not None and n not in now}
    return {**gone, **bad_nodes([n for n in nodes if n not in gone])}


def bad_nodes(nodes: list[str]) -> dict[str, str]:
    """The nodes among `nodes` that Slurm reports unusable, with their state."""
    if not nodes:
        return {}
    try:
        out = subprocess.run(
            ["scontrol", "show", "node", "-o", ",".join(nodes)],
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    bad = {}
    for line in out.splitlines():
        fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
        state = fields.get("State", "")
        if any(s in state.upper() for s in BAD_NODE_STATES) or state.endswith("*"):
            bad[fields.get("NodeName", "?")] = state
    return bad


def run_cell(cell: dict, nodes: list[str], pack: str, log) -> tuple[str, int | None]:
    """The cell's own command on `nodes`; (state, exit status)."""
    payload = cell["payload"]
    jobstep.prepare(payload)
    env = dict(
        os.environ,
        DLSCALE_PACK=pack,
        DLSCALE_PACK_SLOT=str(cell["slot"]),
        DLSCALE_PACK_NODES=",".join(nodes),
    )
    proc = subprocess.Popen(
        ["bash", "-c", jobstep.SHELL_PREFIX + payload["shell"]],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        return ("done" if proc.wait(timeout=cell["limit_s"]) == 0 else "failed"), proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=GRACE_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        return "timeout", proc.returncode


def failed_for_want_of_nodes(record: dict, pack: str, nodes: list, left_out: dict, need: int):
    record.update(
        state="failed",
        exit=None,
        end=time.time(),
        left_out=dict(left_out),
        reason=f"pack {pack}: {len(nodes) - len(left_out)} healthy node(s) left of "
        f"{len(nodes)} ({', '.join(f'{n} {s}' for n, s in left_out.items())} left out), the "
        f"cell needs {need}",
    )


def beside(record: dict, records: list[dict]) -> list[str]:
    """The cells among `records` whose steps overlapped `record`'s (started before it ended,
    and not ended before it started)."""
    return [
        r["cell"]
        for r in records
        if r is not record
        and r.get("start") is not None
        and r["start"] < record["end"]
        and (r.get("end") is None or r["end"] > record["start"])
    ]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        raise SystemExit(f"usage: python -m {RUNNER} <manifest.json>")
    folder = Path(argv[0]).parent
    manifest = read_manifest(folder)
    if manifest is None:
        raise SystemExit(f"pack_runner: no readable manifest at {argv[0]}")
    pack, allocation = manifest["pack"], os.environ.get("SLURM_JOB_ID")
    concurrent = manifest.get("concurrent", False)  # a manifest from before: one at a time
    nodes = allocation_nodes()
    left_out: dict[str, str] = {}
    busy: set[str] = set()
    log = sys.stdout
    print(
        f"pack {pack}: Slurm job {allocation}, nodes {','.join(nodes)}, "
        f"{len(manifest['cells'])} cells {'side by side' if concurrent else 'one at a time'}",
        flush=True,
    )
    pending, records = [], []
    for cell in manifest["cells"]:
        earlier = cell_state(folder, cell["slot"])
        if earlier and earlier.get("state") in FINAL_STATES:
            records.append(earlier)
        else:
            pending.append(cell)
    running: dict = {}  # future -> (cell, record, nodes)
    with ThreadPoolExecutor(max_workers=max(1, len(nodes))) as pool:
        while pending or running:
            while pending and (concurrent or not running):
                cell = pending[0]
                idle = [n for n in nodes if n not in left_out and n not in busy]
                left_out.update(unusable(idle, allocation))
                record = {
                    "cell": cell["cell"],
                    "slot": cell["slot"],
                    "pack": pack,
                    "slurm_job_id": allocation,
                }
                if len(nodes) - len(left_out) < cell["nodes"]:
                    pending.pop(0)
                    failed_for_want_of_nodes(record, pack, nodes, left_out, cell["nodes"])
                    write_json(folder / f"{cell['slot']}.json", record)
                    print(f"pack {pack}: cell {cell['slot']} failed: {record['reason']}")
                    continue
                free = [n for n in nodes if n not in left_out and n not in busy]
                if len(free) < cell["nodes"]:
                    break  # it waits for nodes; the cells after it wait for it
                pending.pop(0)
                use = free[: cell["nodes"]]
                busy.update(use)
                record.update(
                    state="running", nodes=use, start=time.time(), left_out=dict(left_out)
                )
                records.append(record)
                write_json(folder / f"{cell['slot']}.json", record)
                print(
                    f"pack {pack}: cell {cell['slot']} {cell['cell']} on {','.join(use)}",
                    flush=True,
                )
                running[pool.submit(run_cell, cell, use, pack, log)] = (cell, record, use)
            if not running:
                continue
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in done:
                cell, record, use = running.pop(future)
                not_started = None
                try:
                    state, code = future.result()
                except OSError as exc:  # its command could not start: this cell alone fails
                    state, code, not_started = "failed", None, f"its command could not start: {exc}"
                busy.difference_update(use)
                record.update(state=state, exit=code, end=time.time())
                record["beside"] = beside(record, records)
                if state != "done":
                    record["reason"] = (
                        f"stopped at its time limit ({cell['limit_s']} s) in pack {pack}"
                        if state == "timeout"
                        else f"{not_started} in pack {pack}"
                        if not_started
                        else f"exit status {code} in pack {pack} (its log names the cause)"
                    )
                    now_bad = unusable(use, allocation)
                    if now_bad:
                        left_out.update(now_bad)
                        record["left_out"] = dict(left_out)
                        print(f"pack {pack}: left out for the cells still to start: {now_bad}")
                write_json(folder / f"{cell['slot']}.json", record)
                print(f"pack {pack}: cell {cell['slot']} {state} (exit {code})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

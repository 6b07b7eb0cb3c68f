"""`dlscale status [RESULTS_DIR ...]`: a study's progress from any shell, while its driver runs
or after it is gone: cells measured, running, pending, failed and not yet submitted, with the
Slurm job of each (a packed cell: its pack and slot, its own state in the pack and its step's
nodes: dlscale.workflow.packing), and whether the driver still runs (and where). The driver
named is the run that measures (or measured) the study's cells; a later run of none of them
(an archive, redrawn figures, `check`) is listed below it as the last run.

Reads what the driver leaves in the study's results folder (dlscale.workflow.resume:
logs/driver.json, the job journal logs/slurm_jobs.jsonl), the cells' metrics and failure
files, and asks squeue for the jobs' current states. Without an argument: every
results/<study>/ with a driver record.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

from dlscale.store.pack_files import cell_state, find_slot, pack_dir
from dlscale.study.cell import FAILURE_FILE
from dlscale.workflow.resume import LIVE_STATES, job_order, job_states
from dlscale.workflow.resume_journal import (
    DRIVER_FILE,
    driver_alive,
    read_driver_record,
    read_journal,
    study_driver,
)

# The journal events that name the job now (or last) responsible for a cell.
_JOB_EVENTS = ("submitted", "adopted", "accepted")


def cell_states(study_dir: Path) -> list[dict]:
    rec = read_driver_record(study_dir) or {}
    cells = list(rec.get("cells", []))
    last = {}
    for event in read_journal(study_dir):
        if event.get("event") in _JOB_EVENTS:
            last[event["cell"]] = event
        elif event.get("event") == "cancelled" and last.get(event["cell"], {}).get(
            "slurm_job_id"
        ) == event.get("slurm_job_id"):
            last[event["cell"]] = event
    cells += [c for c in last if c not in cells]
    live_ids = sorted(
        {e["slurm_job_id"] for e in last.values() if e["event"] != "cancelled"}, key=job_order
    )
    slurm = job_states(live_ids)
    rows = []
    for cell in cells:
        event = last.get(cell, {})
        job = event.get("slurm_job_id")
        info = slurm.get(job, {})
        state = info.get("state")
        if Path(cell).exists():
            status = "measured"
        elif state in LIVE_STATES:
            status = "running" if state in ("RUNNING", "COMPLETING", "CONFIGURING") else "pending"
        elif (Path(cell).parent / FAILURE_FILE).exists() or state not in (None, "COMPLETED"):
            status = "failed"
        elif event.get("event") == "cancelled":
            status = "cancelled"
        elif job:
            status = "ended"  # its job ended and left no metrics (yet: shared FS latency)
        else:
            status = "not submitted"
        nodes, pack = info.get("nodes", ""), ""
        slot = find_slot(study_dir, cell, job) if event.get("pack") and job else None
        if slot:  # a packed cell: its own state in its pack, not the allocation's
            pack = f"{slot[0]}#{slot[1]}"
            ran = cell_state(pack_dir(study_dir, slot[0]), slot[1]) or {}
            nodes = ",".join(ran.get("nodes") or [])
            if status in ("running", "pending"):
                status = "running" if ran.get("state") == "running" else "pending"
            if ran.get("state") in ("failed", "timeout") and status != "measured":
                status = "failed"
        rows.append(
            {
                "cell": cell,
                "status": status,
                "slurm_job_id": job or "",
                "slurm_state": state or "",
                "nodes": nodes,
                "pack": pack,
            }
        )
    return rows


def _process(rec: dict) -> str:
    alive = driver_alive(rec)
    what = {True: "running", False: "gone", None: "on another host, state unknown"}[alive]
    return f"pid {rec['pid']} on {rec['host']} ({what}), started {rec['started']}"


def describe(study_dir: Path, show_all: bool = False) -> str:
    rec = read_driver_record(study_dir)
    lines = []
    driver = study_driver(rec or {})
    if driver:  # the run that measures (or measured) the study's cells
        lines.append(
            f"{study_dir}: driver {_process(driver)}, run id {driver.get('run_id') or '-'}"
        )
    elif rec:
        lines.append(f"{study_dir}: no driver has run a cell of this study yet")
    else:
        lines.append(f"{study_dir}: no driver record ({DRIVER_FILE})")
    if rec and driver is not rec:  # a later run that ran no cell (an archive, a figure)
        lines.append(f"  last run, of no cell: {_process(rec)}: {rec.get('command', '')}")
    rows = cell_states(study_dir)
    counts = Counter(r["status"] for r in rows)
    order = ("measured", "running", "pending", "failed", "cancelled", "ended", "not submitted")
    lines.append(f"  {len(rows)} cells: " + ", ".join(f"{counts.get(k, 0)} {k}" for k in order))
    for r in rows:
        if show_all or r["status"] != "measured":
            job = f"job {r['slurm_job_id']}" if r["slurm_job_id"] else "no job"
            state = f" {r['slurm_state']}" if r["slurm_state"] else ""
            nodes = f" on {r['nodes']}" if r["nodes"] else ""
            pack = f" pack {r['pack']}" if r["pack"] else ""
            lines.append(f"  {r['status']:13} {job}{pack}{state}{nodes}  {r['cell']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="dlscale status", description=__doc__.split("\n")[0])
    parser.add_argument("results", nargs="*", help="a study's results folder (results/<study>)")
    parser.add_argument("--all", action="store_true", help="list measured cells too")
    args = parser.parse_args(argv)
    dirs = [Path(d) for d in args.results] or sorted(
        p.parent.parent for p in Path("results").glob(f"*/{DRIVER_FILE}")
    )
    if not dirs:
        print("dlscale status: no study with a driver record under results/", file=sys.stderr)
        return 1
    for d in dirs:
        if not d.is_dir():
            print(f"dlscale status: {d}: no such results folder", file=sys.stderr)
            return 2
        print(describe(d, args.all))
    return 0


if __name__ == "__main__":
    sys.exit(main())

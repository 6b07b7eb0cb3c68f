"""What a study's drivers leave behind for the next one: the job journal
(results/<study>/logs/slurm_jobs.jsonl: one event per line), the driver's record (logs/driver.json:
pid, host, process start, command, planned cells) and log (logs/driver.log), and the Snakemake
locks of a driver that is gone (`previous_driver`, at parse time). dlscale.workflow.resume adopts
an earlier driver's jobs from these; `dlscale status` reads them.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from pathlib import Path

JOURNAL_FILE = "logs/slurm_jobs.jsonl"  # in the study's results folder


DRIVER_FILE = "logs/driver.json"


DRIVER_LOG = "logs/driver.log"


LOCK_DIR = ".snakemake/locks"


# ---- records -------------------------------------------------------------------------------
def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


def journal(study_dir: str | Path, event: str, **fields) -> None:
    """Append one event to the study's job journal (one JSON object per line)."""
    path = Path(study_dir) / JOURNAL_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    rec = {"time": _now(), "event": event, **fields, "driver_pid": os.getpid()}
    with open(path, "a") as fh:
        fh.write(json.dumps(rec, sort_keys=True) + "\n")


def read_journal(study_dir: str | Path) -> list[dict]:
    path = Path(study_dir) / JOURNAL_FILE
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a line cut by a kill mid-write
    return out


def say(study_dir: str | Path, message: str) -> None:
    """To the terminal (which may be gone) and to the study's driver log."""
    line = f"dlscale: {message}"
    try:
        print(line, file=sys.stderr, flush=True)
    except OSError:
        pass
    path = Path(study_dir) / DRIVER_LOG
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as fh:
        fh.write(f"{_now()} {line}\n")


def process_start(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (/proc/<pid>/stat field 22), or None
    when no such process runs: with the pid it names one process, even after pid reuse."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])


def write_driver_record(
    study_dir: str | Path, run_id: str | None, cells: list[str], runs_cells: bool = True
) -> dict:
    """This Snakemake run's record: the study's latest run, whose locks these are
    (`previous_driver`). A run that runs none of the study's cells (an archive, a redrawn
    figure, `check`) keeps, as `study_driver`, the earlier run that ran them: the driver
    `dlscale status` names (`study_driver`)."""
    rec = {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "process_start": process_start(os.getpid()),
        "started": _now(),
        "command": " ".join(sys.argv),
        "cwd": os.getcwd(),
        "run_id": run_id,
        "cells": cells,
        "runs_cells": runs_cells,
    }
    if not runs_cells:
        earlier = study_driver(read_driver_record(study_dir) or {})
        rec["study_driver"] = earlier and {
            k: v for k, v in earlier.items() if k not in ("cells", "study_driver")
        }
    path = Path(study_dir) / DRIVER_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(rec, indent=1))
    tmp.replace(path)
    return rec


def read_driver_record(study_dir: str | Path) -> dict | None:
    try:
        return json.loads((Path(study_dir) / DRIVER_FILE).read_text())
    except (OSError, json.JSONDecodeError):
        return None


def study_driver(rec: dict) -> dict | None:
    """The record of the driver that ran the study's cells last: `rec` itself, or the one a run
    of no cell kept (None: no run has run a cell yet). Records from before `runs_cells` ran
    cells."""
    if not rec:
        return None
    return rec if rec.get("runs_cells", True) else rec.get("study_driver")


def driver_alive(rec: dict) -> bool | None:
    """True/False for a driver on this host; None when it ran on another host (unknowable)."""
    if rec.get("host") != socket.gethostname():
        return None
    start = process_start(int(rec["pid"]))
    return start is not None and start == rec.get("process_start")


# ---- stale locks ---------------------------------------------------------------------------
def study_locks(study_dir: str | Path, lock_dir: str | Path = LOCK_DIR) -> list[Path]:
    """Snakemake's lock files (N.input.lock / N.output.lock: one path per line) that name a
    file of this study: they belong to a driver of this study."""
    study = os.path.normpath(str(study_dir))
    absolute = os.path.abspath(study)
    found = []
    for lock in sorted(Path(lock_dir).glob("*.lock")) if Path(lock_dir).is_dir() else []:
        try:
            lines = lock.read_text().splitlines()
        except OSError:
            continue
        for line in lines:
            p = os.path.normpath(line.strip())
            if p == study or p.startswith(study + os.sep) or p.startswith(absolute + os.sep):
                found.append(lock)
                break
    return found


def previous_driver(study_dir: str | Path) -> list[str]:
    """Messages about the study's previous driver; removes its locks when it is gone.

    Never raises: when the previous driver still runs, Snakemake's own lock check refuses the
    run right after these lines, which say where it runs and how to follow or stop it."""
    locks = study_locks(study_dir)
    rec = read_driver_record(study_dir)
    if rec is None or rec.get("pid") == os.getpid():
        if locks:
            return [
                f"{len(locks)} Snakemake lock file(s) name this study's files and no driver "
                "record says who holds them. If no other Snakemake runs in this folder, "
                "unlock with the same command plus --unlock"
            ]
        return []
    alive = driver_alive(rec)
    where = f"pid {rec['pid']} on host {rec['host']}, started {rec['started']}"
    if alive:
        return [
            f"this study is being run by another driver ({where}: {rec['command']!r}). "
            f"Follow it with: dlscale status {study_dir}. Stop it with: kill -INT {rec['pid']} "
            f"(cancels its Slurm jobs) or kill -HUP {rec['pid']} (leaves them running; the next "
            "driver adopts them)"
        ]
    if not locks:
        return []
    if alive is None:
        return [
            f"the study's previous driver ran on another host ({where}); if it no longer runs "
            f"there (ssh {rec['host']} ps -p {rec['pid']}), unlock with the same command "
            "plus --unlock"
        ]
    for lock in locks:
        lock.unlink(missing_ok=True)
    return [
        f"the study's previous driver ({where}) is gone; removed its stale locks: "
        + ", ".join(str(lock) for lock in locks)
    ]

"""Every planned cell ends `ok`, `failed` or `missing` (results/tables/status.csv).

ok       its metrics file exists and is valid
failed   it ran and did not produce a valid metrics file: the reason, the Slurm state and exit
         code, the rank that failed and the last log lines, from the launcher's failure.json, from
         Slurm (sacct, else scontrol) for the job the executor plugin submitted, and from the
         cell's log
missing  nothing shows that it ran (not yet run, or excluded from this invocation)
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

from dlscale.store.does_not_fit import DOES_NOT_FIT
from dlscale.study.cell import (
    DEFAULT_PARALLELISM,
    DEFAULT_WORKLOAD,
    FAILURE_FILE,
    SLURM_JOB_FILE,
    SLURM_LOGS,
    format_key,
    parse_cell_path,
    path_key,
    path_ranks,
    tail_lines,
    train_log_pattern,
    train_rule,
)


def train_log(cell: dict) -> Path:
    pattern = train_log_pattern(
        cell.get("workload", DEFAULT_WORKLOAD), _parallelism(cell), path_ranks(cell) is not None
    )
    return Path(format_key(pattern, cell))


def _parallelism(cell: dict) -> str:
    return cell.get("parallelism") or DEFAULT_PARALLELISM


def _rule_logs(cell: dict) -> Path:
    rule = train_rule(cell.get("workload", DEFAULT_WORKLOAD), _parallelism(cell), path_ranks(cell))
    return Path(SLURM_LOGS) / f"rule_{format_key(rule, cell)}"


def slurm_log(cell: dict, job: dict) -> Path:
    """The executor plugin's log of one job: <array job>_<task>.log for an array task, else
    <jobid>.log in a folder named by the wildcards."""
    if job.get("array_job_id"):
        return _rule_logs(cell) / f"{job['array_job_id']}_{job['array_task_id']}.log"
    # the plugin names a job's log folder by its wildcards (PATH_KEY, in pattern order) joined
    # by _
    return (
        _rule_logs(cell)
        / "_".join(str(cell[k]) for k in path_key(_parallelism(cell), path_ranks(cell) is not None))
        / f"{job['slurm_job_id']}.log"
    )


def latest_slurm_job(cell: dict, cell_dir: Path) -> dict | None:
    """The cell's last Slurm job: as the launcher recorded it when it started, else (a job
    that never reached the launcher) the newest single-job log the plugin wrote for the cell."""
    try:
        return json.loads((cell_dir / SLURM_JOB_FILE).read_text())
    except (OSError, json.JSONDecodeError):
        pass
    folder = slurm_log(cell, {"slurm_job_id": "0"}).parent
    ids = [int(p.stem) for p in folder.glob("*.log") if p.stem.isdigit()]
    return {"slurm_job_id": str(max(ids))} if ids else None


# What slurmstepd writes into a job's output when it ends the job itself.
SLURMSTEPD_REASONS = [
    (re.compile(r"exceeded (job )?memory limit", re.I), "out of memory"),
    (re.compile(r"DUE TO TIME LIMIT", re.I), "time limit"),
    (re.compile(r"CANCELLED AT .* DUE TO NODE FAILURE", re.I), "node failure"),
    (re.compile(r"CANCELLED AT", re.I), "cancelled"),
]


def slurmstepd_reason(log: Path) -> str | None:
    """Why slurmstepd ended the job, from its own error lines in the job's output."""
    text = tail_lines(log, 200, missing="")
    for pattern, reason in SLURMSTEPD_REASONS:
        line = next((ln for ln in text.splitlines() if pattern.search(ln)), None)
        if line:
            return f"{reason} ({line.strip()})"
    return None


def slurm_state(job_id: str) -> dict:
    """State and exit code of a job: sacct (accounting) first, else scontrol (MinJobAge)."""
    try:
        out = subprocess.run(
            ["sacct", "-n", "-X", "-P", "-j", job_id, "-o", "State,ExitCode"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        line = (
            out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else ""
        )
        if line:
            state, code = line.split("|")
            return {"slurm_state": state.split()[0], "slurm_exit_code": code, "source": "sacct"}
        out = subprocess.run(
            ["scontrol", "show", "job", job_id], capture_output=True, text=True, timeout=30
        )
        state = re.search(r"\bJobState=(\S+)", out.stdout)
        code = re.search(r"\bExitCode=(\S+)", out.stdout)
        if state:
            return {
                "slurm_state": state.group(1),
                "slurm_exit_code": code.group(1) if code else None,
                "source": "scontrol",
            }
    except (OSError, subprocess.SubprocessError):
        pass
    return {"slurm_state": None, "slurm_exit_code": None, "source": "unavailable"}


def cell_status(path: str, ok: bool, invalid_reason: str | None = None) -> dict:
    """The status row of the cell whose metrics path is `path` (relative to the workdir)."""
    cell = parse_cell_path(path)
    row = {
        **cell,
        "status": "ok" if ok else "missing",
        "reason": "",
        "failed_rank": None,
        "exit_code": None,
        "slurm_job_id": None,
        "slurm_state": None,
        "slurm_exit_code": None,
        "log_tail": "",
        "metrics_path": str(path),
    }
    if ok:
        return row
    if invalid_reason:
        row.update(status="failed", reason=f"metrics file rejected: {invalid_reason}")
    failure = Path(path).parent / FAILURE_FILE
    if failure.exists():
        try:
            rec = json.loads(failure.read_text())
        except (OSError, json.JSONDecodeError):
            rec = {"reason": f"unreadable {failure}"}
        tails = rec.get("log_tail") or {}
        row.update(
            # "does_not_fit": its ranks ran out of memory, a result (dlscale.store.does_not_fit)
            status=DOES_NOT_FIT if rec.get("status") == DOES_NOT_FIT else "failed",
            reason=rec.get("reason", ""),
            failed_rank=rec.get("rank"),
            exit_code=rec.get("exit_code"),
            slurm_job_id=rec.get("slurm_job_id"),
            log_tail="\n".join(tails.values()) or rec.get("srun_tail", ""),
        )
    job = latest_slurm_job(cell, Path(path).parent)
    if job:
        row["slurm_job_id"] = job["slurm_job_id"]
        state = slurm_state(job["slurm_job_id"])
        row.update(slurm_state=state["slurm_state"], slurm_exit_code=state["slurm_exit_code"])
        stepd = slurmstepd_reason(slurm_log(cell, job))
        if state["slurm_state"] not in (None, "PENDING", "RUNNING") or stepd:
            slurm_reason = f"Slurm job {job['slurm_job_id']} ended {state['slurm_state']}" + (
                f": {stepd}" if stepd else ""
            )
            row.update(
                status=DOES_NOT_FIT if row["status"] == DOES_NOT_FIT else "failed",
                reason=(row["reason"] + "; " if row["reason"] else "") + slurm_reason,
            )
    log = train_log(cell)
    if row["status"] == "missing" and log.exists() and log.stat().st_size:
        row.update(status="failed", reason="the cell's job ran and wrote no metrics")
    if row["status"] == "failed" and not row["log_tail"]:
        row["log_tail"] = tail_lines(log, missing="")
    return row

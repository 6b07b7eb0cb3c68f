"""A study survives its driver: no orphaned or duplicate allocations, safe resume.

The driver is the `snakemake --profile profiles/slurm` process on the login node. Losing it (a
closed terminal, kill -9) used to leave its Slurm jobs running with nobody waiting, and the next
driver submitted the same cells again. Here:

- **Record.** When the executor plugin submits a cell's job, Snakemake itself writes the Slurm
  job id into the cell's incomplete marker (.snakemake/incomplete/, `persistence.started`); the
  driver also appends one line to the study's journal, results/<study>/logs/slurm_jobs.jsonl
  (cell, job id, run id, submit time, driver), and its own record, logs/driver.json (pid, host,
  start, command, planned cells).
- **Resume** (`start`, from the workflow's onstart, before the first submission). For
  each cell this run would measure, the Slurm jobs of earlier drivers are looked up (the ids
  Snakemake recorded, and live jobs whose plugin comment names the cell). A job still pending or
  running is *adopted*: renamed to this run's id (the plugin polls `squeue --name <run id>`) and
  handed to the plugin as if just submitted; its measurement is accepted only if valid and made
  by that job. A job that finished while no driver ran is accepted the same way, without a new
  job. With `--config restart=cancel` those jobs are cancelled instead and the cells measured
  again. A cell is never measured by two jobs at once: extra live jobs of one cell are cancelled.
- **Stale locks** (`previous_driver`, at parse time): the locks of a driver that is gone (its
  pid on this host is not running) are removed and named; a live driver is named with its pid,
  host and command.
- **Signals**: SIGINT cancels the run's jobs at once (then Snakemake's own stop; the ids are
  journalled),
  SIGTERM stops submitting and waits for the running jobs (Snakemake's), SIGHUP (the terminal
  closed) leaves the jobs running for the next driver to adopt, lists them in logs/driver.log
  and the journal, and exits 129.

This module is the logic; the project's executor plugin (snakemake_executor_plugin_dlscale, a
subclass of the official Slurm executor: `executor: dlscale` in profiles/slurm) calls it from
the methods it overrides (`run_jobs`, `report_job_submission`, `report_job_success`,
`cancel_jobs`) and hands it the Slurm plugin's own implementations of those (`PluginCalls`).
Under any other executor (local, or the official `slurm` one) there is no resume.

The journal, the driver's record and log and the stale-lock check are in
dlscale.workflow.resume_journal.

Pure Python, light at import (read at parse time of every Snakemake run).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from dlscale.store.pack_files import find_slot
from dlscale.study.cell import (
    CELL_RULE_PREFIXES,
    parse_cell_path,
    path_key,
    path_ranks,
    train_rule,
)
from dlscale.workflow.advice import Invocation, with_config
from dlscale.workflow.packing import packed_aux
from dlscale.workflow.resume_journal import journal, say, write_driver_record

RESTART_MODES = ("adopt", "cancel")
# Slurm states of a job that still holds, or waits for, an allocation.
LIVE_STATES = frozenset(
    (
        "PENDING",
        "CONFIGURING",
        "RUNNING",
        "COMPLETING",
        "SUSPENDED",
        "REQUEUED",
        "REQUEUE_HOLD",
        "REQUEUE_FED",
        "RESIZING",
        "SIGNALING",
        "STAGE_OUT",
        "STOPPED",
    )
)
SQUEUE_FORMAT = "%i|%T|%N|%j|%V|%k"  # id, state, nodes, name (run id), submit time, comment
TIMEOUT_S = 30
# The signal that stopped this driver, for the end-of-run message (dlscale.workflow.finalize).
STOPPED_BY: str | None = None
# The run's executor when it is the project's plugin (snakemake_executor_plugin_dlscale): it
# registers itself when Snakemake creates it (before onstart); `start` hands it the study.
_EXECUTOR = None


def register(executor) -> None:
    """Called by the dlscale executor plugin when Snakemake creates it."""
    global _EXECUTOR
    _EXECUTOR = executor


# ---- Slurm ---------------------------------------------------------------------------------
def _squeue(args: list[str]) -> dict[str, dict]:
    try:
        proc = subprocess.run(
            ["squeue", "--noheader", f"--format={SQUEUE_FORMAT}", *args],
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
        )
    except (OSError, subprocess.SubprocessError):
        return {}
    jobs = {}
    for line in proc.stdout.splitlines():
        parts = line.split("|", 5)
        if len(parts) == 6:
            jid, state, nodes, name, submit, comment = parts
            jobs[jid] = {
                "state": state,
                "nodes": nodes,
                "name": name,
                "submit_time": submit,
                "comment": comment,
            }
    return jobs


def user_jobs() -> dict[str, dict]:
    """Every job of the user the controller knows (queued, running, or ended within
    MinJobAge), in one query."""
    return _squeue(["--me", "--states=all"])


def job_states(ids: list[str]) -> dict[str, dict]:
    """The jobs among `ids` that the controller still knows (running, or ended < MinJobAge)."""
    if not ids:
        return {}
    found = {}
    for jid in ids:  # one unknown id makes squeue refuse a whole list
        found.update(_squeue(["--states=all", f"--jobs={jid}"]))
    return found


def cancel(ids: list[str], wait_s: float = 60) -> None:
    """scancel the jobs and wait until none of them holds an allocation."""
    if not ids:
        return
    subprocess.run(["scancel", *ids], capture_output=True, text=True, timeout=TIMEOUT_S)
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        live = [j for j, s in job_states(ids).items() if s["state"] in LIVE_STATES]
        if not live:
            return
        time.sleep(1)


def rename(job_id: str, run_id: str) -> bool:
    proc = subprocess.run(
        ["scontrol", "update", f"JobId={job_id}", f"JobName={run_id}"],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    return proc.returncode == 0


def job_order(job_id: str) -> tuple[int, ...]:
    """Sort key of Slurm job ids, array tasks (<array job>_<task>) included."""
    return tuple(int(x) for x in str(job_id).split("_") if x.isdigit())


def plugin_comment(cell_path: str) -> str:
    """The comment the Slurm plugin gives a cell's job (`rule_<rule>_wildcards_<values>`, the
    wildcards in the order of the cell's path, '/' replaced by '_'): the fallback that finds a
    cell's live job when no id was recorded."""
    cell = parse_cell_path(cell_path)
    rule = train_rule(cell["workload"], cell["parallelism"], path_ranks(cell))
    rule = rule.format(hardware=cell["hardware"], nodes=cell["nodes"])
    keys = path_key(cell["parallelism"], path_ranks(cell) is not None)
    values = "_".join(str(cell[k]) for k in keys).replace("/", "_")
    return f"rule_{rule}_wildcards_{values}"


def measured_by(cell_path: str, job_id: str) -> str | None:
    """None when the cell's metrics file is valid and was measured by Slurm job `job_id`; else
    why not."""
    from dlscale.store import metrics  # jsonschema: only when a cell is checked, not at parse time

    path = Path(cell_path)
    if not path.exists():
        return "no metrics file"
    try:
        records = metrics.read_metrics(path)
    except (OSError, ValueError) as exc:
        return f"invalid metrics: {exc}"
    made_by = records[0]["value"]["provenance"].get("slurm_job_id")
    if str(made_by) != str(job_id):
        return f"measured by job {made_by}, not {job_id}"
    return None


# ---- the driver ----------------------------------------------------------------------------
@dataclass
class Earlier:
    """An earlier driver's job for a cell this run would measure."""

    job_id: str
    state: str | None  # Slurm state, None when the controller no longer knows the job

    @property
    def live(self) -> bool:
        return self.state in LIVE_STATES


@dataclass(frozen=True)
class PluginCalls:
    """The official Slurm executor's own implementations of the methods the dlscale executor
    overrides (its `super()` methods): what runs when resume has nothing to add."""

    run_jobs: Callable
    report_job_submission: Callable
    report_job_success: Callable
    cancel_jobs: Callable


class Resume:
    """The resume of this run's executor (snakemake_executor_plugin_dlscale.Executor, a
    subclass of the official Slurm executor): adopts earlier jobs, journals submissions and
    cancellations, handles SIGHUP/SIGINT/SIGTERM. Created once, in the driver, at onstart,
    before the first job; the executor's overridden methods call its methods of the same name."""

    def __init__(self, workflow, executor, study_dir: str, mode: str, plugin: PluginCalls):
        if mode not in RESTART_MODES:
            raise ValueError(f"restart: {mode!r} is not one of {', '.join(RESTART_MODES)}")
        self.workflow = workflow
        self.executor = executor
        self.study_dir = study_dir
        self.mode = mode
        self._run_jobs = plugin.run_jobs
        self._report_submission = plugin.report_job_submission
        self._report_success = plugin.report_job_success
        self._cancel_jobs = plugin.cancel_jobs
        self.run_id = getattr(executor, "run_uuid", None)
        self.plans: dict[str, Earlier] = {}
        # (Slurm job id, cell path) of the adopted jobs: a pack's allocation measures several
        self.adopted: set[tuple[str, str]] = set()
        self.cancelled: set[str] = set()  # Slurm job ids this driver cancelled
        self.cells: dict[str, str] = {}  # Slurm job id -> cell path, of this run's jobs
        self.pack_cells: dict[str, list[str]] = {}  # a pack's allocation -> its cells
        # what the SIGHUP message suggests instead of adopting: this command with restart=cancel
        self.cancel_command = with_config(Invocation.current(), restart="cancel")

    # -- planning, at onstart ------------------------------------------------------------
    def cell_path(self, job) -> str | None:
        if not job.rule.name.startswith(CELL_RULE_PREFIXES):
            return None
        return str(job.output[0])

    def earlier_jobs(self, jobs) -> dict[str, list[Earlier]]:
        """Per cell path: the jobs of earlier drivers (recorded ids, and live jobs that the
        plugin's comment names), with their Slurm state."""
        recorded = {}
        for job in jobs:
            path = self.cell_path(job)
            if path:
                recorded[path] = [str(i) for i in self.workflow.persistence.external_jobids(job)]
        known = user_jobs()
        by_comment = {}
        for jid, info in known.items():
            if info["state"] in LIVE_STATES:
                by_comment.setdefault(info["comment"], []).append(jid)
        out = {}
        for path, ids in recorded.items():
            ids = set(ids) | set(by_comment.get(plugin_comment(path), []))
            found = []
            for jid in sorted(ids, key=job_order):
                info = known.get(jid, {})
                found.append(Earlier(jid, info.get("state")))
            if found:
                out[path] = found
        return out

    def plan(self) -> None:
        started = time.monotonic()
        earlier = self.earlier_jobs(self.workflow.dag.needrun_jobs())
        cancelled, adopt, accept = [], [], []
        for path, found in earlier.items():
            live = sorted(
                (e for e in found if e.live),
                key=lambda e: (e.state != "RUNNING", job_order(e.job_id)),
            )
            if self.mode == "cancel":
                cancelled += [(path, e) for e in live]
                continue
            if live:
                keep, extra = live[0], live[1:]
                cancelled += [(path, e) for e in extra]  # never two jobs measuring one cell
                self.plans[path] = keep
                adopt.append(keep.job_id)
                continue
            for e in reversed(found):  # the newest finished job whose measurement is valid
                if measured_by(path, e.job_id) is None:
                    self.plans[path] = e
                    accept.append(e.job_id)
                    break
        if cancelled:
            cancel([e.job_id for _, e in cancelled])
            for path, e in cancelled:
                journal(
                    self.study_dir,
                    "cancelled",
                    cell=path,
                    slurm_job_id=e.job_id,
                    state=e.state,
                    reason=f"restart={self.mode}"
                    if self.mode == "cancel"
                    else "a second live job of the cell",
                )
            say(
                self.study_dir,
                f"cancelled {len(cancelled)} Slurm job(s) of an earlier driver "
                f"({', '.join(e.job_id for _, e in cancelled)}); "
                + (
                    "restart=cancel: their cells are measured again"
                    if self.mode == "cancel"
                    else "each was a second job of a cell already being measured"
                ),
            )
        if adopt or accept:
            say(
                self.study_dir,
                f"resuming: adopting {len(adopt)} pending or running Slurm job(s) of an earlier "
                f"driver ({', '.join(adopt) or 'none'}); accepting {len(accept)} cell(s) "
                f"measured while no driver ran ({', '.join(accept) or 'none'}); "
                f"checked in {time.monotonic() - started:.1f} s",
            )

    # -- the executor's hooks (called by its overridden methods) ------------------------
    def handle_signals(self) -> None:
        self._sigterm = signal.getsignal(signal.SIGTERM)
        signal.signal(signal.SIGHUP, self.on_hangup)
        signal.signal(signal.SIGINT, self.on_interrupt)
        signal.signal(signal.SIGTERM, self.on_terminate)

    def run_jobs(self, jobs) -> None:
        fresh = []
        for job in jobs:
            path = self.cell_path(job)
            earlier = self.plans.pop(path, None) if path else None
            if earlier is None or not self.take_over(job, path, earlier):
                fresh.append(job)
        if fresh:
            self._run_jobs(fresh)

    def take_over(self, job, path: str, earlier: Earlier) -> bool:
        """Hand an earlier driver's job to the plugin instead of submitting a new one."""
        from snakemake_executor_plugin_slurm.utils import get_job_wildcards
        from snakemake_interface_executor_plugins.executors.base import SubmittedJobInfo
        from snakemake_interface_executor_plugins.executors.real import RealExecutor

        ex = self.executor
        now = job_states([earlier.job_id]).get(earlier.job_id, {})
        logfile = (
            Path(ex.slurm_logdir)
            / f"rule_{job.name}"
            / get_job_wildcards(job)
            / f"{earlier.job_id}.log"
        )
        aux = {"slurm_logfile": logfile}
        packed = find_slot(self.study_dir, path, earlier.job_id)
        if packed:  # a cell of an earlier driver's pack: its runner's state says how it went
            aux = packed_aux(self.study_dir, *packed, logfile)
        info = SubmittedJobInfo(job, external_jobid=earlier.job_id, aux=aux)
        live = now.get("state") in LIVE_STATES
        if live and not rename(earlier.job_id, self.run_id):
            # the plugin could not poll it: cancel it, never leave a second job for the cell
            cancel([earlier.job_id])
            journal(
                self.study_dir,
                "cancelled",
                cell=path,
                slurm_job_id=earlier.job_id,
                state=now.get("state"),
                reason="could not be adopted: scontrol update JobName refused",
            )
            return False
        if live:
            ex.run_job_pre(job)
            self.adopted.add((earlier.job_id, path))
            self.cells[earlier.job_id] = path
            journal(
                self.study_dir,
                "adopted",
                cell=path,
                slurm_job_id=earlier.job_id,
                state=now["state"],
                nodes=now.get("nodes"),
                run_id=self.run_id,
                submit_time=now.get("submit_time"),
                earlier_run_id=now.get("name"),
                **({"pack": packed[0]} if packed else {}),
            )
            self._report_submission(info)
            return True
        why = measured_by(path, earlier.job_id)
        if why is not None:
            journal(
                self.study_dir,
                "not_adopted",
                cell=path,
                slurm_job_id=earlier.job_id,
                state=now.get("state"),
                reason=why,
            )
            return False
        ex.run_job_pre(job)
        journal(
            self.study_dir,
            "accepted",
            cell=path,
            slurm_job_id=earlier.job_id,
            state=now.get("state"),
            run_id=self.run_id,
        )
        # registered (Snakemake's record) but never polled: the job has ended
        RealExecutor.report_job_submission(ex, info)
        self._report_success(info)
        return True

    def report_job_submission(self, info, **kwargs) -> None:
        path = self.cell_path(info.job)
        if path and info.external_jobid:
            self.cells[str(info.external_jobid)] = path
            if (getattr(info, "aux", None) or {}).get("pack"):
                self.pack_cells.setdefault(str(info.external_jobid), []).append(path)
            pack = (getattr(info, "aux", None) or {}).get("pack")
            journal(
                self.study_dir,
                "submitted",
                cell=path,
                slurm_job_id=info.external_jobid,
                run_id=self.run_id,
                **({"pack": pack} if pack else {}),
            )
        self._report_submission(info, **kwargs)

    def report_job_success(self, info) -> None:
        path = self.cell_path(info.job)
        if (str(info.external_jobid), path) not in self.adopted:
            path = None
        self.adopted.discard((str(info.external_jobid), path))
        why = measured_by(path, info.external_jobid) if path else None
        if why is not None:  # an adopted job's measurement is accepted only if valid and its own
            journal(
                self.study_dir, "rejected", cell=path, slurm_job_id=info.external_jobid, reason=why
            )
            self.executor.report_job_error(info, msg=f"dlscale: adopted job rejected: {why}")
            return
        self._report_success(info)

    def live_ids(self, active_jobs=()) -> list[str]:
        """This run's queued or running jobs: the plugin's active list, which is empty while
        its status thread checks it, and Slurm's own answer (every job of the run is named by
        the run id), together."""
        ids = {str(j.external_jobid) for j in active_jobs if j.external_jobid}
        if self.run_id:
            ids |= {
                jid
                for jid, info in _squeue(["--name", self.run_id]).items()
                if info["state"] in LIVE_STATES
            }
        return sorted(ids, key=job_order)

    def cancel_jobs(self, active_jobs) -> None:
        """scancel this run's jobs (SIGINT, or Snakemake stopping on an error), journalled once."""
        todo = [jid for jid in self.live_ids(active_jobs) if jid not in self.cancelled]
        for jid in todo:
            self.cancelled.add(jid)
            for cell in self.pack_cells.get(jid) or [self.cells.get(jid)]:
                journal(
                    self.study_dir,
                    "cancelled",
                    cell=cell,
                    slurm_job_id=jid,
                    reason="driver interrupted (SIGINT) or failed",
                )
        if todo:
            say(self.study_dir, f"cancelling this run's Slurm jobs: {', '.join(todo)}")
            known = [j for j in active_jobs if str(j.external_jobid) in todo]
            if known:
                self._cancel_jobs(known)
            cancel([jid for jid in todo if jid not in {str(j.external_jobid) for j in known}])

    def on_interrupt(self, signum, frame) -> None:
        """Ctrl-C: cancel the run's jobs here, wherever the driver's main thread is (Snakemake
        cancels only the plugin's active list, empty while a status check runs), then stop as
        Python does."""
        self.cancel_jobs(self.active_jobs())
        raise KeyboardInterrupt

    def active_jobs(self) -> list:
        """The plugin's active jobs. Read from a signal handler, which may have interrupted the
        main thread inside the executor's (non-reentrant) lock: never wait on it for long."""
        got = self.executor.lock.acquire(timeout=2)
        try:
            return list(self.executor.active_jobs)
        finally:
            if got:
                self.executor.lock.release()

    def active(self) -> list[tuple[str | None, str]]:
        return [(self.cells.get(jid), jid) for jid in self.live_ids(self.active_jobs())]

    def on_hangup(self, signum, frame) -> None:
        """The terminal closed: leave the jobs running for the next driver, list them, exit."""
        jobs = self.active()
        for path, jid in jobs:
            journal(self.study_dir, "left_running", cell=path, slurm_job_id=jid, run_id=self.run_id)
        say(
            self.study_dir,
            f"SIGHUP (terminal closed): the driver exits and leaves {len(jobs)} Slurm job(s) "
            f"running: {', '.join(j for _, j in jobs) or 'none'}. Run the same command again to "
            f"adopt them, or cancel them (their cells are measured again) with: "
            f"{self.cancel_command}",
        )
        os._exit(128 + signum)  # no cleanup: Snakemake's would cancel the jobs

    def on_terminate(self, signum, frame) -> None:
        global STOPPED_BY
        STOPPED_BY = "SIGTERM"
        jobs = self.active()
        say(
            self.study_dir,
            f"SIGTERM: no new cells are submitted; waiting for the {len(jobs)} Slurm job(s) "
            f"already queued or running ({', '.join(j for _, j in jobs) or 'none'}), then exiting",
        )
        if callable(self._sigterm):
            self._sigterm(signum, frame)


def executor_of(workflow):
    """The dlscale executor running this workflow's jobs, or None (another executor)."""
    return _EXECUTOR if _EXECUTOR is not None and _EXECUTOR.workflow is workflow else None


def runs_cells(workflow, cells: list[str]) -> bool:
    """Whether this run's jobs measure one of `cells` (their metrics files); True where the
    workflow has no jobs to ask about (outside a run)."""
    dag = getattr(workflow, "dag", None)
    if dag is None:
        return True
    wanted = {os.path.normpath(c) for c in cells}
    return any(os.path.normpath(f) in wanted for job in dag.needrun_jobs() for f in job.output)


def start(
    workflow,
    study_dir: str,
    mode: str,
    cells: list[str],
    pack: bool | int = False,
    pack_steps: str = "concurrent",
) -> Resume | None:
    """onstart, in the driver: record it, and start resume in the dlscale executor (with the
    study's `pack` and `pack_steps` settings: dlscale.workflow.packing)."""
    executor = executor_of(workflow)
    write_driver_record(
        study_dir, getattr(executor, "run_uuid", None), cells, runs_cells(workflow, cells)
    )
    if executor is None:
        if getattr(workflow.executor_plugin, "name", None) == "slurm":
            say(
                study_dir,
                "executor 'slurm' (the official plugin as is): no resume after a lost driver "
                "and Snakemake runs inside every cell's job; profiles/slurm uses executor "
                "'dlscale' (the same plugin with both)",
            )
        if pack:
            say(study_dir, "pack: ignored, cells share no allocation outside executor 'dlscale'")
        return None  # the local executor: no Slurm jobs to lose
    say(study_dir, executor.route)
    return executor.start_study(study_dir, mode, pack, pack_steps)

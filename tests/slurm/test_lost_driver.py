"""A study survives losing its driver (dlscale.workflow.resume), on the project's real local Slurm
cluster.

The driver (`snakemake --profile profiles/slurm`, started as a user would) is killed with -9 or
sent SIGHUP/SIGINT while its cells are queued and running, then started again. Slurm itself is
the witness: `scontrol show job` keeps every job of the last MinJobAge (600 s on the test
cluster) with the comment the executor plugin gives it, which names the cell. Every test asserts
submissions = cells (plus the cancellations it asked for), no cell measured twice, every metrics
file valid and made by the one job that measured its cell, no job of the study left in the
queue, and the report built.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from dlscale.store.metrics import read_metrics
from dlscale.workflow.resume import LIVE_STATES, plugin_comment
from dlscale.workflow.resume_journal import JOURNAL_FILE

from helpers.checkout import BIN, ROOT, copy_workflow
from helpers.slurm_jobs import controller_jobs

pytestmark = [pytest.mark.slurm, pytest.mark.workflow]

# 4 cells: nodes 1 and 2, two repetitions; 2-node cells hold the whole 2-node cluster, so when
# the first job runs the others queue behind it.
CELLS = [
    f"cpu/pytorch/cnn_small/weak/fp32/eager/n{n}/r{r}/metrics.jsonl" for n in (1, 2) for r in (1, 2)
]
# Each cell lasts seconds without computing through them, so the driver is lost while cells are
# queued and running: every rank sleeps before its framework's set-up (DLSCALE_FAULT's sleepN,
# dlscale.run.train), then takes the tiny study's 3 steps (200 steps instead cost a 2-rank cell
# about 5 CPU seconds more, which the other tests of the run wait for)
SLOW_CELLS = ";".join(f"cnn_small:{rank}:setup:sleep6" for rank in (0, 1))

DRIVERS: list[subprocess.Popen] = []


@pytest.fixture
def study(cluster, tmp_path, request):
    """A fresh 4-cell study with a name of its own (the controller remembers earlier runs' jobs
    for MinJobAge); at the end no driver of it runs and none of its jobs is left in the queue."""
    name = f"{request.node.name.split('_')[1]}{int(time.time() * 1000) % 10**8}"
    config = yaml.safe_load((ROOT / "tests" / "fixtures" / "tiny.yaml").read_text())
    config.update(study=name, repetitions=2, workloads=["throughput"])
    yield copy_workflow(tmp_path, config), name
    for proc in DRIVERS:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    DRIVERS.clear()
    live = [j for j, v in study_jobs(name).items() if v["state"] in LIVE_STATES]
    if live:
        subprocess.run(["scancel", *live], capture_output=True, timeout=30)


def start(work: Path, *args: str) -> subprocess.Popen:
    """The driver in a session of its own, as in a login shell: a signal reaches only it."""
    proc = subprocess.Popen(
        [str(BIN / "snakemake"), "--profile", "profiles/slurm", *args],
        cwd=work,
        env=dict(
            os.environ, PATH=f"{BIN}{os.pathsep}{os.environ['PATH']}", DLSCALE_FAULT=SLOW_CELLS
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    DRIVERS.append(proc)
    return proc


def study_jobs(study: str) -> dict[str, dict]:
    """Every job of the study the controller knows: id -> {cell (the plugin's comment), state}."""
    jobs = {}
    for fields in controller_jobs():
        if f"_wildcards_{study}_" in fields.get("Comment", ""):
            jobs[fields["JobId"]] = {"comment": fields["Comment"], "state": fields["JobState"]}
    return jobs


def wait_until(what, timeout: float = 120, every: float = 0.5):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = what()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"timed out waiting for {what.__doc__ or what}")


def journal(work: Path, study: str) -> list[dict]:
    path = work / "results" / study / JOURNAL_FILE
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def live_jobs(study: str) -> set[str]:
    return {j for j, v in study_jobs(study).items() if v["state"] in LIVE_STATES}


def recorded(work: Path, study: str) -> set[str]:
    """The jobs a driver recorded as submitted (the study's journal)."""
    return {e["slurm_job_id"] for e in journal(work, study) if e["event"] == "submitted"}


def running_and_queued(study: str):
    """one job of the study running and at least one more queued"""
    states = [j["state"] for j in study_jobs(study).values()]
    return "RUNNING" in states and len([s for s in states if s in LIVE_STATES]) >= 2


def all_submitted_running_and_queued(study: str):
    """every cell's job submitted, one running and at least one more queued (the driver submits
    one job at a time: a kill as soon as one runs can come before the last submission)"""
    return len(study_jobs(study)) == len(CELLS) and running_and_queued(study)


def finish(proc: subprocess.Popen, timeout: float = 600) -> str:
    out, _ = proc.communicate(timeout=timeout)
    return out


def retried(jobs: dict[str, dict]) -> list[str]:
    """The documented retries (profiles/slurm `retries: 1`): a job that ended FAILED (a rank
    crashed) and the one job after it that measured the same cell."""
    failed = [j for j, v in jobs.items() if v["state"] == "FAILED"]
    later = [
        j
        for j, v in jobs.items()
        if any(jobs[f]["comment"] == v["comment"] and int(j) > int(f) for f in failed)
    ]
    assert len(later) == len(failed), jobs  # one retry per failure, no more
    return failed + later


def assert_measured_once(work: Path, study: str, cancelled: int = 0) -> None:
    jobs = study_jobs(study)
    assert not [j for j, v in jobs.items() if v["state"] in LIVE_STATES], jobs  # 0 orphans
    completed = [v["comment"] for v in jobs.values() if v["state"] == "COMPLETED"]
    assert len(completed) == len(CELLS) == len(set(completed)), jobs  # one job per cell
    retries = len(retried(jobs)) // 2
    # submissions = cells (+ the cancellations the test asked for, + documented retries)
    assert len(jobs) == len(CELLS) + cancelled + retries, jobs
    made_by = set()
    for cell in CELLS:
        records = read_metrics(work / "results" / study / "runs" / cell)  # valid, or raises
        job = records[0]["value"]["provenance"]["slurm_job_id"]
        assert jobs[job]["state"] == "COMPLETED"
        assert jobs[job]["comment"] == plugin_comment(f"results/{study}/runs/{cell}")
        made_by.add(job)
    assert len(made_by) == len(CELLS)
    assert (work / "results" / study / "report" / "report.pdf").stat().st_size > 0


def test_kill9_then_sighup_then_restart_resubmits_nothing(study):
    """kill -9 mid-study, restart (adopts), SIGHUP the second driver, restart again: the four
    cells are measured by the four jobs the first driver submitted, and nothing else runs."""
    work, study = study
    first = start(work)
    wait_until(lambda: all_submitted_running_and_queued(study))
    first.kill()  # kill -9: nothing can be logged
    finish(first)
    assert (work / ".snakemake" / "locks").is_dir()  # the dead driver's locks are left behind
    submitted = set(study_jobs(study))
    assert len(submitted) == len(CELLS)

    t0 = time.monotonic()
    second = start(work)
    adopted = wait_until(
        lambda: [e for e in journal(work, study) if e["event"] == "adopted"], timeout=60
    )
    print(f"restart to first adoption: {time.monotonic() - t0:.1f} s")  # target <= 10 s
    assert {e["slurm_job_id"] for e in adopted} <= submitted
    second.send_signal(signal.SIGHUP)  # the terminal closes
    out = finish(second)
    assert second.returncode == 128 + signal.SIGHUP, out[-3000:]
    assert "removed its stale locks" in out and "resuming: adopting" in out, out[-3000:]
    assert "SIGHUP (terminal closed)" in out, out[-3000:]
    left = [e for e in journal(work, study) if e["event"] == "left_running"]
    assert left and {e["slurm_job_id"] for e in left} <= submitted
    log = (work / "results" / study / "logs" / "driver.log").read_text()
    assert "leaves" in log and all(e["slurm_job_id"] in log for e in left)

    third = start(work)
    out = finish(third)
    assert third.returncode == 0, out[-3000:]
    # the third driver submitted nothing but documented retries of a crashed rank's cell
    assert set(study_jobs(study)) - submitted <= set(retried(study_jobs(study)))
    assert_measured_once(work, study)
    status = subprocess.run(
        [str(BIN / "python"), "-m", "dlscale", "status", f"results/{study}"],
        cwd=work,
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=str(ROOT / "scripts")),
    )
    assert f"{len(CELLS)} cells: {len(CELLS)} measured" in status.stdout, status


def test_restart_cancel_then_sigint_leave_nothing_in_the_queue(study):
    """kill -9, restart with restart=cancel: the earlier jobs are cancelled before any new
    submission; SIGINT that driver: its jobs are cancelled and journalled, nothing of the study
    is left in the queue, and every metrics file written was made by one job of its cell.
    (Completing the study after that is the same restart as in the test above.)"""
    work, study = study
    first = start(work)
    wait_until(lambda: all_submitted_running_and_queued(study))
    first.kill()
    finish(first)
    orphans = set(study_jobs(study))

    second = start(work, "--config", "launcher=srun", "restart=cancel")
    wait_until(lambda: len(study_jobs(study)) > len(orphans), timeout=60)
    states = study_jobs(study)
    assert all(states[j]["state"] == "CANCELLED" for j in orphans), states
    wait_until(lambda: running_and_queued(study))
    second.send_signal(signal.SIGINT)
    out = finish(second)
    assert second.returncode != 0
    said = re.search(r"cancelled (\d+) Slurm job\(s\) of an earlier driver \(([\d, ]+)\)", out)
    assert said and int(said[1]) == len(CELLS), [x for x in out.splitlines() if "driver" in x]
    assert set(said[2].split(", ")) == orphans, (said[0], orphans)
    assert "cancelling this run's Slurm jobs" in out, out[-3000:]
    wait_until(
        lambda: not [j for j in study_jobs(study).values() if j["state"] in LIVE_STATES],
        timeout=60,
    )  # 0 orphans
    jobs = study_jobs(study)
    ours = set(jobs) - orphans
    assert len(ours) == len(CELLS) + len(retried(jobs)) // 2, jobs  # one submission per cell
    cancelled = {e["slurm_job_id"] for e in journal(work, study) if e["event"] == "cancelled"}
    assert orphans <= cancelled
    assert {j for j in ours if jobs[j]["state"] == "CANCELLED"} <= cancelled
    for cell in CELLS:
        path = work / "results" / study / "runs" / cell
        if path.exists():  # measured before the SIGINT: by one job of the second driver
            job = read_metrics(path)[0]["value"]["provenance"]["slurm_job_id"]
            assert job in ours and jobs[job]["state"] == "COMPLETED", (job, jobs)


def test_cells_finished_while_no_driver_ran_are_accepted_without_a_new_job(study):
    """kill -9 while cells run and queue, let every job end with no driver: nothing marked
    those cells complete (no Snakemake runs inside a cell's job, dlscale.workflow.jobstep), so the
    restart accepts each one from its job's own valid measurement and submits nothing."""
    work, study = study
    first = start(work)
    # killed once it has recorded the jobs it runs and queues (its journal): a job whose sbatch
    # returned but whose record the kill pre-empted is not the driver's to hand over; if it
    # ends before the restart its output is simply there (asserted below: measured once, no
    # new job), and a live one is found by its comment (the tests above)
    wait_until(lambda: running_and_queued(study) and live_jobs(study) <= recorded(work, study))
    first.kill()
    finish(first)
    live = live_jobs(study)
    assert len(live) >= 2
    live &= recorded(work, study)
    wait_until(
        lambda: not [j for j in study_jobs(study).values() if j["state"] in LIVE_STATES],
        timeout=300,
    )
    submitted = set(study_jobs(study))

    second = start(work)
    out = finish(second)
    assert second.returncode == 0, out[-3000:]
    accepted = [e for e in journal(work, study) if e["event"] == "accepted"]
    # every job live at the kill (and any that ended unpolled just before it), not a crashed one
    ids = {e["slurm_job_id"] for e in accepted}
    assert live - set(retried(study_jobs(study))) <= ids <= submitted, (ids, live)
    assert f"accepting {len(accepted)} cell(s)" in out, out[-3000:]
    # the restart submitted nothing but documented retries of a crashed rank's cell
    assert set(study_jobs(study)) - submitted <= set(retried(study_jobs(study)))
    assert_measured_once(work, study)

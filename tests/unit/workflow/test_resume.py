"""dlscale.workflow.resume and `dlscale status` without a cluster: stale locks, driver liveness, the
journal, the plugin's comment, and which measurement an adopted job may hand over. The adoption
itself runs against the real Slurm plugin and cluster in tests/slurm/test_lost_driver.py."""

from __future__ import annotations

import json
import os
import socket
import subprocess
from types import SimpleNamespace

import pytest

from dlscale.study.cell import PATH_KEY, Cell
from dlscale.workflow import resume, resume_journal
from dlscale.workflow import status_command as progress

from helpers.cells import cell_dict, launch_cell


def lock(tmp_path, n: int, kind: str, paths: list[str]):
    d = tmp_path / resume_journal.LOCK_DIR
    d.mkdir(parents=True, exist_ok=True)
    (d / f"{n}.{kind}.lock").write_text("\n".join(paths) + "\n")
    return d / f"{n}.{kind}.lock"


def record(tmp_path, study: str, **changes):
    rec = {
        "pid": 1,
        "host": socket.gethostname(),
        "process_start": -1,  # no process started then: a driver that is gone
        "started": "2026-11-23T10:00:00+0000",
        "command": "snakemake --profile profiles/slurm",
        "cells": [],
    }
    rec.update(changes)
    path = tmp_path / "results" / study / resume_journal.DRIVER_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(rec))


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_a_gone_drivers_locks_are_removed_and_only_its_own(workdir):
    mine = lock(workdir, 0, "output", ["results/s1/runs/a/metrics.jsonl", "results/s1/report"])
    mine_in = lock(workdir, 0, "input", ["config/config.yaml", "results/s1/tables/cells.csv"])
    other = lock(workdir, 1, "output", ["results/s10/runs/a/metrics.jsonl"])
    assert [p.resolve() for p in resume_journal.study_locks("results/s1")] == [mine_in, mine]
    record(workdir, "s1")
    (msg,) = resume_journal.previous_driver("results/s1")
    assert "pid 1 on host" in msg and "removed its stale locks" in msg
    assert not mine.exists() and not mine_in.exists() and other.exists()


def test_a_live_driver_is_named_and_its_locks_kept(workdir):
    held = lock(workdir, 0, "output", ["results/s1/runs/a/metrics.jsonl"])
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        record(
            workdir, "s1", pid=sleeper.pid, process_start=resume_journal.process_start(sleeper.pid)
        )
        (msg,) = resume_journal.previous_driver("results/s1")
    finally:
        sleeper.kill()
        sleeper.wait()
    assert f"pid {sleeper.pid}" in msg and "being run by another driver" in msg
    assert f"kill -HUP {sleeper.pid}" in msg and "dlscale status results/s1" in msg
    assert held.exists()


def test_a_reused_pid_is_not_a_live_driver(workdir):
    lock(workdir, 0, "output", ["results/s1/x"])
    # this very process, but started at another time than recorded: the driver is gone
    record(workdir, "s1", pid=os.getpid() + 0, process_start=0)
    rec = resume_journal.read_driver_record("results/s1")
    assert resume_journal.driver_alive(rec) is False


def test_a_driver_on_another_host_is_left_to_the_user(workdir):
    held = lock(workdir, 0, "output", ["results/s1/x"])
    record(workdir, "s1", host="login2")
    (msg,) = resume_journal.previous_driver("results/s1")
    assert "another host" in msg and "--unlock" in msg and "ssh login2 ps -p 1" in msg
    assert held.exists()


def test_locks_without_a_record_give_the_unlock_command(workdir):
    held = lock(workdir, 0, "output", ["results/s1/x"])
    (msg,) = resume_journal.previous_driver("results/s1")
    assert "--unlock" in msg and held.exists()
    assert resume_journal.previous_driver("results/other") == []


def test_the_journal_survives_a_line_cut_by_a_kill(workdir):
    resume_journal.journal("results/s1", "submitted", cell="c", slurm_job_id="7")
    with open(workdir / "results/s1" / resume_journal.JOURNAL_FILE, "a") as fh:
        fh.write('{"event": "subm')
    (rec,) = resume_journal.read_journal("results/s1")
    assert rec["event"] == "submitted" and rec["slurm_job_id"] == "7"
    assert rec["driver_pid"] == os.getpid() and rec["time"]


def test_the_comment_is_the_one_the_slurm_plugin_gives_the_job():
    from snakemake_executor_plugin_slurm.utils import get_job_wildcards

    cell = Cell.from_dict(cell_dict(study="s1", model="cnn_small", nodes=2, rep=3))
    # the job's wildcards, in the order of the output pattern
    job = SimpleNamespace(wildcards=[str(getattr(cell, k)) for k in PATH_KEY])
    assert resume.plugin_comment(cell.path) == (
        f"rule_train_cpu_n2_wildcards_{get_job_wildcards(job)}"
    )


def test_an_adopted_job_hands_over_only_its_own_valid_measurement(tmp_path):
    code, path = launch_cell(tmp_path, cell_dict(nodes=1))
    assert code == 0
    records = [json.loads(x) for x in path.read_text().splitlines()]
    records[0]["value"]["provenance"]["slurm_job_id"] = "4242"
    path.unlink()  # a hard link to the measurement's copy: write a file of its own
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    assert resume.measured_by(str(path), "4242") is None
    assert resume.measured_by(str(path), "4243") == "measured by job 4242, not 4243"
    path.write_text("".join(json.dumps(r) + "\n" for r in records[:-1]))  # no summary
    assert resume.measured_by(str(path), "4242").startswith("invalid metrics")
    assert resume.measured_by(str(tmp_path / "none.jsonl"), "1") == "no metrics file"


def test_status_counts_cells_from_the_record_and_the_journal(workdir, capsys):
    cells = [f"results/s1/runs/c{i}/metrics.jsonl" for i in range(4)]
    record(workdir, "s1", cells=cells)
    (workdir / cells[0]).parent.mkdir(parents=True)
    (workdir / cells[0]).write_text("{}\n")  # measured
    resume_journal.journal("results/s1", "submitted", cell=cells[0], slurm_job_id="999001")
    resume_journal.journal("results/s1", "submitted", cell=cells[1], slurm_job_id="999002")
    resume_journal.journal("results/s1", "cancelled", cell=cells[1], slurm_job_id="999002")
    (workdir / cells[2]).parent.mkdir(parents=True)
    (workdir / cells[2]).with_name("failure.json").write_text("{}")
    resume_journal.journal("results/s1", "submitted", cell=cells[2], slurm_job_id="999003")
    states = {r["cell"]: r["status"] for r in progress.cell_states(workdir / "results/s1")}
    assert states == {
        cells[0]: "measured",
        cells[1]: "cancelled",
        cells[2]: "failed",
        cells[3]: "not submitted",
    }
    assert progress.main(["results/s1"]) == 0
    out = capsys.readouterr().out
    assert "driver pid 1" in out and "(gone)" in out
    assert "4 cells: 1 measured, 0 running, 0 pending, 1 failed, 1 cancelled" in out
    assert "job 999002" in out and cells[3] in out
    assert progress.main(["results/nope"]) == 2


def test_status_names_the_driver_that_ran_the_cells_not_a_later_archive_run(workdir, capsys):
    """The driver that measured the study (pid 1, gone), then `snakemake study_archive` (this
    process): its jobs run no cell, so status still names pid 1 as the driver and lists the
    archive run below as the last run; a later run that measures a cell is the driver again."""
    cells = ["results/s1/runs/c0/metrics.jsonl"]
    record(workdir, "s1", cells=cells, run_id="measuring")
    archive = SimpleNamespace(output=["results/s1/archive/s1.tar.gz"])
    local = SimpleNamespace(executor_plugin=SimpleNamespace(name="local"))
    archive_run = SimpleNamespace(
        **vars(local), dag=SimpleNamespace(needrun_jobs=lambda: [archive])
    )
    assert resume.start(archive_run, "results/s1", "adopt", cells) is None
    assert progress.main(["results/s1"]) == 0
    head, last = capsys.readouterr().out.splitlines()[:2]
    assert "driver pid 1 on" in head and "run id measuring" in head
    assert last.startswith(f"  last run, of no cell: pid {os.getpid()} on") and "(running)" in last
    # a second run of no cell keeps the same driver
    assert resume.start(archive_run, "results/s1", "adopt", cells) is None
    assert progress.main(["results/s1"]) == 0
    assert "driver pid 1 on" in capsys.readouterr().out
    # a run that measures a cell is the study's driver
    cell = SimpleNamespace(output=[f"./{cells[0]}"])
    measure = SimpleNamespace(**vars(local), dag=SimpleNamespace(needrun_jobs=lambda: [cell]))
    assert resume.start(measure, "results/s1", "adopt", cells) is None
    assert progress.main(["results/s1"]) == 0
    out = capsys.readouterr().out
    assert f"driver pid {os.getpid()} on" in out and "last run" not in out


def test_a_driver_stopped_by_sigterm_does_not_blame_the_report_steps():
    from dlscale.workflow.finalize import status_message

    out = {"pdf": "r/partial/report.pdf", "status": "r/partial/status.csv"}
    msg = status_message(
        measured=4, failed=0, missing=0, n_planned=4, out=out, stopped_by="SIGTERM"
    )
    assert "stopped (SIGTERM) before the report steps" in msg and "Report steps failed" not in msg
    assert "Report steps failed" in status_message(
        measured=4, failed=0, missing=0, n_planned=4, out=out
    )


def test_job_ids_sort_numerically_array_tasks_included():
    ids = ["1000", "999", "1000_10", "1000_2"]
    assert sorted(ids, key=resume.job_order) == ["999", "1000", "1000_2", "1000_10"]


def test_a_convergence_cells_job_is_found_by_its_own_rule():
    path = "results/s1/convergence/cpu/pytorch/cnn_small/weak/fp32/eager/n2/r1/metrics.jsonl"
    assert resume.plugin_comment(path) == (
        "rule_converge_cpu_n2_wildcards_s1_cpu_pytorch_cnn_small_weak_fp32_eager_2_1"
    )
    job = SimpleNamespace(rule=SimpleNamespace(name="converge_cpu_n2"), output=[path])
    assert resume.Resume.cell_path(None, job) == path
    job.rule.name = "collect"
    assert resume.Resume.cell_path(None, job) is None


def fake_resume(tmp_path, calls: list):
    """A Resume wired as the dlscale executor wires it: the Slurm plugin's own methods are the
    `PluginCalls` it falls back to (here recorders)."""
    executor = SimpleNamespace(
        run_uuid="run-1",
        report_job_error=lambda info, msg=None: calls.append(("error", msg)),
        lock=SimpleNamespace(acquire=lambda timeout: True, release=lambda: None),
        active_jobs=[],
    )
    plugin = resume.PluginCalls(
        run_jobs=lambda jobs: calls.append(("run_jobs", jobs)),
        report_job_submission=lambda info, **kw: calls.append(("submitted", info.external_jobid)),
        report_job_success=lambda info: calls.append(("success", info.external_jobid)),
        cancel_jobs=lambda jobs: calls.append(("cancel", [j.external_jobid for j in jobs])),
    )
    return resume.Resume(None, executor, str(tmp_path / "results/s1"), "adopt", plugin)


def cell_job(path: str):
    return SimpleNamespace(rule=SimpleNamespace(name="train_cpu_n1"), output=[path])


def test_the_executors_hooks_journal_then_hand_over_to_the_slurm_plugin(tmp_path, monkeypatch):
    calls = []
    r = fake_resume(tmp_path, calls)
    cell = "results/s1/runs/cpu/a/metrics.jsonl"
    jobs = [cell_job(cell)]
    r.run_jobs(jobs)  # nothing to adopt: the plugin submits them
    assert calls == [("run_jobs", jobs)]
    r.report_job_submission(SimpleNamespace(job=jobs[0], external_jobid="77"))
    assert calls[-1] == ("submitted", "77") and r.cells == {"77": cell}
    (rec,) = resume_journal.read_journal(r.study_dir)
    assert rec["event"] == "submitted" and rec["slurm_job_id"] == "77" and rec["run_id"] == "run-1"
    r.report_job_success(SimpleNamespace(job=jobs[0], external_jobid="77"))
    assert calls[-1] == ("success", "77")
    # an adopted job whose measurement is not its own is reported failed, not successful
    r.adopted.add(("78", cell))  # (job, cell): a pack's allocation measures several cells
    r.report_job_success(SimpleNamespace(job=jobs[0], external_jobid="78"))
    assert calls[-1] == ("error", "dlscale: adopted job rejected: no metrics file")
    assert resume_journal.read_journal(r.study_dir)[-1]["event"] == "rejected"
    # cancel: the plugin cancels the jobs it polls, each journalled once
    monkeypatch.setattr(resume, "_squeue", lambda args: {})
    active = [SimpleNamespace(job=jobs[0], external_jobid="77")]
    r.cancel_jobs(active)
    r.cancel_jobs(active)
    assert calls[-1] == ("cancel", ["77"]) and calls.count(("cancel", ["77"])) == 1
    assert [e["event"] for e in resume_journal.read_journal(r.study_dir)][-1] == "cancelled"


def test_without_the_dlscale_executor_the_driver_is_recorded_and_the_user_told(workdir, capsys):
    workflow = SimpleNamespace(executor_plugin=SimpleNamespace(name="slurm"))
    assert resume.start(workflow, "results/s1", "adopt", ["c"]) is None
    assert resume_journal.read_driver_record("results/s1")["cells"] == ["c"]
    assert "executor 'slurm'" in capsys.readouterr().err
    local = SimpleNamespace(executor_plugin=SimpleNamespace(name="local"))
    assert resume.start(local, "results/s2", "adopt", []) is None
    assert resume_journal.read_driver_record("results/s2")["run_id"] is None

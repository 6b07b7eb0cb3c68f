"""Fault injection on the real local Slurm cluster. Each fault hits one cell ("the victim") of a
study that has already completed once; the test asserts that the victim is recorded failed with
the right reason, that no other cell's files changed (checksums), and that tables, figures and
a report are still built (results/tiny/partial/ while the study is incomplete).
"""

from __future__ import annotations

import csv
import hashlib
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from helpers.checkout import BIN, ROOT, copy_workflow, tiny_study

pytestmark = [pytest.mark.slurm, pytest.mark.workflow]

VICTIM = "results/tiny/runs/cpu/pytorch/cnn_small/weak/fp32/eager/n2/r1/metrics.jsonl"
VICTIM_WILDCARDS = "cpu_pytorch_cnn_small_weak_fp32_eager_2_1"


@pytest.fixture(scope="module")
def study(cluster, tmp_path_factory):
    return tiny_study(tmp_path_factory.mktemp("faults"), "profiles/slurm", workloads=["throughput"])


def checksums(work: Path, skip: str = VICTIM) -> dict[str, str]:
    skip_dir = (work / skip).parent
    return {
        str(p.relative_to(work)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in (work / "results" / "tiny" / "runs").rglob("*")
        if p.is_file() and skip_dir not in p.parents
    }


def start(work: Path, *args: str, fault: str | None = None) -> subprocess.Popen:
    env = dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ['PATH']}")
    if fault:
        env["DLSCALE_FAULT"] = fault
    return subprocess.Popen(
        [
            str(BIN / "snakemake"),
            VICTIM,
            "--forcerun",
            VICTIM,
            "--profile",
            "profiles/slurm",
            "--retries",
            "0",
            *args,
        ],
        cwd=work,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def victim_job(timeout: float = 120) -> str:
    """Wait until the victim's Slurm job runs and its ranks hang; return the job id."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        out = subprocess.run(
            ["squeue", "-h", "-t", "RUNNING", "-o", "%i|%k"], capture_output=True, text=True
        ).stdout
        for line in out.splitlines():
            job, comment = line.split("|", 1)
            if comment.endswith(VICTIM_WILDCARDS):
                return job
        time.sleep(1)
    raise AssertionError("the victim's job never ran")


def wait_hanging(work: Path, timeout: float = 120) -> None:
    deadline = time.time() + timeout
    logs = (work / VICTIM).parent / ".ranks"
    while time.time() < deadline:
        if any(
            "hangs before step" in p.read_text(errors="replace") for p in logs.glob("rank*.log")
        ):
            return
        time.sleep(1)
    raise AssertionError("the injected hang never started")


def finish(proc: subprocess.Popen, timeout: float = 600) -> str:
    out, _ = proc.communicate(timeout=timeout)
    assert proc.returncode != 0, out[-3000:]
    return out


def victim_status(work: Path) -> dict:
    with open(work / "results/tiny/partial/tables/status.csv") as fh:
        rows = {r["metrics_path"]: r for r in csv.DictReader(fh)}
    assert rows[VICTIM.replace("n2", "n1")]["status"] == "ok"
    return rows[VICTIM]


def assert_contained(work: Path, before: dict, out: str) -> dict:
    assert checksums(work) == before, "another cell's files changed"
    assert not (work / VICTIM).exists()
    assert (work / "results/tiny/partial/report/report.pdf").stat().st_size > 0, out[-3000:]
    return victim_status(work)


def test_rank_exits_nonzero(study):
    before = checksums(study)
    out = finish(start(study, fault="n2/r1:1:2:3"))
    row = assert_contained(study, before, out)
    assert row["status"] == "failed" and row["failed_rank"] == "1" and row["exit_code"] == "3"
    assert "exits with 3" in row["log_tail"]


def test_scancel_mid_run(study):
    before = checksums(study)
    proc = start(study, fault="n2/r1:1:2:hang")
    job = victim_job()
    wait_hanging(study)
    subprocess.run(["scancel", job], check=True)
    out = finish(proc)
    row = assert_contained(study, before, out)
    assert row["status"] == "failed" and row["slurm_state"] == "CANCELLED", row


def test_time_limit(study):
    before = checksums(study)
    proc = start(study, "--set-resources", "train_cpu_n2:runtime=1", fault="n2/r1:1:2:hang")
    out = finish(proc, timeout=400)
    row = assert_contained(study, before, out)
    assert row["status"] == "failed" and row["slurm_state"] == "TIMEOUT", row


def test_memory_limit(study):
    before = checksums(study)
    out = finish(
        start(study, "--set-resources", "train_cpu_n1:mem_mb=250", "train_cpu_n2:mem_mb=250")
    )
    row = assert_contained(study, before, out)
    assert row["status"] == "failed" and "out of memory" in row["reason"], row


def test_node_down_while_running(study):
    before = checksums(study)
    proc = start(study, fault="n2/r1:1:2:hang")
    victim_job()
    wait_hanging(study)
    try:
        subprocess.run(
            ["scontrol", "update", "NodeName=n2", "State=DOWN", "Reason=dlscale-fault-test"],
            check=True,
        )
        out = finish(proc)
    finally:
        subprocess.run(["scontrol", "update", "NodeName=n2", "State=RESUME"], check=False)
    row = assert_contained(study, before, out)
    assert row["status"] == "failed" and row["slurm_state"] in (
        "NODE_FAIL",
        "CANCELLED",
        "FAILED",
    ), row
    assert (
        "n2"
        in subprocess.run(
            ["sinfo", "-h", "-N", "-t", "idle", "-o", "%N"], capture_output=True, text=True
        ).stdout
    )


def _restart_slurmctld() -> None:
    state_dir = Path(os.environ["DLSCALE_SLURM_DIR"])  # this module's cluster (conftest.cluster)
    pid = int((state_dir / "run" / "slurmctld.pid").read_text())
    os.kill(pid, signal.SIGTERM)
    for _ in range(50):
        try:
            os.kill(pid, 0)
            time.sleep(0.2)
        except ProcessLookupError:
            break
    conf = state_dir / "etc" / "slurm.conf"
    subprocess.run(
        ["slurmctld", "-f", str(conf)], check=True, env=dict(os.environ, SLURM_CONF=str(conf))
    )


def test_slurmctld_restart_during_a_study(cluster, tmp_path):
    import yaml

    tiny = yaml.safe_load((ROOT / "tests" / "fixtures" / "tiny.yaml").read_text())
    tiny["repetitions"] = 2
    tiny["workloads"] = ["throughput"]
    work = copy_workflow(tmp_path, tiny)
    env = dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ['PATH']}")
    proc = subprocess.Popen(
        [str(BIN / "snakemake"), "--profile", "profiles/slurm"],
        cwd=work,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.time() + 120
    running = ""
    while time.time() < deadline and not running and proc.poll() is None:
        running = subprocess.run(
            ["squeue", "-h", "-t", "RUNNING", "-o", "%i"], capture_output=True, text=True
        ).stdout.split()
        running = running[0] if running else ""
        if not running:
            time.sleep(0.5)
    # the fault must happen while a cell's job runs, or this test would test nothing
    assert running, "no job of the study was running within 120 s: slurmctld not restarted"
    _restart_slurmctld()
    # the restarted controller still knows the job that ran across its restart (asked until
    # it answers: a controller just started may refuse connections for a moment)
    known, until = "", time.time() + 30
    while f"JobId={running}" not in known and time.time() < until:
        known = subprocess.run(
            ["scontrol", "show", "job", running], capture_output=True, text=True
        ).stdout
        time.sleep(0.0 if f"JobId={running}" in known else 1.0)
    out, _ = proc.communicate(timeout=900)
    assert proc.returncode == 0, out[-3000:]
    assert f"JobId={running}" in known, known or "scontrol knew no such job after the restart"
    with open(work / "results/tiny/tables/status.csv") as fh:
        assert {r["status"] for r in csv.DictReader(fh)} == {"ok"}
    assert (work / "results/tiny/report/report.pdf").stat().st_size > 0

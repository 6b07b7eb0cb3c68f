"""A packed study (config `pack`, dlscale.workflow.packing) on the project's real local Slurm
cluster, driven as a user drives it (`snakemake --profile profiles/slurm --config pack=10`).

Four cells (1 and 2 nodes, two repetitions) go into one allocation of the cluster's 2 nodes:
the 2-node cells first, then the two 1-node cells side by side, one on each node. One of them
fails (a rank exits 3: DLSCALE_FAULT); the driver is killed with -9 while the pack runs and
started again. Slurm is the witness (`scontrol show job`: every job whose working directory is
this test's): one allocation for the whole study, 0 cells measured twice, the failing cell
reported failed while the cells after it in the pack are measured, each measured cell made by
the pack's allocation on the nodes its step had, the two 1-node cells at once on different
nodes, each naming the other as run beside it, the order the dry run printed the one the steps
started in, and `dlscale status` naming each cell's pack.
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
from dlscale.workflow.resume import LIVE_STATES

from helpers.checkout import BIN, ROOT, copy_workflow
from helpers.slurm_jobs import controller_jobs

pytestmark = [pytest.mark.slurm, pytest.mark.workflow]

CELLS = [
    f"cpu/pytorch/cnn_small/weak/fp32/eager/n{n}/r{r}/metrics.jsonl" for n in (1, 2) for r in (1, 2)
]
FAILING = "n2/r1"  # slot 0 of 4 (wider cells first); DLSCALE_FAULT: rank 0 exits 3


def jobs_of(work: Path) -> dict[str, dict]:
    """Every job the controller knows that ran from this test's folder."""
    return {f["JobId"]: f for f in controller_jobs() if f.get("WorkDir") == str(work)}


# rank 0 of the failing cell exits 3 before step 1; the last cell's rank sleeps 30 s before its
# set-up, so the pack's allocation still runs when the second driver plans (it adopts a live
# allocation; a failed cell whose allocation had ended it would measure again)
FAULTS = f"{FAILING}:0:1:3;n1/r2:0:setup:sleep30"


def start(work: Path, fault: str = FAULTS) -> subprocess.Popen:
    env = dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ['PATH']}")
    env["DLSCALE_FAULT"] = fault
    return subprocess.Popen(
        [str(BIN / "snakemake"), "--profile", "profiles/slurm", "--retries", "0"],
        cwd=work,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def states(work: Path, study: str) -> list[dict]:
    return [
        json.loads(p.read_text())
        for p in (work / "results" / study / "logs" / "packs").glob("*/[0-9]*.json")
    ]


def test_a_packed_study_survives_a_failing_cell_and_a_lost_driver(cluster, tmp_path):
    study = f"pack{int(time.time() * 1000) % 10**8}"
    config = yaml.safe_load((ROOT / "tests" / "fixtures" / "tiny.yaml").read_text())
    config.update(study=study, repetitions=2, workloads=["throughput"], pack=10, preflight=False)
    work = copy_workflow(tmp_path, config)
    env = dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ['PATH']}")
    dry = subprocess.run(
        [str(BIN / "snakemake"), "--profile", "profiles/slurm", "-n"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert dry.returncode == 0, dry.stderr[-3000:]
    plan = [ln.split() for ln in dry.stderr.splitlines() if re.match(r"dlscale:\s+\d+\. \+", ln)]
    assert "4 cells side by side in one allocation of 2 node(s)" in dry.stderr, dry.stderr
    planned = [f"results/{study}/runs/{words[6]}/metrics.jsonl" for words in plan]
    assert planned == [
        f"results/{study}/runs/{c}" for c in (CELLS[2], CELLS[3], CELLS[0], CELLS[1])
    ]
    first = start(work)
    try:
        # lose the driver once the pack's first cell has started: every outcome, the failing
        # cell's included, is then the second driver's to read (a driver that saw a cell fail
        # forgets that cell's job, and a new run measures a failed cell again, as it should)
        deadline = time.monotonic() + 180
        while not states(work, study):
            assert first.poll() is None, first.communicate()[0][-3000:]
            assert time.monotonic() < deadline, "no packed cell started"
            time.sleep(0.2)
        os.killpg(first.pid, signal.SIGKILL)
        first_out = first.communicate()[0]
        assert [j for j in jobs_of(work).values() if j["JobState"] in LIVE_STATES]
        second = start(work)
        out, _ = second.communicate(timeout=300)
    finally:
        for proc in (first,):
            if proc.poll() is None:
                proc.kill()
    assert second.returncode != 0, out[-3000:]  # the failing cell fails the run, not the pack
    runs = work / "results" / study / "runs"
    jobs = jobs_of(work)
    # one allocation for the study, none resubmitted by driver 2 (each driver's output shown)
    assert len(jobs) == 1, (
        f"{jobs}\n--- driver 1:\n{first_out[-4000:]}\n--- driver 2:\n{out[-4000:]}"
    )
    [(allocation, job)] = jobs.items()
    assert job["JobState"] == "COMPLETED" and job["NumNodes"] == "2", job
    assert "adopting" in out and "Submitted batch job" not in out
    final = {s["cell"]: s for s in states(work, study)}
    assert len(final) == len(CELLS)
    for cell in CELLS:
        path = f"results/{study}/runs/{cell}"
        if FAILING in cell:
            assert final[path]["state"] == "failed" and final[path]["exit"] != 0
            assert not (runs / cell).exists()
            continue
        assert final[path]["state"] == "done", final[path]
        records = read_metrics(runs / cell)  # valid, or raises
        assert records[0]["value"]["provenance"]["slurm_job_id"] == allocation
        placed = json.loads((runs / cell).with_name("slurm_job.json").read_text())["pack"]
        n = 2 if "/n2/" in cell else 1
        assert len(placed["nodes"]) == n and placed["nodes"] == final[path]["nodes"]
    # the failing cell did not end its pack: a cell after it ran
    failing_slot = next(s["slot"] for s in final.values() if FAILING in s["cell"])
    assert any(s["slot"] > failing_slot and s["state"] == "done" for s in final.values())
    # the steps started in the order the dry run printed
    assert sorted(final, key=lambda c: final[c]["start"]) == planned
    # the 1-node cells side by side, on different nodes, each naming the other
    one, two = (final[f"results/{study}/runs/{c}"] for c in CELLS[:2])
    assert one["start"] < two["end"] and two["start"] < one["end"], (one, two)
    assert {*one["nodes"], *two["nodes"]} == {"n1", "n2"}
    assert one["beside"] == [two["cell"]] and two["beside"] == [one["cell"]]
    status = subprocess.run(
        [str(BIN / "dlscale"), "status", "--all", f"results/{study}"],
        cwd=work,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    assert status.count(f"job {allocation} pack ") == len(CELLS), status
    assert "1 failed" in status, status


def test_a_node_that_fails_mid_pack_is_left_out_for_the_remaining_cells(cluster, tmp_path):
    """Node n2 goes DOWN while a 2-node cell of the pack runs on it (a rank hangs there until
    then): that cell fails, the allocation (sbatch --no-kill) goes on without n2 (the test
    cluster's ReturnToService=2 makes n2 idle again at once, outside the job), the next
    2-node cell is reported failed for want of a healthy node, and the 1-node cells, which
    would have run side by side, run one after the other on n1."""
    study = f"packdown{int(time.time() * 1000) % 10**8}"
    config = yaml.safe_load((ROOT / "tests" / "fixtures" / "tiny.yaml").read_text())
    config.update(study=study, repetitions=2, workloads=["throughput"], pack=10, preflight=False)
    work = copy_workflow(tmp_path, config)
    proc = start(work, fault="n2/r1:1:1:hang")  # slot 0 of 4: n2/r1, n2/r2, n1/r1, n1/r2
    ranks = work / "results" / study / "runs" / CELLS[2].replace("metrics.jsonl", ".ranks")
    try:
        deadline = time.monotonic() + 180
        while not any("hangs before step" in p.read_text() for p in ranks.glob("rank*.log")):
            assert proc.poll() is None, proc.communicate()[0][-3000:]
            assert time.monotonic() < deadline, "the injected hang never started"
            time.sleep(0.5)
        subprocess.run(
            ["scontrol", "update", "NodeName=n2", "State=DOWN", "Reason=dlscale-pack-test"],
            check=True,
        )
        out, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
        subprocess.run(["scontrol", "update", "NodeName=n2", "State=RESUME"], check=False)
    assert proc.returncode != 0, out[-3000:]
    [(allocation, job)] = jobs_of(work).items()  # one allocation, it ended normally
    assert job["JobState"] == "COMPLETED", job
    final = {s["slot"]: s for s in states(work, study)}
    assert [final[i]["state"] for i in range(4)] == ["failed", "failed", "done", "done"], final
    # Slurm took n2 out of the allocation (--no-kill) or reports it down: left out either way
    assert "n2" in final[0]["left_out"], final[0]
    assert "1 healthy node(s) left of 2" in final[1]["reason"], final[1]
    assert final[2]["nodes"] == final[3]["nodes"] == ["n1"]  # one after the other on n1
    runs = work / "results" / study / "runs"
    for cell in CELLS[:2]:
        assert read_metrics(runs / cell)[0]["value"]["provenance"]["slurm_job_id"] == allocation

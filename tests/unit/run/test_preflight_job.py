"""The preflight job's side (dlscale.run.preflight_job): the first node's GPU checks against the
site file and the driver table, and the ranks' phase for real (2 local ranks, the production rank
program, gloo), as the job runs it under the local launcher. On the cluster:
tests/slurm/test_slurm_preflight.py."""

from __future__ import annotations

import json
import subprocess
import sys

from dlscale.run import preflight_job
from dlscale.store.preflight_results import read_result, summary

from helpers.cells import cell_dict

H100 = {"device": "cuda", "device_model": "NVIDIA H100 80GB HBM3", "gpus_per_node": 4}


def gpus(count=4, model="NVIDIA H100 80GB HBM3", drivers=("535.104.05",)) -> dict:
    return {"available": True, "count": count, "models": [model], "drivers": list(drivers)}


def by_name(checks) -> dict:
    return {c["name"]: c for c in checks}


def test_a_cuda_13_build_on_an_r535_driver_fails_with_the_lines_that_fit():
    checks = by_name(preflight_job.gpu_checks(H100, gpus(), "13.0", ranks_per_node=4))
    assert checks["GPU count"]["ok"] and checks["GPU model"]["ok"]
    bad = checks["CUDA build on the node's driver"]
    assert not bad["ok"]
    assert "535.104.05" in bad["detail"] and ">= 580" in bad["detail"]
    assert "nvidia_driver: 535.104.05" in bad["fix"] and "cu126" in bad["fix"]
    ok = by_name(preflight_job.gpu_checks(H100, gpus(drivers=("580.65.06",)), "13.0", 4))
    assert ok["CUDA build on the node's driver"]["ok"]
    compat = {**H100, "cuda_forward_compat": True}
    assert all(c["ok"] for c in preflight_job.gpu_checks(compat, gpus(), "13.0", 4))


def test_the_nodes_gpus_are_checked_against_the_site_file():
    few = by_name(preflight_job.gpu_checks(H100, gpus(count=2), "12.8", ranks_per_node=4))
    assert not few["GPU count"]["ok"] and "2 GPU(s) visible" in few["GPU count"]["detail"]
    other = by_name(preflight_job.gpu_checks(H100, gpus(model="NVIDIA A100-SXM4-80GB"), None, 4))
    assert not other["GPU model"]["ok"] and "A100" in other["GPU model"]["fix"]
    assert other["driver"]["ok"]  # no CUDA build: nothing to read against the table
    mixed = by_name(preflight_job.gpu_checks(H100, gpus(drivers=("535.1", "550.2")), "12.8", 4))
    assert not mixed["driver"]["ok"]
    gone = {"available": False, "reason": "nvidia-smi not found"}
    none = preflight_job.gpu_checks(H100, gone, None, 4)
    assert [c["ok"] for c in none] == [False] and "nvidia-smi not found" in none[0]["detail"]


def run_job(folder, spec) -> subprocess.CompletedProcess:
    """The preflight job as the driver's sbatch line starts it (here on the local launcher)."""
    (folder / "spec.json").write_text(json.dumps(spec))
    argv = ["job", "--spec", str(folder / "spec.json"), "--output", str(folder / "result.json")]
    return subprocess.run(
        [sys.executable, "-m", "dlscale.run.preflight_job", *argv],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_two_real_ranks_form_a_communicator_and_measure_its_bus_bandwidth(tmp_path):
    cell = cell_dict(nodes=2, ranks_per_node=1, launcher="local")
    spec = {"key": "k", "environment": "driver", "cell": cell, "entry": {"device": "cpu"}}
    out = tmp_path / "result.json"
    proc = run_job(tmp_path, spec)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = read_result(out)
    assert result["passed"] and result["ranks"] == 2
    names = [c["name"] for c in result["checks"]]
    assert names == ["framework import", "network", "communicator"]
    bw = result["allreduce"]
    assert bw["ranks"] == 2 and bw["n"] == preflight_job.ALLREDUCE_REPEATS and bw["busbw_gbps"] > 0
    assert bw["min_s"] <= bw["median_s"] <= bw["max_s"]
    assert "passed" in summary(result) and "GB/s bus bandwidth" in summary(result)


def test_a_rank_that_cannot_import_its_framework_fails_the_preflight_naming_it(tmp_path):
    cell = cell_dict(nodes=2, ranks_per_node=1, launcher="local", framework="mxnet")
    spec = {"key": "k", "environment": "driver", "cell": cell, "entry": {"device": "cpu"}}
    out = tmp_path / "result.json"
    proc = run_job(tmp_path, spec)  # the driver environment has no MXNet
    assert proc.returncode == 1
    result = read_result(out)
    assert not result["passed"] and result["failed"]["name"] == "framework import"
    assert "mxnet" in result["failed"]["detail"].lower()
    assert "FAILED at 'framework import'" in summary(result)


def test_a_node_srun_cannot_reach_fails_the_preflight_naming_it(tmp_path):
    """A node whose network is down: srun starts no task there and says so; the verdict names
    the node and what to do about it, not the environment or the modules (which is what a rank
    that never starts otherwise points at)."""
    cell = preflight_job.Cell.from_dict(cell_dict(nodes=2, ranks_per_node=1, launcher="srun"))
    (tmp_path / "preflight-rank0.json").write_text(
        json.dumps({"rank": 0, "checks": [{"name": "framework import", "ok": True, "detail": ""}]})
    )
    (tmp_path / "srun.log").write_text(
        "srun: error: Task launch for StepId=5000.0 failed on node n2: Communication connection "
        "failure\nsrun: error: Application launch failed: Communication connection failure\n"
        "srun: Job step aborted\n"
    )
    checks = by_name(preflight_job.rank_checks(cell, tmp_path, (-1, 233)))
    bad = checks["nodes reachable"]
    assert not bad["ok"] and "ranks started" not in checks
    assert bad["detail"] == (
        "srun could not start rank(s) 1 of 2: node n2: Communication connection failure"
    )
    assert "node(s) n2 cannot be reached" in bad["fix"] and "--exclude=n2" in bad["fix"]

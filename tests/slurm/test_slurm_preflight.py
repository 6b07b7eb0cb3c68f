"""The preflight on the project's real local Slurm cluster: a study of two hardware
entries, run with `snakemake --profile profiles/slurm` as a user runs it.

- `gpu`: the cluster's fake GPUs (GRES gpu:fake:2), a `nvidia-smi` on PATH that reports two H100
  boards on an R535 driver, and a stand-in of the CUDA 13 PyTorch environment (.venvs/pytorch-cuda:
  the driver environment's packages, with torch/version.py saying CUDA 13.0). The entry states
  no driver, so the login-side check lets it through; the preflight job finds the driver on the
  node and fails. What slurmctld's own log saw: that one preflight job ran, and none of the
  entry's cells was ever allocated.
- `cpu`: a healthy entry. Its preflight passes (2 ranks on 2 nodes, gloo, the all-reduce's bus
  bandwidth recorded), its cells run, and a rerun of one cell within the preflight's maximum age
  submits no preflight.

And a node that cannot be reached (separate hosts: n2's interface down): the preflight fails
naming n2, and the job held behind it is cancelled at once and never runs.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import pytest
import yaml

from dlscale.store.preflight_results import read_result
from dlscale.workflow.preflight import cancel_held

from helpers.cells import cell_dict
from helpers.checkout import BIN, ROOT, copy_workflow
from helpers.cluster_layout import cut_off, layout

pytestmark = [pytest.mark.slurm, pytest.mark.workflow]

FAKE_NVIDIA_SMI = """#!/bin/sh
# two H100 boards on an R535 driver (what nvidia-smi --query-gpu prints, csv,noheader,nounits)
case "$*" in
  *--query-gpu*)
    for i in 0 1; do
      echo "$i, NVIDIA H100 80GB HBM3, GPU-$i, 81559, 535.104.05, 00000000:1$i:00.0"
    done
    ;;
  *) echo "nvidia-smi (test stand-in): $*" >&2; exit 1 ;;
esac
"""
GPU_ENTRY = {
    "description": "the local cluster's fake GPUs",
    "device": "cuda",
    "device_model": "NVIDIA H100 80GB HBM3",
    "compute_capability": 9.0,
    "partition": None,
    "gpus_per_node": 2,
    "gpu_request": "gres",
    "gpu_type": "fake",
    "cpus_per_rank": 1,
    "mem_mb_per_rank": 400,
    "exclusive": False,
    "max_nodes": 2,
    "runtime_min": 10,
}


def stand_in_cuda_environment(folder: Path) -> None:
    """A venv whose interpreter imports the driver environment's packages (dlscale, CPU torch)
    and whose files say torch was built with CUDA 13.0: what the login side and the preflight
    read (dlscale.registry.cuda_probes)."""
    base = Path(os.path.realpath(sys.executable))
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    sp = folder / "lib" / version / "site-packages"
    (folder / "bin").mkdir(parents=True)
    (sp / "torch").mkdir(parents=True)
    (folder / "bin" / "python").symlink_to(base)
    (folder / "pyvenv.cfg").write_text(
        f"home = {base.parent}\ninclude-system-site-packages = false\n"
    )
    purelib = sysconfig.get_paths()["purelib"]
    (sp / "driver-environment.pth").write_text(f"import site; site.addsitedir({purelib!r})\n")
    (sp / "torch" / "version.py").write_text("__version__ = '2.13.0+cu130'\ncuda = '13.0'\n")


def allocated_jobs(log: Path, since: int) -> set[str]:
    """Job ids slurmctld allocated nodes to, from its own log after byte `since`."""
    with open(log, "rb") as fh:
        fh.seek(since)
        text = fh.read().decode(errors="replace")
    # "sched: Allocate JobId=N ..." or "sched/backfill: _start_job: Started JobId=N ..."
    return set(re.findall(r"(?:Allocate|Started) JobId=(\d+)", text))


def preflight_jobs(driver_log: str) -> dict[str, str]:
    """hardware -> the preflight's Slurm job id, from the driver's own lines."""
    return dict(re.findall(r"preflight of (\w+) / [\w-]+: Slurm job (\d+)", driver_log))


def test_a_broken_entry_costs_one_preflight_job_and_no_cell_runs(cluster, tmp_path):
    tiny = yaml.safe_load((ROOT / "tests" / "fixtures" / "tiny.yaml").read_text())
    tiny["workloads"] = ["throughput"]
    tiny["axes"]["hardware"] = ["cpu", "gpu"]
    tiny["axes"]["ranks_per_node"] = [1]  # one GPU per node: the cluster's nodes have 1 CPU
    (tmp_path / "work").mkdir()
    work = copy_workflow(tmp_path / "work", tiny)
    site = work / "config" / "hardware.yaml"
    site.write_text(yaml.safe_dump({**yaml.safe_load(site.read_text()), "gpu": GPU_ENTRY}))
    venvs = work / ".venvs"
    if venvs.is_symlink():
        venvs.unlink()
    venvs.mkdir(exist_ok=True)
    for env in (ROOT / ".venvs").iterdir() if (ROOT / ".venvs").is_dir() else ():
        (venvs / env.name).symlink_to(env)
    stand_in_cuda_environment(venvs / "pytorch-cuda")
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "nvidia-smi").write_text(FAKE_NVIDIA_SMI)
    (fake / "nvidia-smi").chmod(0o755)
    env = dict(os.environ, PATH=f"{fake}{os.pathsep}{BIN}{os.pathsep}{os.environ['PATH']}")
    ctld_log = Path(os.environ["DLSCALE_SLURM_DIR"]) / "log" / "slurmctld.log"
    since = ctld_log.stat().st_size

    def run(*args):
        return subprocess.run(
            [str(BIN / "snakemake"), "--profile", "profiles/slurm", "--keep-going", *args],
            cwd=work,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )

    proc = run()
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-3000:]  # the gpu cells failed, on purpose
    driver_log = (work / "results/tiny/logs/driver.log").read_text()
    jobs = preflight_jobs(driver_log)
    assert set(jobs) == {"cpu", "gpu"}, driver_log
    allocated = allocated_jobs(ctld_log, since)
    journal = [
        json.loads(line)
        for line in (work / "results/tiny/logs/slurm_jobs.jsonl").read_text().splitlines()
    ]
    submitted = [r for r in journal if r["event"] == "submitted"]
    gpu_cells = {str(r["slurm_job_id"]) for r in submitted if "/runs/gpu/" in r["cell"]}
    cpu_cells = {str(r["slurm_job_id"]) for r in submitted if "/runs/cpu/" in r["cell"]}
    # slurmctld's own count: the broken entry cost its one preflight job and no cell job
    assert jobs["gpu"] in allocated
    assert not gpu_cells & allocated, (gpu_cells, allocated)
    assert jobs["cpu"] in allocated and len(cpu_cells) == 2 and cpu_cells <= allocated
    # what failed, where, and the fix: in the result, the driver's log and the cells' errors
    found = map(read_result, work.glob("results/tiny/preflight/*.json"))
    results = {r["hardware"]: r for r in found if r}
    bad = results["gpu"]
    assert bad["passed"] is False and bad["failed"]["name"] == "CUDA build on the node's driver"
    assert "535.104.05" in bad["failed"]["detail"] and "13.0" in bad["failed"]["detail"]
    assert "nvidia_driver: 535.104.05" in bad["failed"]["fix"]
    assert driver_log.count("the preflight of hardware entry 'gpu'") == 1
    assert "hardware entry 'gpu'" in out and "Fix:" in out
    # the healthy entry: passed across 2 nodes, its bus bandwidth recorded, its cells measured
    good = results["cpu"]
    assert good["passed"] and good["nodes"] == 2 and good["ranks"] == 2
    assert good["allreduce"]["busbw_gbps"] > 0 and good["allreduce"]["n"] == 5
    cell = "results/tiny/runs/cpu/pytorch/cnn_small/weak/fp32/eager/n1/r1/metrics.jsonl"
    assert (work / cell).exists()
    # cached: re-measuring one cpu cell submits no preflight, only the cell, with no hold
    since = ctld_log.stat().st_size
    again = run(cell, "--forcerun", cell)  # the target first: --forcerun takes several
    assert again.returncode == 0, (again.stdout + again.stderr)[-3000:]
    driver_log = (work / "results/tiny/logs/driver.log").read_text()
    assert "preflight of cpu / driver: passed" in driver_log and "not repeated" in driver_log
    assert len(allocated_jobs(ctld_log, since)) == 1


def test_a_node_that_cannot_be_reached_fails_its_preflight_naming_it(cluster, tmp_path):
    """The preflight job as the driver submits it, on both nodes, with a cell job held behind it
    as the driver holds a cell (afterok, kill-on-invalid-dep), while n2 is cut off: the result
    fails at `nodes reachable`, naming n2; the driver's cancel_held, given that result, cancels
    the held job at once (Slurm would only once the preflight has ended on n2 too, which it
    cannot reach), and the held job never runs. The whole study, timed:
    benchmarks/network_faults.py (down-before)."""
    nodes = layout()
    if not nodes.separate_hosts:  # under CI the cluster is always separate hosts
        pytest.skip("the single-address fallback: the nodes cannot lose each other")
    spec = tmp_path / "spec.json"
    cell = cell_dict(nodes=2, ranks_per_node=1, launcher="srun")
    spec.write_text(json.dumps({"key": "k", "environment": "driver", "cell": cell,
                                "entry": {"device": "cpu"}}))  # fmt: skip
    result = tmp_path / "result.json"
    job = [sys.executable, "-m", "dlscale.run.preflight_job", "job", "--spec", str(spec)]
    job += ["--output", str(result)]

    def sbatch(*args: str) -> str:
        out = subprocess.run(
            ["sbatch", "--parsable", f"--chdir={tmp_path}", "-o", "/dev/null", *args],
            capture_output=True, text=True, timeout=60, check=True,
        )  # fmt: skip
        return out.stdout.strip().split(";")[0]

    with cut_off(nodes.nodes["n2"]):
        preflight = sbatch("-N2", "--ntasks-per-node=1", "--wrap", subprocess.list2cmdline(job))
        held = sbatch(f"--dependency=afterok:{preflight}", "--kill-on-invalid-dep=yes",
                      "-N2", "--wrap", "true")  # fmt: skip
        for _ in range(600):
            if read_result(result):
                break
            time.sleep(0.1)
        got = read_result(result)
        assert got and not got["passed"] and got["failed"]["name"] == "nodes reachable", got
        assert "node n2" in got["failed"]["detail"] and "--exclude=n2" in got["failed"]["fix"]
        assert cancel_held(preflight) == [held]
        state = subprocess.run(
            ["squeue", "-h", "-t", "all", "-j", held, "-o", "%T|%r"],
            capture_output=True, text=True, timeout=60,
        ).stdout.strip()  # fmt: skip
        assert state.startswith("CANCELLED"), state
    assert held not in allocated_jobs(Path(os.environ["DLSCALE_SLURM_DIR"]) / "log" /
                                      "slurmctld.log", 0)  # fmt: skip

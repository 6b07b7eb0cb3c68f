"""Ranks bound next to their GPU, on a local cluster with a fake GPU/NUMA topology
(scripts/slurm/cluster-up.sh --task-affinity: TaskPlugin=task/affinity; 2 nodes of 2 CPUs, each
CPU a NUMA node of its own, seen by Slurm and by the ranks; 4 fake GPUs per node, gres.conf
`Cores=`: GPUs 0 and 1 next to CPU 0 / NUMA node 0, GPUs 2 and 3 next to CPU 1 / NUMA node 1).

The production launcher (dlscale.run.launchers.srun.start_srun: the options of gpu_binding,
inherited binding variables removed) starts 2 nodes x 2 ranks of the production check (`python -m
dlscale.rank.devices --binding`: what each rank got, pick_gpu, binding_check), under `closest`,
both kinds of map, and `task` with a SLURM_CPU_BIND/SLURM_GPU_BIND inherited from the shell;
and the preflight job fails its entry, naming gpu_binding, the rank, what it got and what it
should have got, where a site's cli_filter (an `srun` in front of Slurm's that rewrites
--cpu-bind) unbinds the CPUs. The fake GPUs cannot compute: what is tested is what each rank
sees, not a training step. The cluster is stopped when the module ends."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dlscale.registry.gpu_bindings import canonical
from dlscale.store.metrics_summary import shared_gpus
from dlscale.store.preflight_results import read_result
from dlscale.study.cell import Cell

from helpers.cells import cell_dict

pytestmark = [pytest.mark.slurm]

# Inside the allocation, as the launcher runs in a cell's job: the ranks' step started and
# waited for with the production functions; each rank checks its binding and prints its record.
START = """
import sys
from pathlib import Path
from dlscale.study.cell import Cell
from dlscale.run.launch import wait_all
from dlscale.run.launchers.srun import start_srun
cell, rank_dir = Cell.read(sys.argv[1]), Path(sys.argv[2])
argv = [sys.executable, "-m", "dlscale.rank.devices", "--binding", cell.gpu_binding]
failed = wait_all(start_srun(cell, argv, rank_dir))
sys.exit(0 if failed is None else 1)
"""
# what a cell of the entry asks (dlscale.study.resources): its ranks per node, one GPU each,
# here 2 of each node's 4; whole nodes (exclusive) where the binding needs them
JOB = ["salloc", "--nodes=2", "--ntasks=4", "--ntasks-per-node=2", "--cpus-per-task=1"]
JOB += ["--mem=1000", "--gres=gpu:2"]

# A site's cli_filter in miniature: whatever --cpu-bind the command line asks, the ranks are not
# bound (a rewrite srun's own options cannot undo, and the launcher cannot see)
UNBINDING_SRUN = """#!/bin/sh
for a; do
  shift
  case $a in --cpu-bind=*) set -- "$@" --cpu-bind=none ;; *) set -- "$@" "$a" ;; esac
done
exec {srun} "$@"
"""
FAKE_NVIDIA_SMI = """#!/bin/sh
case "$*" in
  *--query-gpu*)
    for i in 0 1 2 3; do
      echo "$i, NVIDIA H100 80GB HBM3, GPU-$i, 81559, 550.54.15, 00000000:1$i:00.0"
    done ;;
  *) echo "nvidia-smi (test stand-in): $*" >&2; exit 1 ;;
esac
"""


@pytest.fixture(scope="module")
def topology(cluster):
    """The "slurm-bind" cluster (tests/conftest.py): its fake GPU/NUMA topology. The packed
    study's module runs on it too, so it stays up until the run's session ends."""
    return cluster


def cuda_cell(binding) -> Cell:
    """A 2-node x 2-rank cuda cell (tests/helpers/cells.py) with `binding`."""
    return Cell.from_dict(
        cell_dict(
            hardware="gpu",
            device="cuda",
            ranks_per_node=2,
            global_batch=16,
            launcher="srun",
            gpu_binding=canonical(binding),
        )
    )


def run_ranks(folder: Path, binding, exclusive: bool, env=None, in_step=False) -> list[dict]:
    """`in_step`: the launcher inside an `srun -n1` step of the job, as the executor plugin
    runs it (start_srun's --overlap path)."""
    cell = cuda_cell(binding)
    spec = folder / "cell.json"
    spec.write_text(cell.to_json())
    job = JOB + (["--exclusive"] if exclusive else [])
    step = ["srun", "--ntasks=1", "--nodes=1"] if in_step else []
    proc = subprocess.run(
        [*job, *step, sys.executable, "-c", START, str(spec), str(folder)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    srun_log = (folder / "srun.log").read_text() if (folder / "srun.log").exists() else ""
    assert proc.returncode == 0, proc.stderr[-2000:] + srun_log[-2000:]
    ranks = [
        json.loads((folder / f"rank{r}.log").read_text().splitlines()[-1])
        for r in range(cell.world_size)
    ]
    assert [r["rank"] for r in ranks] == [0, 1, 2, 3]
    assert len({r["node"] for r in ranks}) == 2
    assert all(r["binding"]["ok"] for r in ranks), [r["binding"]["detail"] for r in ranks]
    assert shared_gpus(ranks) == []  # every rank on a board of its own
    return ranks


def seen(ranks: list[dict]) -> list[tuple]:
    """Per local rank (the same on both nodes): its CPUs, its CUDA_VISIBLE_DEVICES, the board
    it takes."""
    per_local = {
        (r["local_rank"], r["cpu_affinity"], r["binding"]["visible_devices"], r["gpu"]["key"])
        for r in ranks
    }
    assert len(per_local) == 2, per_local  # both nodes alike
    return sorted(per_local)


@pytest.mark.parametrize(
    "exclusive, expected",
    [
        # the whole node: each rank on its NUMA node sees that node's 2 GPUs and takes one
        (True, [(0, "0", "0,1", "gres:0"), (1, "1", "2,3", "gres:3")]),
        # 2 of 4 GPUs: Slurm gives the job one next to each of its cores, each rank that one
        (False, [(0, "0", "0", "gres:0"), (1, "1", "2", "gres:2")]),
    ],
)
def test_closest_binds_each_rank_to_a_numa_node_and_the_gpus_next_to_it(
    topology, tmp_path, exclusive, expected
):
    ranks = run_ranks(tmp_path, "closest", exclusive)
    assert seen(ranks) == expected
    assert all(r["binding"]["domains"] == [r["local_rank"]] for r in ranks)


@pytest.mark.parametrize(
    "binding, expected",
    [
        (
            {"gpus": [3, 2, 1, 0], "numa": [1, 0, 1, 0]},
            [(0, "1", "3", "gres:3"), (1, "0", "2", "gres:2")],
        ),
        (
            {"gpus": [1, 3, 0, 2], "cpus": ["1", "0", "1", "0"]},
            [(0, "1", "1", "gres:1"), (1, "0", "3", "gres:3")],
        ),
    ],
)
def test_a_map_binds_each_local_rank_where_the_site_says(topology, tmp_path, binding, expected):
    # the job asks 2 GPUs per node and whole nodes: the map's step takes all 4 of them
    assert seen(run_ranks(tmp_path, binding, exclusive=True)) == expected


@pytest.mark.parametrize(
    "binding, expected",
    [
        ("closest", [(0, "0", "0,1", "gres:0"), (1, "1", "2,3", "gres:3")]),
        (
            {"gpus": [3, 2, 1, 0], "numa": [1, 0, 1, 0]},
            [(0, "1", "3", "gres:3"), (1, "0", "2", "gres:2")],
        ),
    ],
)
def test_the_binding_holds_inside_the_executor_plugins_job_step(
    topology, tmp_path, binding, expected
):
    ranks = run_ranks(tmp_path, binding, exclusive=True, in_step=True)
    assert seen(ranks) == expected


def test_inherited_binding_variables_do_not_bind_the_ranks(topology, tmp_path):
    """A SLURM_CPU_BIND and SLURM_GPU_BIND from the shell (srun reads both, and would put every
    rank on CPU 1 and GPU 3): the ranks of a `task` cell get what the launcher states, one GPU
    each, in order, and the partition's own CPU binding (task/affinity binds each to a core)."""
    env = dict(os.environ, SLURM_CPU_BIND="map_cpu:1,1", SLURM_GPU_BIND="map_gpu:3,3")
    ranks = run_ranks(tmp_path, "task", exclusive=False, env=env)
    assert seen(ranks) == [(0, "0", "0", "gres:0"), (1, "1", "2", "gres:2")]
    first = (tmp_path / "srun.log").read_text().splitlines()[0]
    assert "SLURM_CPU_BIND=map_cpu:1,1" in first and "SLURM_GPU_BIND=map_gpu:3,3" in first


def test_the_preflight_fails_the_entry_where_the_site_binds_otherwise(topology, tmp_path):
    cell = cuda_cell("closest")
    spec = tmp_path / "spec.json"
    entry = {"device": "cuda", "gpus_per_node": 4, "gpu_binding": "closest"}
    spec.write_text(
        json.dumps({"cell": cell.as_dict(), "entry": entry, "key": "k", "environment": "e"})
    )
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    real_srun = subprocess.run(["which", "srun"], capture_output=True, text=True).stdout.strip()
    for name, text in (
        ("srun", UNBINDING_SRUN.format(srun=real_srun)),
        ("nvidia-smi", FAKE_NVIDIA_SMI),
    ):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    out = tmp_path / "result.json"
    job = [sys.executable, "-m", "dlscale.run.preflight_job", "job", "--spec", str(spec)]
    proc = subprocess.run(
        [*JOB, *job, "--output", str(out)], capture_output=True, text=True, timeout=120, env=env
    )
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    result = read_result(out)
    assert not result["passed"] and result["failed"]["name"] == "binding", result["checks"]
    detail = result["failed"]["detail"]
    for part in (
        "gpu_binding closest: rank ",
        "got CPUs 0-1 (NUMA nodes 0, 1)",
        "it should be bound to the CPUs of one NUMA node",
    ):
        assert part in detail, detail
    assert "--cpu-bind=ldoms --gpu-bind=closest" in result["failed"]["fix"]
    # the node's checks passed before the ranks ran (the fake nvidia-smi's 4 GPUs)
    assert [c["name"] for c in result["checks"]][:2] == ["GPU count", "driver"]

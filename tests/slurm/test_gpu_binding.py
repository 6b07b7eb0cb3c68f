"""Which GPU does each rank take? On the local cluster's fake GPUs (GRES gpu:fake:2 per node, no
hardware: Slurm allocates and binds them as it would real boards), the production launcher
(dlscale.run.launchers.srun.start_srun) starts a 2-node x 2-rank cuda cell whose ranks run the
production choice (python -m dlscale.rank.devices: dlscale.rank.rank_context.discover,
dlscale.rank.devices.pick_gpu and gpu_identity), under both bindings the hardware file offers; and
a step that binds one GPU to two ranks is caught (dlscale.store.metrics_summary.shared_gpus), as
the report's note states it."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from dlscale.store.metrics_summary import shared_gpus
from dlscale.study.cell import Cell

from helpers.cells import small_cell

pytestmark = [pytest.mark.slurm]

# Run inside the allocation, as the launcher runs in a cell's job: start the ranks' step with
# the production function and wait for it with the production function.
START = """
import sys
from pathlib import Path
from dlscale.study.cell import Cell
from dlscale.run.launch import wait_all
from dlscale.run.launchers.srun import start_srun
cell, rank_dir = Cell.read(sys.argv[1]), Path(sys.argv[2])
failed = wait_all(start_srun(cell, [sys.executable, "-m", "dlscale.rank.devices"], rank_dir))
sys.exit(0 if failed is None else 1)
"""
# 2 nodes x 2 GPUs; -O: 2 ranks on each 1-CPU node of the local cluster
ALLOCATION = ["salloc", "--nodes=2", "--ntasks=4", "--overcommit", "--mem=1000", "--gres=gpu:2"]


def cuda_cell(binding: str) -> Cell:
    """A 2-node x 2-rank cuda cell (tests/helpers/cells.py) over srun with `binding`."""
    nodes, per_node = 2, 2
    return small_cell(
        hardware="gpu",
        nodes=nodes,
        device="cuda",
        ranks_per_node=per_node,
        global_batch=4 * nodes * per_node,
        launcher="srun",
        environment="e",
        gpu_binding=binding,
    )


def ranks_of(rank_dir: Path, world: int) -> list[dict]:
    records = []
    for rank in range(world):
        lines = (rank_dir / f"rank{rank}.log").read_text().splitlines()
        records.append(json.loads(lines[-1]))
    return records


@pytest.mark.parametrize(
    "binding, sees",
    [("node", 2), ("task", 1)],  # gpu_binding: node -> --gpus-per-node, task -> --gpus-per-task
)
def test_every_rank_takes_its_own_board(cluster, tmp_path, binding, sees):
    cell = cuda_cell(binding)
    spec = tmp_path / "cell.json"
    spec.write_text(cell.to_json())
    proc = subprocess.run(
        [*ALLOCATION, sys.executable, "-c", START, str(spec), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    srun_log = (tmp_path / "srun.log").read_text() if (tmp_path / "srun.log").exists() else ""
    assert proc.returncode == 0, proc.stderr[-2000:] + srun_log[-2000:]
    ranks = ranks_of(tmp_path, cell.world_size)
    assert [r["rank"] for r in ranks] == [0, 1, 2, 3]
    assert len({r["node"] for r in ranks}) == 2  # two nodes, two ranks each
    for r in ranks:
        assert r["device_count"] == sees, r
        gpu = r["gpu"]
        # all of the node's boards: the local rank's; one bound board: device 0, which is the
        # board Slurm gave this task (GRES index = local rank: both boards of the node in use)
        assert gpu["ordinal"] == (r["local_rank"] if binding == "node" else 0), r
        assert gpu["gres_index"] == r["local_rank"], r
        assert gpu["key"] == f"gres:{r['local_rank']}", r
    boards = {(r["node"], r["gpu"]["key"]) for r in ranks}
    assert len(boards) == 4  # four ranks, four distinct boards
    assert shared_gpus(ranks) == []


def test_two_ranks_bound_to_one_board_are_flagged(cluster, tmp_path):
    """A step that gives two ranks one GPU (srun --gres=gpu:1, the per-node request applied to a
    2-task step): each rank can only take device 0, the same board, and the record says so."""
    proc = subprocess.run(
        [
            *ALLOCATION[:1],
            "--nodes=1",
            "--ntasks=2",
            "--overcommit",
            "--mem=500",
            "--gres=gpu:2",
            "srun",
            "--overcommit",
            "--ntasks=2",
            "--gres=gpu:1",
            "--output",
            str(tmp_path / "rank%t.log"),
            sys.executable,
            "-m",
            "dlscale.rank.devices",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    ranks = ranks_of(tmp_path, 2)
    assert [r["device_count"] for r in ranks] == [1, 1]
    assert {r["gpu"]["key"] for r in ranks} == {"gres:0"}
    (node,) = {r["node"] for r in ranks}
    assert shared_gpus(ranks) == [{"node": node, "gpu": "gres:0", "ranks": [0, 1]}]


@pytest.mark.parametrize("binding", ["node", "task"])
def test_the_ranks_step_gets_the_gpus_from_inside_the_plugins_job_step(cluster, tmp_path, binding):
    """The executor plugin runs the launcher inside an `srun -n1` step of the cell's job; the
    ranks' step (--overlap, start_srun) still gets the job's GPUs, one board per rank (1 rank
    per node: the local cluster's nodes have one CPU, and start_srun passes no overcommit)."""
    cell = dataclasses.replace(cuda_cell(binding), ranks_per_node=1, global_batch=8)
    spec = tmp_path / "cell.json"
    spec.write_text(cell.to_json())
    proc = subprocess.run(
        [
            "salloc",
            "--nodes=2",
            "--ntasks=2",
            "--mem=1000",
            "--gres=gpu:2",
            "srun",
            "--ntasks=1",
            "--nodes=1",
            sys.executable,
            "-c",
            START,
            str(spec),
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    srun_log = (tmp_path / "srun.log").read_text() if (tmp_path / "srun.log").exists() else ""
    assert proc.returncode == 0, proc.stderr[-2000:] + srun_log[-2000:]
    ranks = ranks_of(tmp_path, 2)
    assert len({r["node"] for r in ranks}) == 2
    assert all(r["device_count"] == 1 and r["gpu"]["ordinal"] == 0 for r in ranks), ranks
    assert shared_gpus(ranks) == []

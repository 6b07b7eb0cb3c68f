"""Slurm resources per resource class (hardware x nodes), the launcher's srun inside a job step,
and how the status table finds an array task's log."""

from __future__ import annotations

import json
import os
from pathlib import Path

import yaml

from dlscale import launch, status
from dlscale.cell import SLURM_JOB_FILE, TRAIN_RULE, Cell
from dlscale.matrix import build_matrix
from dlscale.resources import class_resources

from cells import cell_dict

ROOT = Path(__file__).resolve().parents[2]
HARDWARE = yaml.safe_load((ROOT / "config" / "hardware.yaml").read_text())


def _study(**axes):
    from dlscale.config import load_schema, validate_config, validate_hardware

    schemas = ROOT / "config" / "schemas"
    config = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    config["axes"].update(axes)
    config = validate_config(config, load_schema(schemas / "config.schema.json"))
    hw = validate_hardware(HARDWARE, load_schema(schemas / "hardware.schema.json"), "hardware.yaml")
    return build_matrix(config, hw)


def test_every_cell_of_a_class_needs_exactly_the_class_resources():
    study = _study(hardware=["cpu", "h100"], nodes=[1, 2], precision=["fp32", "bf16"])
    classes = study.resource_classes()
    assert classes == [("cpu", 1), ("cpu", 2), ("h100", 1), ("h100", 2)]
    for hardware, nodes in classes:
        res = class_resources(study.config, study.hardware[hardware], nodes)
        cells = [c for c in study.cells if (c.hardware, c.nodes) == (hardware, nodes)]
        assert cells
        for cell in cells:  # what a job array may assume: one set of resources per rule
            assert res["tasks"] == cell.world_size and res["nodes"] == cell.nodes
            assert res["cpus_per_task"] == cell.cpus_per_rank
            assert res["threads"] == cell.world_size * cell.cpus_per_rank
            assert f"--ntasks-per-node={cell.ranks_per_node}" in res["slurm_extra"]
        assert "mpi" not in res  # see dlscale.resources: it breaks job arrays


def test_gpu_class_resources_and_retry_runtime():
    study = _study(hardware=["h100"], nodes=[2])
    res = class_resources(study.config, study.hardware["h100"], 2)
    hw = HARDWARE["h100"]
    assert res["tasks"] == 2 * hw["gpus_per_node"]
    assert res["mem_mb"] == hw["gpus_per_node"] * hw["mem_mb_per_rank"]
    assert res["slurm_partition"] == hw["partition"]
    assert (
        f"h100:{hw['gpus_per_node']}" in res["slurm_extra"] and "--exclusive" in res["slurm_extra"]
    )
    assert [res["runtime"](None, attempt) for attempt in (1, 2, 3)] == [
        hw["runtime_min"],
        2 * hw["runtime_min"],
        4 * hw["runtime_min"],
    ]
    assert TRAIN_RULE.format(hardware="h100", nodes=2) == "train_h100_n2"


def _fake_srun(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    record = tmp_path / "srun.json"
    (bin_dir / "srun").write_text(
        "#!/usr/bin/env python3\nimport json, os, sys\n"
        "json.dump({'argv': sys.argv[1:], 'env': dict(os.environ)}, "
        f"open({str(record)!r}, 'w'))\n"
    )
    # the allocation as Slurm knows it (the job id's node list), whatever the environment says
    (bin_dir / "squeue").write_text(f"#!/bin/sh\ntouch {tmp_path}/squeue-asked\necho 'n[1-2]'\n")
    (bin_dir / "scontrol").write_text(
        '#!/bin/sh\n[ "$3" = \'n[1-2]\' ] && { echo n1; echo n2; } || echo "$3"\n'
    )
    for exe in bin_dir.iterdir():
        exe.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return record


CELL = Cell.from_dict(cell_dict(nodes=2, ranks_per_node=1, cpus_per_rank=1))


def _run_srun(tmp_path) -> dict:
    procs = launch.start_srun(CELL, ["python", "-m", "dlscale.train"], tmp_path)
    assert procs[0][1].wait() == 0
    return json.loads((tmp_path / "srun.json").read_text())


def test_srun_in_the_batch_script_uses_the_allocation(tmp_path, monkeypatch):
    record = _fake_srun(tmp_path, monkeypatch)
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "n[1-2]")
    monkeypatch.delenv("SLURM_STEP_ID", raising=False)
    got = _run_srun(tmp_path)
    assert record.exists() and "--overlap" not in got["argv"]
    assert got["env"]["DLSCALE_HOSTS"] == "n1,n2"
    assert "--nodes=2" in got["argv"] and got["env"]["MASTER_ADDR"] == "n1"


def test_srun_inside_the_plugins_step_shares_it_and_forgets_the_steps_shape(tmp_path, monkeypatch):
    _fake_srun(tmp_path, monkeypatch)
    # what slurmstepd sets inside the plugin's `srun -n1` step: a 1-node, 1-task shape
    for key, value in {
        "SLURM_JOB_ID": "77",
        "SLURM_JOB_NODELIST": "n1",
        "SLURM_STEP_ID": "0",
        "SLURM_NNODES": "1",
        "SLURM_NTASKS": "1",
        "SLURM_STEP_NUM_NODES": "1",
        "SLURM_TASKS_PER_NODE": "1",
        "SRUN_CPUS_PER_TASK": "1",
    }.items():
        monkeypatch.setenv(key, value)
    got = _run_srun(tmp_path)
    assert got["argv"][0] == "--overlap" and "--nodes=2" in got["argv"]
    assert got["env"]["SLURM_JOB_ID"] == "77"
    # the step's node list is the launcher's one node; the ranks need the allocation's two
    assert (tmp_path / "squeue-asked").exists() and got["env"]["DLSCALE_HOSTS"] == "n1,n2"
    assert not {
        "SLURM_NNODES",
        "SLURM_NTASKS",
        "SLURM_STEP_ID",
        "SLURM_STEP_NUM_NODES",
        "SLURM_TASKS_PER_NODE",
        "SRUN_CPUS_PER_TASK",
    } & set(got["env"])


def test_status_finds_an_array_tasks_log_through_slurm_job_json(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cell = {
        "study": "demo",
        "hardware": "cpu",
        "framework": "pytorch",
        "model": "cnn_small",
        "policy": "weak",
        "precision": "fp32",
        "mode": "eager",
        "nodes": 2,
        "rep": 3,
    }
    run_dir = Path("results/demo/runs/cpu/pytorch/cnn_small/weak/fp32/eager/n2/r3")
    run_dir.mkdir(parents=True)
    (run_dir / SLURM_JOB_FILE).write_text(
        json.dumps({"slurm_job_id": "512", "array_job_id": "500", "array_task_id": "12"})
    )
    job = status.latest_slurm_job(cell, run_dir)
    assert job["slurm_job_id"] == "512"
    assert status.slurm_log(cell, job) == Path("results/logs/slurm/rule_train_cpu_n2/500_12.log")
    # a single job that never reached the launcher: the newest log in the cell's folder
    (run_dir / SLURM_JOB_FILE).unlink()
    folder = Path(
        "results/logs/slurm/rule_train_cpu_n2/demo_cpu_pytorch_cnn_small_weak_fp32_eager_2_3"
    )
    folder.mkdir(parents=True)
    for job_id in ("90", "105"):
        (folder / f"{job_id}.log").write_text("")
    assert status.latest_slurm_job(cell, run_dir) == {"slurm_job_id": "105"}

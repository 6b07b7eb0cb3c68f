"""Slurm resources per resource class (hardware x nodes), the launcher's srun inside a job step,
and how the status table finds an array task's log."""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path

import pytest
import yaml

from dlscale.analysis import cell_status as status
from dlscale.run.launchers import srun as srun_launcher
from dlscale.study.cell import SLURM_JOB_FILE, TRAIN_RULE, Cell
from dlscale.study.matrix import build_matrix
from dlscale.study.resources import class_resources

from helpers.cells import cell_dict, plugin_sbatch

ROOT = Path(__file__).resolve().parents[3]
HARDWARE = yaml.safe_load((ROOT / "config" / "hardware.yaml").read_text())


def _study(**axes):
    from dlscale.study.config import load_schema, validate_config
    from dlscale.study.hardware import validate_hardware

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
        threads, res = class_resources(study.config, study.hardware[hardware], nodes)
        cells = [c for c in study.cells if (c.hardware, c.nodes) == (hardware, nodes)]
        assert cells
        for cell in cells:  # what a job array may assume: one set of resources per rule
            assert res["tasks"] == cell.world_size and res["nodes"] == cell.nodes
            assert res["cpus_per_task"] == cell.cpus_per_rank
            assert threads == cell.world_size * cell.cpus_per_rank
            assert f"--ntasks-per-node={cell.ranks_per_node}" in res["slurm_extra"]
        assert "mpi" not in res  # see dlscale.study.resources: it breaks job arrays


def test_gpu_class_resources_and_retry_runtime():
    study = _study(hardware=["h100"], nodes=[2])
    _, res = class_resources(study.config, study.hardware["h100"], 2)
    hw = HARDWARE["h100"]
    assert res["tasks"] == 2 * hw["gpus_per_node"]
    assert res["mem_mb"] == hw["gpus_per_node"] * hw["mem_mb_per_rank"]
    assert res["slurm_partition"] == hw["partition"]
    assert res["constraint"] == hw["constraint"]
    assert shlex.split(res["slurm_extra"]) == [
        f"--ntasks-per-node={hw['gpus_per_node']}",
        f"--gpus-per-node=h100:{hw['gpus_per_node']}",
        "--exclusive",
    ]
    assert [res["runtime"](None, attempt) for attempt in (1, 2, 3)] == [
        hw["runtime_min"],
        2 * hw["runtime_min"],
        4 * hw["runtime_min"],
    ]
    assert TRAIN_RULE.format(hardware="h100", nodes=2) == "train_h100_n2"


@pytest.mark.parametrize("hardware", ["cpu", "v100", "a100", "h100"])
def test_every_shipped_hardware_entry_passes_the_plugins_checks(hardware):
    """The plugin (2.8) refuses --gres, --gpus, --constraint, --ntasks, --mem ... in
    slurm_extra; every shipped entry's request must pass its check and mean what the entry
    says: nodes x ranks per node tasks, the node's GPUs per node, the constraint once."""
    study = _study(hardware=[hardware], nodes=[2])
    hw = study.hardware[hardware]
    threads, res = class_resources(study.config, hw, 2)
    argv = shlex.split(plugin_sbatch(res, threads))
    per_node = res["tasks"] // 2
    assert "--nodes=2" in argv and f"--ntasks-per-node={per_node}" in argv
    assert not any(a.startswith("--ntasks-per-gpu") for a in argv)  # would multiply the ranks
    assert f"--cpus-per-task={hw['cpus_per_rank']}" in argv
    gpu_args = [a for a in argv if a.startswith(("--gres", "--gpus"))]
    if not hw["gpus_per_node"]:
        assert gpu_args == [] and f"--ntasks={res['tasks']}" in argv
    elif hw["gpu_request"] == "gres":
        assert gpu_args == [f"--gres=gpu:{hw['gpu_type']}:{hw['gpus_per_node']}"]
    else:
        assert gpu_args == [f"--gpus-per-node={hw['gpu_type']}:{hw['gpus_per_node']}"]
    if hw["constraint"]:
        assert argv[argv.index("-C") + 1] == hw["constraint"]
    else:
        assert "-C" not in argv
    assert ("--exclusive" in argv) == hw["exclusive"]


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
    procs = srun_launcher.start_srun(CELL, ["python", "-m", "dlscale.run.train"], tmp_path)
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


def test_the_allocation_is_read_from_scontrol_show_job():
    from dlscale.rank.node_probes import parse_allocation

    text = (
        "JobId=192 JobName=wrap Partition=cpu NumNodes=2 NumCPUs=2 NumTasks=2 "
        "TRES=cpu=2,mem=8000M,node=2,billing=2 Socks/Node=* JOB_GRES=gpu:fake:2 "
        "Nodes=n1 CPU_IDs=0 Mem=1500 GRES=gpu:fake:1(IDX:0) "
        "Nodes=n2 CPU_IDs=0 Mem=1500 GRES=gpu:fake:1(IDX:1) "
        "MinCPUsNode=1 NodeList=n[1-2] TresPerNode=gres:gpu:fake:1\n"
    )
    assert parse_allocation(text) == {
        "partition": "cpu",
        "numnodes": "2",
        "numtasks": "2",
        "tres": "cpu=2,mem=8000M,node=2,billing=2",
        "job_gres": "gpu:fake:2",
        "nodelist": "n[1-2]",
        "trespernode": "gres:gpu:fake:1",
        "per_node": [
            {"nodes": "n1", "cpu_ids": "0", "mem": "1500", "gres": "gpu:fake:1(IDX:0)"},
            {"nodes": "n2", "cpu_ids": "0", "mem": "1500", "gres": "gpu:fake:1(IDX:1)"},
        ],
    }


def test_a_cpu_entry_with_gpus_needs_gpus_allocated_only():
    from dlscale.study.config import ConfigError, load_schema
    from dlscale.study.hardware import validate_hardware

    schema = load_schema(ROOT / "config" / "schemas" / "hardware.schema.json")
    entry = dict(device="cpu", gpus_per_node=2, gpu_type="fake")
    with pytest.raises(ConfigError, match="gpus_allocated_only: true"):
        validate_hardware({"fakegpu": entry}, schema)
    ok = validate_hardware({"fakegpu": dict(entry, gpus_allocated_only=True)}, schema)
    assert ok["fakegpu"]["gpus_allocated_only"] is True
    with pytest.raises(ConfigError, match="only for device 'cpu'"):
        validate_hardware(
            {"g": dict(device="cuda", gpus_per_node=1, gpus_allocated_only=True)}, schema
        )

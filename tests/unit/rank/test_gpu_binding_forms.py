"""hardware.yaml `gpu_binding` in its four forms: the srun options the launcher states
for each (dlscale.registry.gpu_bindings, dlscale.run.launchers.srun.gpu_step_options), a map's
checks with hostile and wrong input, the identity of node and task cells, the inherited binding
variables the launcher removes, the device a `closest` rank takes, and what the preflight's
ranks check they got (dlscale.rank.devices.binding_check, dlscale.run.preflight_job). On the
cluster, with a fake GPU/NUMA topology: tests/slurm/test_gpu_topology.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dlscale.rank.devices import DeviceChoiceError, binding_check, locality_domains, pick_gpu
from dlscale.registry.gpu_bindings import (
    GPU_BINDINGS,
    SRUN_BINDING_INPUTS,
    GpuMap,
    binding_of,
    canonical,
)
from dlscale.run import preflight_job
from dlscale.run.launchers import srun as srun_launcher
from dlscale.run.launchers.local import local_rank_env
from dlscale.run.launchers.srun import binding_free_env, gpu_step_options
from dlscale.study.cell import Cell
from dlscale.study.config import ConfigError, load_schema
from dlscale.study.hardware import validate_hardware
from dlscale.study.hashes import hashed_hardware
from dlscale.study.matrix import build_matrix

from helpers.cells import cell_dict

ROOT = Path(__file__).resolve().parents[3]
SCHEMA = load_schema(ROOT / "config" / "schemas" / "hardware.schema.json")
NUMA = {"gpus": [0, 1, 2, 3], "numa": [3, 1, 7, 5]}
CPUS = {"gpus": [1, 0], "cpus": ["0-15", "16-23,32-39"]}


def entry(**changes) -> dict:
    return {
        "device": "cuda",
        "gpus_per_node": 4,
        "gpu_type": "h100",
        "exclusive": True,
        "cpus_per_rank": 8,
        **changes,
    }


def cuda_cell(binding, ranks_per_node: int = 4) -> Cell:
    return Cell.from_dict(
        cell_dict(
            device="cuda",
            launcher="srun",
            ranks_per_node=ranks_per_node,
            global_batch=4 * 2 * ranks_per_node,
            gpu_binding=binding,
        )
    )


# --------------------------------------------------------------------- the srun options of each
def test_every_binding_states_its_srun_options():
    assert gpu_step_options(cuda_cell("node")) == ["--gpus-per-node=4"]
    assert gpu_step_options(cuda_cell(None)) == ["--gpus-per-node=4"]  # the default: node
    assert gpu_step_options(cuda_cell("task")) == ["--gpus-per-task=1", "--gpu-bind=per_task:1"]
    # closest: every GPU the job holds on a node (an exclusive job: the whole node's), which
    # the launcher asks Slurm for; where Slurm does not say, the job's GPUs by Slurm's default
    assert gpu_step_options(cuda_cell("closest"), job_gpus=8) == [
        "--gpus-per-node=8",
        "--cpu-bind=ldoms",
        "--gpu-bind=closest",
    ]
    assert gpu_step_options(cuda_cell("closest")) == ["--cpu-bind=ldoms", "--gpu-bind=closest"]
    assert gpu_step_options(cuda_cell(canonical(NUMA))) == [
        "--gpus-per-node=4",
        "--gpu-bind=map_gpu:0,1,2,3",
        "--cpu-bind=map_ldom:3,1,7,5",
    ]
    # CPU lists become masks; every GPU of the node in the step, also for fewer ranks
    assert gpu_step_options(cuda_cell(canonical(CPUS), ranks_per_node=1)) == [
        "--gpus-per-node=2",
        "--gpu-bind=map_gpu:1,0",
        "--cpu-bind=mask_cpu:0xffff,0xff00ff0000",
    ]
    assert gpu_step_options(Cell.from_dict(cell_dict())) == []  # a CPU cell: no GPU options
    assert list(GPU_BINDINGS) == ["node", "task", "closest"]  # the schema's enum


@pytest.mark.parametrize(
    "gres, count",
    [
        ("gpu:h100:8(IDX:0-7)", 8),
        ("gpu:2(IDX:0,2)", 2),
        ("gpu:a100:2(IDX:0-1),gpu:v100:1(IDX:2)", 3),
        ("nic:1,gpu:4(IDX:0-3)", 4),
        ("(null)", None),
    ],
)
def test_the_gpus_a_job_holds_on_a_node_as_scontrol_shows_them(monkeypatch, gres, count):
    asked = []

    def allocation(job):
        asked.append(job)
        return {"per_node": [{"nodes": "n[1-2]", "gres": gres}]}

    monkeypatch.setattr(srun_launcher, "job_allocation", allocation)
    assert srun_launcher.job_gpus_per_node({"SLURM_JOB_ID": "42"}) == count and asked == ["42"]
    monkeypatch.setattr(srun_launcher, "job_allocation", lambda job: None)
    assert srun_launcher.job_gpus_per_node({"SLURM_JOB_ID": "42"}) is None
    assert srun_launcher.job_gpus_per_node({}) is None


def test_a_map_has_one_canonical_form_in_its_cell():
    value = canonical(NUMA)
    assert value == "map_gpu:0,1,2,3 map_ldom:3,1,7,5"
    assert binding_of(value) == GpuMap((0, 1, 2, 3), numa=(3, 1, 7, 5))
    # the same CPUs written two ways are one binding, one identity
    same = canonical({"gpus": [1, 0], "cpus": ["0-7,8-15", "16-23,32-39"]})
    assert same == canonical(CPUS) == "map_gpu:1,0 mask_cpu:0xffff,0xff00ff0000"
    back = binding_of(same)
    assert back.cpus_of(0) == frozenset(range(16)) and back.gpu_of(1) == 0
    assert canonical({"gpus": [0], "cpus": [5]}) == "map_gpu:0 mask_cpu:0x20"
    assert canonical("closest") == "closest" and canonical(None) == "node"


@pytest.mark.parametrize(
    "value",
    [
        "socket",
        "map",
        "map_gpu:0",
        "map_gpu:0,1 map_ldom:x",
        "map_gpu:0 mask_cpu:ff",
        "map_gpu:0 map_ldom:0; rm -rf /",
        "map_gpu:0  map_ldom:0",
        "Node",
    ],
)
def test_a_string_that_is_not_a_binding_is_refused_naming_the_forms(value):
    with pytest.raises(ValueError) as err:
        binding_of(value)
    assert "node, task, closest" in str(err.value) and "map_gpu:" in str(err.value)


# ---------------------------------------------------------------------- a map, checked early
def problems(**changes) -> list[str]:
    try:
        validate_hardware({"g": entry(**changes)}, SCHEMA)
    except ConfigError as exc:
        return exc.problems
    return []


def test_a_valid_map_passes_and_enters_the_hardware_hash():
    assert problems(gpu_binding=NUMA) == []
    assert (
        problems(gpu_binding={"gpus": [3, 2, 1, 0], "cpus": ["0-15", "16-31", 64, "48-63"]}) == []
    )
    plain = validate_hardware({"g": entry()}, SCHEMA)["g"]
    mapped = validate_hardware({"g": entry(gpu_binding=NUMA)}, SCHEMA)["g"]
    closest = validate_hardware({"g": entry(gpu_binding="closest")}, SCHEMA)["g"]
    hashes = {json.dumps(hashed_hardware(e), sort_keys=True) for e in (plain, mapped, closest)}
    assert len(hashes) == 3


@pytest.mark.parametrize(
    "binding, changes, needed",
    [
        # one value per GPU of the node (gpus_per_node 4)
        ({"gpus": [0, 1, 2], "numa": [0, 0, 1]}, {}, ["gpu_binding.gpus: lists 3", "4 (the"]),
        ({"gpus": [0, 1, 2, 3], "numa": [0, 1]}, {}, ["gpu_binding.numa: lists 2 value(s)"]),
        ({"gpus": [0, 1], "numa": [0, 1]}, {"gpus_per_node": 2, "exclusive": True}, []),
        # indices on the node, each once
        ({"gpus": [0, 1, 2, 4], "numa": [0] * 4}, {}, ["gpus[3]: 4 is not a GPU index", "0..3"]),
        ({"gpus": [0, -1, 2, 3], "numa": [0] * 4}, {}, ["gpus[1]: -1 is not a GPU index"]),
        ({"gpus": [0, 1, 1, 3], "numa": [0] * 4}, {}, ["GPU(s) 1 named more than once"]),
        ({"gpus": [0, 1, 2, 3], "numa": [0, 1, 256, 0]}, {}, ["numa[2]: 256 is not a NUMA"]),
        # CPUs stated exactly one way
        ({"gpus": [0, 1, 2, 3]}, {}, ["exactly one of numa", "got neither"]),
        (
            {"gpus": [0, 1, 2, 3], "numa": [0] * 4, "cpus": ["0"] * 4},
            {},
            ["got numa and cpus"],
        ),
        # CPU lists that cannot be, hostile ones included
        ({"gpus": [0, 1, 2, 3], "cpus": ["0-", "1", "2", "3"]}, {}, ["cpus[0]: '0-' is not"]),
        ({"gpus": [0, 1, 2, 3], "cpus": ["3-1", "1", "2", "3"]}, {}, ["runs backwards"]),
        ({"gpus": [0, 1, 2, 3], "cpus": ["0;rm -rf /", "1", "2", "3"]}, {}, ["is not a CPU"]),
        ({"gpus": [0, 1, 2, 3], "cpus": ["0", "1", "2", "1024"]}, {}, ["above 1023"]),
        ({"gpus": [0, 1, 2, 3], "cpus": ["0", "1", "2", "$(id)"]}, {}, ["is not a CPU list"]),
        # a whole node, or Slurm does not honour it
        (NUMA, {"exclusive": False}, ["a map binds by the node's own", "exclusive: true"]),
        # what the schema refuses: keys, types, a string that is no binding
        ({"gpus": [0, 1, 2, 3], "numa": [0] * 4, "nics": [0]}, {}, ["unknown key 'nics'"]),
        ({"gpus": "0,1,2,3", "numa": [0] * 4}, {}, ["gpu_binding.gpus: '0,1,2,3' must be a list"]),
        ({"gpus": [0, 1, 2, True], "numa": [0] * 4}, {}, ["gpus[3]: True is a boolean"]),
        ({"numa": [0, 1, 2, 3]}, {}, ["'gpus' is a required property"]),
        ("socket", {}, ["'socket' is not allowed; allowed values: node, task, closest"]),
        ("map_gpu:0,1,2,3 map_ldom:0,0,1,1", {}, ["allowed values: node, task, closest"]),
        (4, {}, ["gpu_binding: 4 must be a string or a mapping"]),
    ],
)
def test_a_wrong_map_is_refused_before_any_job_naming_the_key_and_the_allowed(
    binding, changes, needed
):
    found = problems(gpu_binding=binding, **changes)
    text = "\n".join(found)
    if not needed:
        assert found == []
        return
    assert all("g.gpu_binding" in p for p in found), found
    for part in needed:
        assert part in text, text
    assert len(found) == len(set(found))


def test_a_map_on_a_cpu_entry_is_refused():
    found = "\n".join(problems(device="cpu", gpus_per_node=0, gpu_binding=NUMA))
    assert "g.gpu_binding: only for device 'cuda'" in found


# ------------------------------------------------------------- node and task keep their identity
def _study(hardware: dict) -> list[Cell]:
    config = {
        "study": "s",
        "axes": {"hardware": ["g"], "framework": ["pytorch"], "model": ["cnn_small"]},
    }
    from dlscale.study.config import validate_config

    config = validate_config(
        config, load_schema(ROOT / "config" / "schemas" / "config.schema.json")
    )
    hardware = validate_hardware(hardware, SCHEMA)
    return build_matrix(config, hardware).cells


def test_node_and_task_cells_keep_their_identity_and_the_new_forms_get_their_own():
    base = {
        "device": "cuda",
        "gpus_per_node": 2,
        "partition": "gpu",
        "gpu_type": "h100",
        "exclusive": True,
        "cpus_per_rank": 1,
        "mem_mb_per_rank": 1000,
        "max_nodes": 2,
        "runtime_min": 5,
    }
    implicit = _study({"g": base})
    node = _study({"g": {**base, "gpu_binding": "node"}})
    # the default stated or not: the same cells, paths, hashes and JSON as before the forms
    assert [c.to_json() for c in implicit] == [c.to_json() for c in node]
    assert all('"gpu_binding": "node"' in c.to_json() for c in node)
    task = _study({"g": {**base, "gpu_binding": "task"}})
    assert all('"gpu_binding": "task"' in c.to_json() for c in task)
    closest = _study({"g": {**base, "gpu_binding": "closest"}})
    mapped = _study({"g": {**base, "gpu_binding": {"gpus": [1, 0], "numa": [1, 0]}}})
    assert mapped[0].gpu_binding == "map_gpu:1,0 map_ldom:1,0"
    for cells in (task, closest, mapped):
        assert [c.path for c in cells] == [c.path for c in node]  # where: the same place
        assert {c.config_hash for c in cells}.isdisjoint({c.config_hash for c in node})
    assert Cell.from_json(mapped[0].to_json()) == mapped[0]  # a cell read back is the cell


# ------------------------------------------------------------------ inherited binding variables
def test_the_ranks_srun_environment_loses_every_inherited_binding_variable():
    env = {
        "SLURM_CPU_BIND": "map_cpu:1,1",
        "SLURM_GPU_BIND": "closest",
        "SLURM_MEM_BIND": "local",
        "SLURM_DISTRIBUTION": "cyclic:cyclic",
        "SLURM_HINT": "nomultithread",
        "SLURM_GPUS_PER_TASK": "1",
        "SLURM_CPU_BIND_LIST": "0x1",  # an output variable srun does not read: kept
        "SLURM_JOB_ID": "7",
        "PATH": "/bin",
    }
    kept, removed = binding_free_env(env)
    assert kept == {"SLURM_CPU_BIND_LIST": "0x1", "SLURM_JOB_ID": "7", "PATH": "/bin"}
    assert set(removed) == set(env) - set(kept) and set(removed) <= set(SRUN_BINDING_INPUTS)
    assert env["SLURM_CPU_BIND"] == "map_cpu:1,1"  # the caller's mapping is left alone


# ---------------------------------------------------------------- the device a closest rank takes
def test_a_closest_rank_takes_its_place_among_the_ranks_on_its_numa_node():
    """8 ranks, 2 NUMA nodes of 4 GPUs, Slurm's default cyclic placement over sockets: each
    rank sees the 4 GPUs of its NUMA node and takes its index among the ranks there."""
    masks = "0xff,0xff00,0xff,0xff00,0xff,0xff00,0xff,0xff00"
    taken = set()
    for local in range(8):
        numa = local % 2
        env = {
            "CUDA_VISIBLE_DEVICES": ",".join(str(4 * numa + g) for g in range(4)),
            "SLURM_CPU_BIND_LIST": masks,
        }
        ordinal = pick_gpu(local, 8, 4, env)
        taken.add(env["CUDA_VISIBLE_DEVICES"].split(",")[ordinal])
    assert taken == {str(g) for g in range(8)}  # every board once
    # more ranks on a NUMA node than GPUs there, or no masks to tell: refused
    with pytest.raises(DeviceChoiceError, match="gpu_binding: closest"):
        pick_gpu(2, 8, 2, {"CUDA_VISIBLE_DEVICES": "0,1", "SLURM_CPU_BIND_LIST": masks})
    with pytest.raises(DeviceChoiceError):
        pick_gpu(2, 8, 4, {"CUDA_VISIBLE_DEVICES": "0,1,2,3"})


# ---------------------------------------------------------------- what the preflight's ranks check
DOMAINS = ({0: frozenset({0, 1}), 1: frozenset({2, 3})}, "NUMA node")


def check(binding, local, world, env, cpus):
    return binding_check(binding, local, world, env, cpus, DOMAINS, who=f"rank {local} on n1")


def test_what_each_binding_promises_is_what_the_rank_is_checked_for():
    node_env = {"CUDA_VISIBLE_DEVICES": "0,1", "SLURM_STEP_GPUS": "0,1"}
    assert check("node", 1, 2, node_env, {0, 1, 2, 3})["ok"]
    got = check("node", 1, 2, {"CUDA_VISIBLE_DEVICES": "1"}, {2})
    assert not got["ok"] and "see all of its node's GPUs" in got["detail"]
    assert check("task", 1, 2, {"CUDA_VISIBLE_DEVICES": "1"}, {0, 1, 2, 3})["ok"]
    assert not check("task", 1, 2, node_env, {2})["ok"]
    closest = {"CUDA_VISIBLE_DEVICES": "2", "SLURM_STEP_GPUS": "2"}
    good = check("closest", 1, 2, closest, {2, 3})
    assert good["ok"] and good["domains"] == [1] and good["gpu"]["key"] == "gres:2"
    spread = check("closest", 1, 2, closest, {0, 1, 2, 3})
    assert not spread["ok"]
    for part in (
        "gpu_binding closest: rank 1 on n1 got CPUs 0-3 (NUMA nodes 0, 1)",
        "CUDA_VISIBLE_DEVICES='2'",
        "it should be bound to the CPUs of one NUMA node",
    ):
        assert part in spread["detail"], spread["detail"]
    assert "--cpu-bind=ldoms --gpu-bind=closest" in spread["fix"]
    assert "cli_filter" in spread["fix"] and "gpu_binding" in spread["fix"]
    assert not check("closest", 0, 2, {"CUDA_VISIBLE_DEVICES": ""}, {0})["ok"]


def test_a_map_rank_is_checked_for_its_own_gpu_and_cpus():
    numa = "map_gpu:3,2 map_ldom:1,0"
    assert check(numa, 0, 2, {"CUDA_VISIBLE_DEVICES": "3", "SLURM_STEP_GPUS": "3"}, {2})["ok"]
    # inside a cgroup CUDA_VISIBLE_DEVICES is renumbered; SLURM_STEP_GPUS keeps the node's index
    assert check(numa, 0, 2, {"CUDA_VISIBLE_DEVICES": "0", "SLURM_STEP_GPUS": "3"}, {2, 3})["ok"]
    wrong = check(numa, 1, 2, {"CUDA_VISIBLE_DEVICES": "3", "SLURM_STEP_GPUS": "3"}, {2})
    assert not wrong["ok"]
    assert (
        "see exactly GPU 2 of the node and be bound to the CPUs of NUMA node 0 (0-1)"
        in (wrong["detail"])
    )
    missing = check("map_gpu:0 map_ldom:7", 0, 1, {"CUDA_VISIBLE_DEVICES": "0"}, {0})
    assert "NUMA node 7, which this node does not have (its NUMA nodes: 0, 1)" in missing["detail"]
    cpus = "map_gpu:0,1 mask_cpu:0x1,0x6"
    assert check(cpus, 1, 2, {"CUDA_VISIBLE_DEVICES": "1"}, {1, 2})["ok"]
    assert "be bound to CPUs 1-2" in check(cpus, 1, 2, {"CUDA_VISIBLE_DEVICES": "1"}, {1})["detail"]


def test_locality_domains_from_sysfs_and_sockets_where_the_kernel_shows_no_numa_node(tmp_path):
    nodes, cpus = tmp_path / "node", tmp_path / "cpu"
    for n, text in ((0, "0-1"), (1, "2-3"), (2, "")):  # node 2: memory only
        (nodes / f"node{n}").mkdir(parents=True)
        (nodes / f"node{n}" / "cpulist").write_text(text + "\n")
    assert locality_domains(str(nodes), str(cpus)) == (
        {0: frozenset({0, 1}), 1: frozenset({2, 3}), 2: frozenset()},
        "NUMA node",
    )
    for c, package in ((0, 0), (1, 0), (2, 1)):
        (cpus / f"cpu{c}" / "topology").mkdir(parents=True)
        (cpus / f"cpu{c}" / "topology" / "physical_package_id").write_text(f"{package}\n")
    assert locality_domains(str(tmp_path / "none"), str(cpus)) == (
        {0: frozenset({0, 1}), 1: frozenset({2})},
        "socket",
    )


def test_the_preflight_fails_on_a_bad_binding_and_on_two_ranks_sharing_a_gpu(tmp_path):
    cell = cuda_cell("closest", ranks_per_node=2)
    bad = {"ok": False, "detail": "gpu_binding closest: rank 1 (...) got CPUs 0-3", "fix": "f"}
    good = {"name": "binding", "ok": True, "detail": "gpu_binding closest: fine", "fix": None}
    records = {
        0: {"node": "n1", "rank": 0, "gpu": {"key": "gres:0"}, "checks": [good]},
        1: {
            "node": "n1",
            "rank": 1,
            "gpu": {"key": "gres:1"},
            "checks": [{"name": "binding", **bad}],
        },
        2: {"node": "n2", "rank": 2, "gpu": {"key": "gres:0"}, "checks": [good]},
        3: {"node": "n2", "rank": 3, "gpu": {"key": "gres:0"}, "checks": [good]},
    }
    for rank, record in records.items():
        (tmp_path / preflight_job.RANK_FILE.format(rank=rank)).write_text(json.dumps(record))
    checks = preflight_job.rank_checks(cell, tmp_path, None)
    assert [c["name"] for c in checks] == ["binding", "binding"]
    assert checks[0]["detail"] == bad["detail"] and not checks[0]["ok"]
    assert not checks[1]["ok"] and "ranks 2, 3 on n2 all take GPU gres:0" in checks[1]["detail"]


def test_a_preflight_rank_checks_its_binding_before_it_imports_anything(tmp_path):
    """The production rank program under the local launcher's variables, with every GPU of a
    2-GPU node visible to a `task` rank: it fails its binding check and stops there (no import
    record, no device check)."""
    cell = cell_dict(device="cuda", launcher="srun", ranks_per_node=2, global_batch=16)
    cell["gpu_binding"] = "task"
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"cell": cell, "entry": {}, "key": "k", "environment": "e"}))
    env = local_rank_env(1, 4, 2, 29500, base={"PATH": "/usr/bin:/bin"})
    env.update(PYTHONPATH=str(ROOT / "scripts"), CUDA_VISIBLE_DEVICES="0,1")
    argv = [sys.executable, "-m", preflight_job.MODULE, "rank", "--spec", str(spec)]
    proc = subprocess.run(
        [*argv, "--rank-dir", str(tmp_path)], env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 1, proc.stderr
    record = json.loads((tmp_path / preflight_job.RANK_FILE.format(rank=1)).read_text())
    assert [c["name"] for c in record["checks"]] == ["binding"]
    detail = record["checks"][0]["detail"]
    assert "gpu_binding task: rank 1 (local rank 1 on" in detail
    assert "CUDA_VISIBLE_DEVICES='0,1'" in detail and "see exactly one GPU" in detail
    assert record["binding"]["visible_devices"] == "0,1" and record["binding"]["cpus"]

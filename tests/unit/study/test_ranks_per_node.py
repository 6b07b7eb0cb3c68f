"""A 1-GPU base: config axes.ranks_per_node gives GPU cells 1, 2, ... GPUs of a
node beside whole nodes; each value is checked against the entry's gpus_per_node, each class
asks Slurm for its own GPUs, and a study without the axis keeps every cell as it was."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
import yaml

from dlscale.study.cell import Cell, parse_cell_path, study_dir_of, train_rule
from dlscale.study.config import ConfigError, load_schema, validate_config
from dlscale.study.hardware import validate_hardware
from dlscale.study.matrix import build_matrix
from dlscale.study.resources import class_resources

ROOT = Path(__file__).resolve().parents[3]
SCHEMAS = ROOT / "config" / "schemas"
HARDWARE = validate_hardware(
    yaml.safe_load((ROOT / "config" / "hardware.yaml").read_text()),
    load_schema(SCHEMAS / "hardware.schema.json"),
    "hardware.yaml",
)


def _study(axes: dict, hardware: dict = HARDWARE, **settings):
    config = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    config["axes"].update(
        {"framework": ["pytorch"], "model": ["cnn_small"], "policy": ["weak"], **axes}
    )
    config.update({"workloads": ["throughput"], "repetitions": 1, **settings})
    config = validate_config(config, load_schema(SCHEMAS / "config.schema.json"))
    return build_matrix(config, hardware)


def test_one_two_four_gpus_of_one_node_beside_two_whole_nodes():
    """1, 2, 4 GPUs on one node plus 2 nodes x 4 (the 2 x 1 and 2 x 2 cells excluded)."""
    study = _study(
        {"hardware": ["a100"], "nodes": [1, 2], "ranks_per_node": [1, 2, 4]},
        exclude=[{"nodes": 2, "ranks_per_node": 1}, {"nodes": 2, "ranks_per_node": 2}],
    )
    cells = {(c.nodes, c.ranks_per_node): c for c in study.cells}
    assert sorted(cells) == [(1, 1), (1, 2), (1, 4), (2, 4)]
    assert [cells[k].world_size for k in sorted(cells)] == [1, 2, 4, 8]
    # the whole-node cells are the cells a study without the axis has: same path and identity
    plain = {c.nodes: c for c in _study({"hardware": ["a100"], "nodes": [1, 2]}).cells}
    for nodes in (1, 2):
        assert cells[nodes, 4].path == plain[nodes].path
        assert cells[nodes, 4].to_json() == plain[nodes].to_json()
    # fewer GPUs than the node has: a path segment, read back, and its own train rule
    one = cells[1, 1]
    assert one.path.endswith("/a100/pytorch/cnn_small/weak/fp32/eager/n1/rpn1/r1/metrics.jsonl")
    assert parse_cell_path(one.path)["ranks_per_node"] == 1
    assert study_dir_of(one.path) == Path("results/demo")
    assert Cell.from_json(one.to_json()) == one
    assert len({c.path for c in study.cells}) == len(study.cells)
    assert study.train_rules() == [
        ("throughput", "a100", 1, "ddp", None),
        ("throughput", "a100", 1, "ddp", 1),
        ("throughput", "a100", 1, "ddp", 2),
        ("throughput", "a100", 2, "ddp", None),
    ]
    assert train_rule("throughput", "ddp", 2).format(hardware="a100", nodes=1) == (
        "train_a100_n1_rpn2"
    )


def test_strong_scaling_keeps_the_global_batch_of_the_smallest_world():
    study = _study(
        {"hardware": ["h100"], "nodes": [1], "ranks_per_node": [1, 2, 4], "policy": ["strong"]}
    )
    per_rank = study.config["per_rank_batch"]
    assert {c.global_batch for c in study.cells} == {per_rank}  # world size 1's
    assert sorted(c.per_rank_batch * c.world_size for c in study.cells) == [per_rank] * 3


@pytest.mark.parametrize(
    "axes, words",
    [
        (
            {"hardware": ["v100"], "ranks_per_node": [1, 8]},
            ["axes.ranks_per_node", "[8]", "4 GPUs per node", "'v100'", "allowed: 1..4"],
        ),
        ({"hardware": ["a100"], "ranks_per_node": [0]}, ["axes.ranks_per_node[0]", ">= 1"]),
        ({"hardware": ["a100"], "ranks_per_node": [2, 2]}, ["axes.ranks_per_node", "duplicated"]),
    ],
)
def test_ranks_per_node_beyond_the_entry_are_refused_naming_the_key(axes, words):
    with pytest.raises(ConfigError) as exc:
        _study({"nodes": [1], **axes})
    assert all(w in str(exc.value) for w in words), str(exc.value)


def test_an_excluded_value_is_not_refused():
    eight = {**HARDWARE, "h100": {**HARDWARE["h100"], "gpus_per_node": 8}}
    study = _study(
        {"hardware": ["v100", "h100"], "nodes": [1], "ranks_per_node": [4, 8]},
        eight,
        exclude=[{"hardware": "v100", "ranks_per_node": 8}],
    )
    assert sorted((c.hardware, c.ranks_per_node, c.ranks_in_path) for c in study.cells) == [
        ("h100", 4, True),  # fewer than its 8 GPUs: named in its path
        ("h100", 8, False),
        ("v100", 4, False),
    ]


@pytest.mark.parametrize("request_kind", ["gres", "gpus"])
def test_a_class_asks_slurm_for_one_gpu_per_rank(request_kind):
    hw = {**HARDWARE["a100"], "gpu_request": request_kind}
    study = _study({"hardware": ["a100"], "nodes": [1, 2], "ranks_per_node": [1, 4]})
    for _, hardware, nodes, _, ranks in study.train_rules():
        threads, res = class_resources(study.config, hw, nodes, ranks)
        per_node = ranks or hw["gpus_per_node"]
        cells = [
            c
            for c in study.cells
            if (c.nodes, c.ranks_per_node, c.ranks_in_path) == (nodes, per_node, bool(ranks))
        ]
        assert cells and all(res["tasks"] == c.world_size for c in cells)
        assert threads == nodes * per_node * hw["cpus_per_rank"]
        assert res["mem_mb"] == per_node * hw["mem_mb_per_rank"]
        extra = shlex.split(res["slurm_extra"])
        assert f"--ntasks-per-node={per_node}" in extra
        if request_kind == "gres":
            assert res["gres"] == f"gpu:{hw['gpu_type']}:{per_node}"
        else:
            assert f"--gpus-per-node={hw['gpu_type']}:{per_node}" in extra
    # no per-node count given (every study without the axis): the whole node, as before
    _, whole = class_resources(study.config, hw, 1)
    assert f"--ntasks-per-node={hw['gpus_per_node']}" in shlex.split(whole["slurm_extra"])

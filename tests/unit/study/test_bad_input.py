"""The bad-input corpus: every case is rejected before any job with a message naming the key.

Configuration and hardware-map values never reach a shell line unchecked: names are closed sets
(enums) or safe patterns, and the workflow constrains every wildcard to configured values.
"""

from __future__ import annotations

import copy

import pytest
import yaml

from dlscale.study.config import ConfigError
from dlscale.study.matrix import load_study

HOSTILE = [
    "a;rm -rf ~",
    "$(id)",
    "`id`",
    "../x",
    "a b",
    "a'b",
    'a"b',
    "a\nb",
    "x" * 300,
    "",
    "a|b",
    "a&&b",
    "a>b",
    "~/x",
    "*",
]


def rejected(root, config, hardware=None, tmp_path=None) -> str:
    config = copy.deepcopy(config)
    if hardware is not None:
        path = tmp_path / "hardware.yaml"
        path.write_text(yaml.safe_dump(hardware))
        config["hardware_file"] = str(path)
    with pytest.raises(ConfigError) as info:
        load_study(config, root)
    return str(info.value)


@pytest.mark.parametrize("value", HOSTILE)
def test_hostile_study_name(root, base_config, value):
    message = rejected(root, {**base_config, "study": value})
    assert "study" in message


@pytest.mark.parametrize("axis", ["framework", "model", "hardware", "policy", "precision"])
@pytest.mark.parametrize("value", ["a;rm -rf ~", "$(id)", "../x", "a b\nc"])
def test_hostile_axis_values(root, base_config, axis, value):
    config = copy.deepcopy(base_config)
    config["axes"][axis] = [value]
    message = rejected(root, config)
    assert f"axes.{axis}[0]" in message


@pytest.mark.parametrize("value", ["$(id)", "cnn_small; ls", "../../etc"])
def test_hostile_exclusion_values(root, base_config, value):
    config = {**copy.deepcopy(base_config), "exclude": [{"model": value}]}
    assert "exclude[0].model" in rejected(root, config)


@pytest.mark.parametrize(
    "key, value",
    [
        ("partition", "gpu;reboot"),
        ("partition", "$(id)"),
        ("gpu_type", "a100 --wrap=id"),
        ("constraint", "x y"),
        ("constraint", "`id`"),
    ],
)
def test_hostile_hardware_values(root, base_config, tmp_path, key, value):
    hardware = {"cpu": {"device": "cpu", "max_nodes": 2, key: value}}
    message = rejected(root, base_config, hardware, tmp_path)
    assert f"cpu.{key}" in message


@pytest.mark.parametrize("name", ["a;b", "../cpu", "CPU", "$(id)", "a b"])
def test_hostile_hardware_keys(root, base_config, tmp_path, name):
    message = rejected(root, base_config, {name: {"device": "cpu"}}, tmp_path)
    assert "is not a valid name" in message


@pytest.mark.parametrize(
    "mutate, fragment",
    [
        (lambda c: c["axes"].update(nodes=[-1]), "axes.nodes[0]: -1 must be >= 1"),
        (lambda c: c["axes"].update(nodes=["2"]), "axes.nodes[0]: '2' must be an integer"),
        (lambda c: c["axes"].update(nodes=[10**9]), "must be <= 4096"),
        (lambda c: c["axes"].update(model=["cnn_small", "cnn_small"]), "duplicated values"),
        (lambda c: c["axes"].update(framework="pytorch"), "must be a list"),
        (lambda c: c.update(repetitions=2.5), "repetitions: 2.5 must be an integer"),
        (lambda c: c.update(warmup_steps=-1), "warmup_steps: -1 must be >= 0"),
        (lambda c: c.update(ranks_per_node=0), "ranks_per_node: 0 must be >= 1"),
        (lambda c: c.update(straggler_threshold=1.5), "straggler_threshold"),
        (lambda c: c.update(axes=None), "axes: None must be a mapping"),
        (lambda c: c.update(exclude={"model": "cnn_small"}), "exclude"),
        (lambda c: c.update(report={"column_width_in": 0}), "report.column_width_in"),
        (lambda c: c.update(report={"title": "x" * 500}), "report.title"),
    ],
)
def test_schema_violations(root, base_config, mutate, fragment):
    config = copy.deepcopy(base_config)
    mutate(config)
    assert fragment in rejected(root, config)


def test_gpus_on_a_cpu_partition(root, base_config, tmp_path):
    hardware = {"cpu": {"device": "cpu", "gpus_per_node": 4, "max_nodes": 2}}
    message = rejected(root, base_config, hardware, tmp_path)
    assert "cpu.gpus_per_node" in message and "set device: cuda" in message


def test_cuda_without_gpus(root, base_config, tmp_path):
    hardware = {"cpu": {"device": "cuda", "max_nodes": 2}}
    assert "needs gpus_per_node >= 1" in rejected(root, base_config, hardware, tmp_path)


def test_hardware_file_missing_or_not_yaml(root, base_config, tmp_path):
    assert "file not found" in rejected(
        root, {**base_config, "hardware_file": str(tmp_path / "nope.yaml")}
    )
    bad = tmp_path / "bad.yaml"
    bad.write_text("cpu: [unclosed\n")
    assert "not valid YAML" in rejected(root, {**base_config, "hardware_file": str(bad)})

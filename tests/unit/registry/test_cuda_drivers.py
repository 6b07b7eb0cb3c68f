"""The driver table: data with its source, minor version compatibility, and the
hardware keys that state a node's driver, checked early and hashed nowhere."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from dlscale.registry import cuda_drivers
from dlscale.study.config import ConfigError, load_schema, load_yaml
from dlscale.study.hardware import validate_hardware
from dlscale.study.matrix import load_study, workflow_config

ROOT = Path(__file__).resolve().parents[3]


def test_the_table_is_data_with_its_source():
    table = cuda_drivers.table()
    assert "docs.nvidia.com/cuda/cuda-toolkit-release-notes" in table["source"]
    assert table["minor_version_compatibility"] == {
        "11": "450.80.02",
        "12": "525.60.13",
        "13": "580.65.06",
    }
    assert cuda_drivers.minimum_driver("12.8") == "525.60.13"
    assert cuda_drivers.minimum_driver("9.2") is None
    assert cuda_drivers.highest_cuda_major("535.183.01") == 12
    assert cuda_drivers.highest_cuda_major("580.65.06") == 13
    assert cuda_drivers.highest_cuda_major("418.39") is None
    assert cuda_drivers.fitting_lines({"nvidia_driver": "525.60.13"}) == ["cu128", "cu126"]
    assert cuda_drivers.fitting_lines({"nvidia_driver": "525.60.12"}) == []
    with pytest.raises(ValueError, match="not a version"):
        cuda_drivers.version_tuple("R550")
    # what each branch supports in full (nvidia-smi's "CUDA Version"): PTX JIT needs it
    assert cuda_drivers.driver_cuda({"nvidia_driver": "535.183.01"}) == "12.2"
    assert cuda_drivers.driver_cuda({"nvidia_driver": "580.65.06", "max_cuda": "13.0"}) == "13.0"
    assert cuda_drivers.driver_cuda({}) is None
    assert cuda_drivers.driver_jits({"nvidia_driver": "570.86.10"}, "12.8")[0]
    assert not cuda_drivers.driver_jits({"nvidia_driver": "570.86.10"}, "12.9")[0]


@pytest.fixture()
def hardware():
    return (
        load_yaml(ROOT / "config" / "hardware.yaml"),
        load_schema(ROOT / "config" / "schemas" / "hardware.schema.json"),
    )


def test_the_driver_keys_are_checked_early_with_the_key_named(hardware):
    entries, schema = hardware
    ok = copy.deepcopy(entries)
    ok["h100"] |= {"nvidia_driver": "550.54.15", "max_cuda": "12.4"}
    assert validate_hardware(ok, schema)["h100"]["cuda_forward_compat"] is False
    for key, value, says in (
        ("nvidia_driver", "R550", "h100.nvidia_driver"),
        ("max_cuda", "12", "h100.max_cuda"),
    ):
        bad = copy.deepcopy(entries)
        bad["h100"][key] = value
        with pytest.raises(ConfigError, match=says):
            validate_hardware(bad, schema)
    two = copy.deepcopy(entries)
    two["h100"] |= {"nvidia_driver": "550.54.15", "max_cuda": "13.0"}
    with pytest.raises(ConfigError, match=r"h100.max_cuda: 13.0 disagrees with h100.nvidia_driver"):
        validate_hardware(two, schema)
    cpu = copy.deepcopy(entries)
    cpu["cpu"]["nvidia_driver"] = "550.54.15"
    with pytest.raises(ConfigError, match=r"cpu.nvidia_driver: only for device 'cuda'"):
        validate_hardware(cpu, schema)


def test_stating_a_driver_that_runs_the_default_build_re_measures_nothing(tmp_path):
    """The keys check, and choose a CUDA line only where the default build cannot run: a driver
    that runs PyPI's CUDA 13 torch (R580, or nvidia-smi's CUDA 13.0) gives every cell the same
    path, identity and hash as no driver stated. (An R525-R570 driver moves PyTorch's GPU cells
    to a CUDA 12 line: another build, another identity; tests/unit/envs/test_cuda_lines.py.)"""
    text = (ROOT / "config" / "hardware.yaml").read_text()
    model = "  device_model: NVIDIA H100 80GB HBM3\n"
    gpu = {"axes": {"hardware": ["cpu", "h100"]}, "workloads": ["throughput"]}
    plain = load_study(workflow_config(gpu, ROOT), ROOT)
    for stated in ('  nvidia_driver: "580.95.05"\n', '  max_cuda: "13.0"\n'):
        hw = tmp_path / "hw.yaml"
        hw.write_text(text.replace(model, model + stated))
        with_driver = load_study(workflow_config({**gpu, "hardware_file": str(hw)}, ROOT), ROOT)
        assert [(c.path, c.config_hash, c.to_json()) for c in plain.cells] == [
            (c.path, c.config_hash, c.to_json()) for c in with_driver.cells
        ]
    assert any(c.hardware == "h100" for c in plain.cells)

"""Paths a user meets that no test walked: the hardware file to the
planner's partitions, the RAPL reader's wrap-around, and plan.default_samples. Each was shown
failing under a deliberate break (the commit that added it says which)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dlscale.study.config import load_schema, load_yaml
from dlscale.study.hardware import validate_hardware
from dlscale.study.partitions import partitions_from_hardware

ROOT = Path(__file__).resolve().parents[3]


def shipped_hardware() -> dict:
    """config/hardware.yaml as the workflow reads it: validated, the schema's defaults filled."""
    schema = load_schema(ROOT / "config/schemas/hardware.schema.json")
    return validate_hardware(load_yaml(ROOT / "config/hardware.yaml"), schema)


def test_the_hardware_file_becomes_the_planners_partitions():
    hardware = shipped_hardware()
    parts = {p.name: p for p in partitions_from_hardware(hardware)}
    assert set(parts) == set(hardware)
    v100 = parts["v100"]
    # device_memory_gib is GiB, the planner's memory MiB, less the headroom the measured peak
    # does not see (memory_headroom_gib, 1 GiB on a GPU entry that states none)
    assert v100.device_memory_mb == (32 - 1) * 1024 and not v100.headroom_stated
    stated = partitions_from_hardware({"v100": {**hardware["v100"], "memory_headroom_gib": 0}})
    assert stated[0].device_memory_mb == 32 * 1024
    assert v100.node_power_w == 1600 and v100.node_hour_cost == 1.0
    # nodes_available unset: every node the entry may use (max_nodes)
    assert "nodes_available" not in hardware["v100"] or hardware["v100"]["nodes_available"] is None
    assert v100.nodes_available == hardware["v100"]["max_nodes"] == 16
    cpu = parts["cpu"]  # no memory, power or cost given: not checked, no energy, cost 1
    assert cpu.device_memory_mb is None and cpu.node_power_w is None
    assert cpu.nodes_available == 2 and cpu.node_hour_cost == 1.0
    # a site that shares its nodes says how many the plan may take
    fewer = partitions_from_hardware({"v100": {**hardware["v100"], "nodes_available": 3}})
    assert fewer[0].nodes_available == 3


def test_the_rapl_reader_counts_across_a_wrap_of_its_counter(tmp_path, monkeypatch):
    """RAPL's energy_uj wraps at max_energy_range_uj: a window that starts 1,000 uJ before the
    wrap and ends 500 uJ after it used 1,500 uJ (sysfs files laid out as the kernel's)."""
    from dlscale.rank import energy

    packages = {"intel-rapl:0": (999_000, 500), "intel-rapl:1": (10_000, 30_000)}
    for name, (start, _) in packages.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "energy_uj").write_text(f"{start}\n")
        (tmp_path / name / "max_energy_range_uj").write_text("1000000\n")
    (tmp_path / "intel-rapl:0:0").mkdir()  # a sub-domain (core): counted in its package
    monkeypatch.setattr(energy, "RAPL_GLOB", str(tmp_path / "intel-rapl:[0-9]"))
    rapl = energy._Rapl()
    assert [Path(p).name for p, _ in rapl.domains] == ["intel-rapl:0", "intel-rapl:1"]
    rapl.start()
    for name, (_, end) in packages.items():
        (tmp_path / name / "energy_uj").write_text(f"{end}\n")
    assert rapl.stop() == pytest.approx((1_500 + 20_000) / 1e6)


def test_plan_default_samples_gives_every_model_its_job():
    from dlscale.decisions.plan_options import DEFAULT_SAMPLES, jobs_from_config

    schema = load_schema(ROOT / "config/schemas/config.schema.json")
    plan = {}
    default = jobs_from_config(plan, ["cnn_small", "gpt2_tiny"])
    assert [(j["name"], j["model"], j["samples"]) for j in default] == [
        ("cnn_small", "cnn_small", DEFAULT_SAMPLES),
        ("gpt2_tiny", "gpt2_tiny", DEFAULT_SAMPLES),
    ]
    props = schema["properties"]["plan"]["properties"]
    assert props["default_samples"]["default"] == DEFAULT_SAMPLES  # the schema says the same
    asked = jobs_from_config({"default_samples": 2.5e7}, ["cnn_small"])
    assert asked[0]["samples"] == 2.5e7
    # jobs of their own: default_samples does not apply
    own = jobs_from_config(
        {"default_samples": 5, "jobs": [{"name": "j", "model": "cnn_small", "samples": 9}]},
        ["cnn_small", "gpt2_tiny"],
    )
    assert [(j["name"], j["samples"]) for j in own] == [("j", 9)]

"""GPU first contact without a GPU: the device a rank picks under every binding, the
physical board it records, the energy meter's NVML lookups and errors (a fake NVML: no GPU
here), tolerant nvidia-smi parsing, the launcher's GPU options and rendezvous ports, and the
hardware keys that say where a GPU cell queues."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest

from dlscale.rank.devices import (
    DeviceChoiceError,
    gpu_identity,
    nvml_handle,
    pick_gpu,
    visible_count,
    visible_devices,
)
from dlscale.rank.energy import EnergyMeter
from dlscale.rank.provenance import parse_gpu_activity
from dlscale.run.launchers.ports import PORT_BLOCK, ephemeral_range, port_block
from dlscale.run.launchers.srun import choose_slurm_port, gpu_step_options
from dlscale.store.metrics_summary import shared_gpus
from dlscale.study.cell import Cell
from dlscale.study.config import ConfigError, load_schema
from dlscale.study.hardware import validate_hardware
from dlscale.study.hashes import hashed_hardware
from dlscale.study.resources import class_resources

from helpers.cells import small_cell

# ----------------------------------------------------------------------------- picking a device
# (local rank, ranks on the node, GPUs the rank sees, environment) -> expected ordinal
BINDINGS = {
    "all of the node's GPUs (no CUDA_VISIBLE_DEVICES)": (3, 4, 4, {}, 3),
    "all of the node's GPUs (srun --gpus-per-node=4)": (
        2,
        4,
        4,
        {"CUDA_VISIBLE_DEVICES": "0,1,2,3", "SLURM_STEP_GPUS": "0,1,2,3"},
        2,
    ),
    "per-task binding (--gpus-per-task=1), second rank": (
        1,
        4,
        1,
        {"CUDA_VISIBLE_DEVICES": "1", "SLURM_STEP_GPUS": "1"},
        0,
    ),
    "per-task binding renumbered in a cgroup": (3, 4, 1, {"CUDA_VISIBLE_DEVICES": "0"}, 0),
    "per-task binding by UUID": (1, 2, 1, {"CUDA_VISIBLE_DEVICES": "GPU-aaaa"}, 0),
    "one rank, one GPU": (0, 1, 1, {"CUDA_VISIBLE_DEVICES": "0"}, 0),
    "more GPUs visible than ranks": (1, 2, 8, {}, 1),
}


@pytest.mark.parametrize("case", sorted(BINDINGS))
def test_pick_gpu_under_every_binding(case):
    local_rank, local_world, count, env, expected = BINDINGS[case]
    assert pick_gpu(local_rank, local_world, count, env) == expected


def test_pick_gpu_refuses_a_partial_view_naming_the_binding_and_the_fix():
    env = {"CUDA_VISIBLE_DEVICES": "0,1", "SLURM_STEP_GPUS": "0,1", "SLURM_LOCALID": "3"}
    with pytest.raises(DeviceChoiceError) as err:
        pick_gpu(3, 4, 2, env)
    text = str(err.value)
    for needed in ("CUDA_VISIBLE_DEVICES='0,1'", "SLURM_STEP_GPUS", "gpu_binding: task"):
        assert needed in text, text
    with pytest.raises(DeviceChoiceError, match="no GPU is visible"):
        pick_gpu(0, 2, 0, {"CUDA_VISIBLE_DEVICES": ""})


def test_visible_devices_and_count():
    assert visible_devices({}) is None
    assert visible_devices({"CUDA_VISIBLE_DEVICES": "0, 2"}) == ["0", "2"]
    assert visible_devices({"CUDA_VISIBLE_DEVICES": "-1"}) == []
    assert visible_count({"CUDA_VISIBLE_DEVICES": "GPU-a,GPU-b"}) == 2
    assert visible_count({"SLURM_GPUS_ON_NODE": "4"}) == 4
    assert visible_count({}) is None


# ----------------------------------------------------------------------------- the physical board
def test_gpu_identity_prefers_uuid_then_pci_then_gres_index():
    env = {"CUDA_VISIBLE_DEVICES": "2,3", "SLURM_STEP_GPUS": "2,3"}
    plain = gpu_identity(1, env)
    assert (plain["gres_index"], plain["key"], plain["visible_entry"]) == (3, "gres:3", "3")
    # renumbered from 0 inside a cgroup: Slurm's list gives the board
    renumbered = gpu_identity(0, {"CUDA_VISIBLE_DEVICES": "0", "SLURM_STEP_GPUS": "5"})
    assert renumbered["gres_index"] == 5 and renumbered["key"] == "gres:5"
    pci = gpu_identity(1, env, pci_bus_id="00000000:3B:00.0")
    assert pci["key"] == "00000000:3B:00.0" and pci["key_source"] == "pci_bus_id"
    # torch's uuid has no prefix; NVML's lookup wants "GPU-..."
    uuid = gpu_identity(1, env, uuid="1234-abcd", pci_bus_id="00000000:3B:00.0")
    assert uuid["uuid"] == "GPU-1234-abcd" and uuid["key"] == "GPU-1234-abcd"
    by_env = gpu_identity(0, {"CUDA_VISIBLE_DEVICES": "GPU-77"})
    assert by_env["uuid"] == "GPU-77"
    assert gpu_identity(1, {})["key"] == "ordinal:1"


def test_two_ranks_on_one_board_are_flagged_per_node():
    one = {"CUDA_VISIBLE_DEVICES": "0", "SLURM_STEP_GPUS": "0"}
    ranks = [
        {"rank": 0, "node": "n1", "gpu": gpu_identity(pick_gpu(0, 2, 1, one), one)},
        {"rank": 1, "node": "n1", "gpu": gpu_identity(pick_gpu(1, 2, 1, one), one)},
        {"rank": 2, "node": "n2", "gpu": gpu_identity(0, one)},  # the same index, another node
        {"rank": 3, "node": "n2", "gpu": None},  # a CPU rank
    ]
    assert shared_gpus(ranks) == [{"node": "n1", "gpu": "gres:0", "ranks": [0, 1]}]
    ranks[1]["gpu"] = gpu_identity(0, {"CUDA_VISIBLE_DEVICES": "1", "SLURM_STEP_GPUS": "1"})
    assert shared_gpus(ranks) == []


# ----------------------------------------------------------------------------- NVML (faked)
class NVMLError(Exception):
    pass


def fake_nvml(*, counter=True, power_fails_after=None, energy_mj=(1_000_000, 1_250_000)):
    # energy_mj: successive counter readings (the meter's probe, the window's start, its end)
    """A stand-in for nvidia-ml-py's pynvml: NVML needs a GPU, which this machine lacks. It
    records how each board was looked up."""
    state = {"lookups": [], "power_reads": 0, "energy": list(energy_mj)}
    nvml = types.SimpleNamespace(NVMLError=NVMLError, state=state)
    nvml.nvmlInit = lambda: None

    def by(kind):
        def lookup(value):
            state["lookups"].append((kind, value))
            return f"{kind}:{value}"

        return lookup

    nvml.nvmlDeviceGetHandleByUUID = by("uuid")
    nvml.nvmlDeviceGetHandleByPciBusId = by("pci")
    nvml.nvmlDeviceGetHandleByIndex = by("index")

    def energy(handle):
        if not counter:
            raise NVMLError("Not Supported")
        return state["energy"].pop(0) if len(state["energy"]) > 1 else state["energy"][0]

    def power(handle):
        state["power_reads"] += 1
        if power_fails_after is not None and state["power_reads"] > power_fails_after:
            raise NVMLError("GPU is lost")
        return 300_000  # mW

    nvml.nvmlDeviceGetTotalEnergyConsumption = energy
    nvml.nvmlDeviceGetPowerUsage = power
    return nvml


@pytest.fixture
def nvml(monkeypatch):
    def install(**kw):
        module = fake_nvml(**kw)
        monkeypatch.setitem(sys.modules, "pynvml", module)
        return module

    return install


def test_nvml_handle_by_uuid_then_pci_never_by_cuda_index(monkeypatch):
    n = fake_nvml()
    assert nvml_handle(n, {"uuid": "GPU-9", "pci_bus_id": "x", "ordinal": 0})[1] == "uuid"
    assert nvml_handle(n, {"uuid": None, "pci_bus_id": "00:3B", "ordinal": 0})[1] == "pci bus id"
    renumbered = {"uuid": None, "pci_bus_id": None, "ordinal": 0, "visible_devices": "3"}
    with pytest.raises(DeviceChoiceError, match="cannot tell which NVML device"):
        nvml_handle(n, renumbered)
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    whole_node = {"uuid": None, "pci_bus_id": None, "ordinal": 2, "visible_devices": None}
    assert nvml_handle(n, whole_node) == ("index:2", "index (PCI order)")


def test_energy_from_the_boards_counter(nvml):
    n = nvml(counter=True, energy_mj=(990_000, 1_000_000, 1_250_000))
    meter = EnergyMeter("cuda", gpu_identity(0, {}, uuid="abc"))
    meter.start()
    out = meter.stop(samples=100)
    assert out["available"] and out["joules"] == pytest.approx(250.0), out
    assert "counter" in out["source"] and "uuid" in out["source"]
    assert out["short_window"] is None  # the counter is not averaged
    assert n.state["lookups"] == [("uuid", "GPU-abc")]
    # a counter that did not advance is no reading of 0 J
    nvml(counter=True, energy_mj=(5, 5, 5))
    stuck = EnergyMeter("cuda", gpu_identity(0, {}, uuid="abc"))
    stuck.start()
    out = stuck.stop(samples=1)
    assert not out["available"] and "did not advance" in out["reason"], out


def test_energy_sampled_without_a_counter_covers_a_short_window(nvml):
    nvml(counter=False)
    meter = EnergyMeter("cuda", gpu_identity(0, {}, pci_bus_id="00000000:3B:00.0"))
    meter.start()
    out = meter.stop(samples=10)  # a window far shorter than one sampling interval
    assert out["available"] and out["joules"] > 0, out
    assert "sampled" in out["source"]
    assert "shorter than the board's power averaging (about 1 s)" in out["short_window"]


def test_energy_reading_that_fails_is_unavailable_never_zero(nvml):
    import time

    nvml(counter=False, power_fails_after=1)
    meter = EnergyMeter("cuda", gpu_identity(0, {}, uuid="abc"))
    meter.start()
    time.sleep(0.15)  # the sampling thread's first read fails
    out = meter.stop(samples=10)
    assert out == {"available": False, "reason": out["reason"]} and "GPU is lost" in out["reason"]


def test_energy_without_nvml_or_without_a_board_says_why(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # not installed
    meter = EnergyMeter("cuda", gpu_identity(0, {}, uuid="abc"))
    meter.start()
    out = meter.stop(samples=1)
    assert not out["available"] and "NVML unavailable" in out["reason"]
    no_gpu = EnergyMeter("cuda", None)
    no_gpu.start()
    assert "no GPU" in no_gpu.stop(samples=1)["reason"]


# ----------------------------------------------------------------------------- nvidia-smi output
def test_gpu_activity_tolerates_na_and_mig_output():
    text = (
        "0, GPU-aaa, 87, 30000\n"
        "1, GPU-bbb, [N/A], [N/A]\n"  # MIG mode: utilisation not reported
        "2, GPU-ccc, [Not Supported], 512\n"
    )
    gpus = parse_gpu_activity(text)
    assert gpus[0]["utilization_pct"] == 87.0 and "unavailable" not in gpus[0]
    assert gpus[1]["utilization_pct"] is None and gpus[1]["memory_used_mb"] is None
    assert "[N/A]" in gpus[1]["unavailable"]
    assert gpus[2]["memory_used_mb"] == 512.0 and "utilization.gpu" in gpus[2]["unavailable"]


# ----------------------------------------------------------------------------- the launcher
def _cell(**changes) -> Cell:
    """A 2-node cell of ResNet-50 on 4 H100s per node over srun (tests/helpers/cells.py)."""
    fields = dict(
        hardware="h100",
        model="resnet50",
        precision="bf16",
        device="cuda",
        ranks_per_node=4,
        per_rank_batch=32,
        global_batch=256,
        cpus_per_rank=8,
        warmup_steps=5,
        steps=10,
        learning_rate=0.1,
        launcher="srun",
        hardware_hash="x",
        environment="pytorch-cuda:x",
        study="s",
        gpu_binding="node",
    )
    return small_cell(**{**fields, **changes})


def test_launcher_states_the_gpu_binding():
    assert gpu_step_options(_cell()) == ["--gpus-per-node=4"]
    assert gpu_step_options(_cell(gpu_binding="task")) == [
        "--gpus-per-task=1",
        "--gpu-bind=per_task:1",  # what --gpus-per-task=1 implies (Slurm >= 21.08), stated
    ]
    assert gpu_step_options(_cell(device="cpu", gpu_binding=None)) == []
    # closest and maps: tests/unit/rank/test_gpu_binding_forms.py


def test_rendezvous_ports_below_the_ephemeral_range_per_job():
    ephemeral = (32768, 60999)
    ports = {port_block(j, ephemeral) for j in range(1000, 1352)}
    assert len(ports) == 352  # 352 consecutive jobs, 352 distinct blocks
    assert all(10000 <= p and p + PORT_BLOCK <= 32768 for p in ports)
    # a narrow kernel range still yields ports outside it
    assert port_block(7, (10020, 60999)) + PORT_BLOCK <= 10020


def test_a_taken_port_moves_to_the_next_block_then_fails_clearly():
    env = {"SLURM_JOB_ID": "4242"}
    own, next_block = (port_block(seed, ephemeral_range()) for seed in (4242, 4243))
    assert choose_slurm_port(env, is_free=lambda p: p != own) == next_block
    with pytest.raises(RuntimeError, match="all in use.*4242"):
        choose_slurm_port(env, is_free=lambda p: False)
    # the ports of the ranks beside rank 0 count too (TensorFlow: base + 1 + rank): with two
    # ranks on the first node base + 3 is theirs, with one it is not
    assert choose_slurm_port(env, 2, is_free=lambda p: p != own + 3) == next_block
    assert choose_slurm_port(env, 1, is_free=lambda p: p != own + 3) == own


# ----------------------------------------------------------------------------- hardware keys
SCHEMA = Path(__file__).resolve().parents[3] / "config" / "schemas" / "hardware.schema.json"


def _hardware(**entry):
    return {"g": {"device": "cuda", "gpus_per_node": 4, **entry}}


def test_hardware_refuses_a_cpu_environment_on_gpus_and_gpu_binding_on_cpus():
    schema = load_schema(SCHEMA)
    with pytest.raises(ConfigError, match="g.environment_variant: 'cpu' on a device 'cuda'"):
        validate_hardware(_hardware(environment_variant="cpu"), schema)
    with pytest.raises(ConfigError, match="c.gpu_binding: only for device 'cuda'"):
        validate_hardware({"c": {"device": "cpu", "gpu_binding": "task"}}, schema)
    with pytest.raises(ConfigError, match="gpu_binding"):
        validate_hardware(_hardware(gpu_binding="socket"), schema)
    with pytest.raises(ConfigError, match="account"):
        validate_hardware(_hardware(account="a b; rm -rf /"), schema)


def test_account_qos_reservation_reach_the_job_and_no_hash():
    schema = load_schema(SCHEMA)
    plain = validate_hardware(_hardware(), schema)["g"]
    site = validate_hardware(
        _hardware(account="proj42", qos="long", reservation="maint_free"), schema
    )["g"]
    assert hashed_hardware(plain) == hashed_hardware(site)
    _, res = class_resources({"ranks_per_node": 1}, site, 2)
    assert res["slurm_account"] == "proj42" and res["qos"] == "long"
    assert "--reservation=maint_free" in res["slurm_extra"]
    _, res = class_resources({"ranks_per_node": 1}, plain, 2)
    assert (
        "slurm_account" not in res and "qos" not in res and "reservation" not in res["slurm_extra"]
    )
    # task binding is a different measurement (peer access), so it is hashed
    task = validate_hardware(_hardware(gpu_binding="task"), schema)["g"]
    assert hashed_hardware(task) != hashed_hardware(plain)


def test_a_short_sampled_window_is_flagged_in_the_cell_summary():
    from dlscale.store.metrics_summary import _energy_summary

    note = "the window (0.5 s) is shorter than the board's power averaging (about 1 s)"
    end = {"throughput_samples_per_s": 100.0, "seconds_total": 0.5}
    ends = {
        0: {**end, "energy": {"available": True, "source": "nvml", "joules": 10.0}},
        1: {
            **end,
            "energy": {"available": True, "source": "nvml", "joules": 10.0, "short_window": note},
        },
    }
    out = _energy_summary(ends, {0: {"node": "n1"}, 1: {"node": "n1"}})
    assert out == {
        "joules_per_sample": pytest.approx(20.0 / 100),
        "energy_unavailable": None,
        "energy_short_window": note,
    }

"""Telemetry per rank during the timed window: the CPU side sampled for real
on this machine, the GPU side through a fake NVML (no GPU here: NVML needs one), a real rank
launched through the launcher, the per-cell columns and straggler detail, the figure and the
report's sentences."""

from __future__ import annotations

import json
import sys
import time
import types

import pandas as pd
import pytest

from dlscale.analysis.collect import cell_rows, cell_telemetry, straggler_detail
from dlscale.outputs.figure_layout import FAMILIES, figure_layout
from dlscale.outputs.plotting import plot_figure
from dlscale.outputs.report_macros import straggler_note, telemetry_note
from dlscale.rank.devices import gpu_identity
from dlscale.rank.telemetry import GPU_QUANTITIES, TELEMETRY_INTERVAL_S, Telemetry, summarize

from helpers.cells import cell_dict, launch_cell


def burn(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def test_a_cpu_rank_samples_its_process():
    def window(work) -> dict:
        telemetry = Telemetry("cpu")
        telemetry.start()
        work(4 * TELEMETRY_INTERVAL_S)
        return telemetry.stop()

    idle, busy = window(time.sleep), window(burn)
    q = busy["quantities"]
    assert busy["samples"] >= 2 and busy["unavailable"] == {}
    assert set(q) == {"cpu_util_pct", "rss_mb"}  # no GPU quantity on a CPU rank
    # busy: this thread used the CPU; idle: it slept (relative: the shared machine's load
    # lowers both)
    assert q["cpu_util_pct"]["mean"] > idle["quantities"]["cpu_util_pct"]["mean"] + 10
    assert 0 < q["rss_mb"]["min"] <= q["rss_mb"]["max"]
    assert q["cpu_util_pct"]["n"] == busy["samples"]


class NVMLError(Exception):
    pass


def fake_nvml(fails: dict | None = None):
    """A stand-in for nvidia-ml-py's pynvml that knows one board by UUID (its index lookup
    fails: the meter must not use it); `fails`: NVML function name -> error message."""
    fails = fails or {}
    nvml = types.SimpleNamespace(NVMLError=NVMLError, NVML_CLOCK_SM=1, NVML_TEMPERATURE_GPU=0)
    nvml.nvmlInit = lambda: None

    def by_uuid(uuid):
        assert uuid == "GPU-abc"
        return "board"

    def by_index(i):
        raise AssertionError("looked up by NVML index")

    def answer(name, value):
        def read(handle, *args):
            assert handle == "board"
            if name in fails:
                raise NVMLError(fails[name])
            return value

        return read

    nvml.nvmlDeviceGetHandleByUUID = by_uuid
    nvml.nvmlDeviceGetHandleByIndex = by_index
    nvml.nvmlDeviceGetUtilizationRates = answer("util", types.SimpleNamespace(gpu=87, memory=40))
    nvml.nvmlDeviceGetClockInfo = answer("clock", 1755)
    nvml.nvmlDeviceGetMemoryInfo = answer("memory", types.SimpleNamespace(used=31_000_000_000))
    nvml.nvmlDeviceGetTemperature = answer("temperature", 61)
    nvml.nvmlDeviceGetPowerUsage = answer("power", 412_000)  # mW
    return nvml


def test_a_gpu_rank_samples_its_own_board():
    gpu = gpu_identity(0, {"CUDA_VISIBLE_DEVICES": "GPU-abc"})
    telemetry = Telemetry("cuda", gpu, nvml=fake_nvml())
    telemetry.start()
    time.sleep(2.5 * TELEMETRY_INTERVAL_S)
    record = telemetry.stop()
    q = record["quantities"]
    assert record["unavailable"] == {}
    assert q["gpu_util_pct"]["mean"] == 87 and q["sm_clock_mhz"]["max"] == 1755
    assert q["gpu_memory_used_mb"]["mean"] == pytest.approx(31_000)
    assert q["gpu_temperature_c"]["min"] == 61 and q["gpu_power_w"]["mean"] == pytest.approx(412)
    assert {"cpu_util_pct", "rss_mb"} <= set(q)  # the host side too


def test_a_quantity_the_board_does_not_report_is_unavailable_with_the_reason():
    gpu = gpu_identity(0, {"CUDA_VISIBLE_DEVICES": "GPU-abc"})
    nvml = fake_nvml({"power": "Not Supported", "util": "Not Supported"})  # as on a MIG slice
    telemetry = Telemetry("cuda", gpu, nvml=nvml)
    telemetry.start()
    record = telemetry.stop()
    assert record["unavailable"] == {
        "gpu_power_w": "NVML: Not Supported",
        "gpu_util_pct": "NVML: Not Supported",
    }
    assert {"sm_clock_mhz", "gpu_temperature_c", "gpu_memory_used_mb"} <= set(record["quantities"])


def test_without_nvml_the_gpu_side_is_unavailable_and_the_host_side_kept(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # nvidia-ml-py not installed
    telemetry = Telemetry("cuda", gpu_identity(0, {}, uuid="abc"))
    telemetry.start()
    record = telemetry.stop()
    assert set(record["unavailable"]) == set(GPU_QUANTITIES)
    assert all("NVML unavailable" in why for why in record["unavailable"].values())
    assert set(record["quantities"]) == {"cpu_util_pct", "rss_mb"}


# --------------------------------------------------------------- a real rank and its columns
def test_a_real_rank_records_its_telemetry(tmp_path):
    code, out = launch_cell(tmp_path, cell_dict(nodes=1, steps=3))
    assert code == 0
    records = [json.loads(line) for line in out.read_text().splitlines()]
    end = next(r["value"] for r in records if r["event"] == "rank_end")
    telemetry = end["telemetry"]
    assert telemetry["samples"] >= 1 and telemetry["interval_s"] == TELEMETRY_INTERVAL_S
    assert telemetry["quantities"]["cpu_util_pct"]["mean"] > 0
    row, ranks = cell_rows(records, str(out), straggler_threshold=0.1)
    assert ranks[0]["cpu_util_pct"] == telemetry["quantities"]["cpu_util_pct"]["mean"]
    assert row["cpu_util_pct_mean"] == ranks[0]["cpu_util_pct"]
    assert row["gpu_util_pct_mean"] is None and row["telemetry_unavailable"] is None
    assert row["telemetry_samples_min"] == telemetry["samples"]


def rank(i, node, thr, gpu=None, **telemetry):
    return {"rank": i, "node": node, "gpu": gpu, "throughput_samples_per_s": thr, **telemetry}


def test_the_straggler_detail_names_the_node_the_board_and_its_telemetry():
    ranks = [
        rank(0, "n1", 100.0, "gres:0", gpu_util_pct=97.0, sm_clock_mhz=1980.0),
        rank(1, "n1", 99.0, "gres:1", gpu_util_pct=96.0, sm_clock_mhz=1980.0),
        rank(2, "n2", 61.2, "gres:0", gpu_util_pct=45.0, sm_clock_mhz=1410.0),
    ]
    detail = straggler_detail([ranks[2]], ranks)
    assert detail == (
        "rank 2 (n2, GPU gres:0): 61.2 samples/s vs median 99; GPU util 45 % (median 96 %), "
        "SM clock 1410 MHz (median 1980 MHz)"
    )
    assert straggler_detail([], ranks) is None
    cpu = [rank(0, "n1", 50.0, cpu_util_pct=98.0), rank(1, "n2", 20.0)]
    assert straggler_detail([cpu[1]], cpu) == (
        "rank 1 (n2): 20 samples/s vs median 35; no telemetry"
    )


def test_cell_columns_mean_over_ranks_and_extremes():
    ranks = [
        rank(0, "n1", 1.0, cpu_util_pct=90.0, rss_mb=500.0),
        rank(1, "n2", 1.0, cpu_util_pct=60.0, rss_mb=700.0),
    ]
    records = [
        {"event": "rank_end", "value": {"telemetry": summarize([{"cpu_util_pct": 90.0}])}},
        {
            "event": "rank_end",
            "value": {"telemetry": summarize([{}, {}], {"gpu_util_pct": "NVML: Not Supported"})},
        },
    ]
    row = cell_telemetry(records, ranks)
    assert row["cpu_util_pct_mean"] == 75.0
    assert (row["cpu_util_pct_rank_min"], row["cpu_util_pct_rank_max"]) == (60.0, 90.0)
    assert row["rss_mb_rank_max"] == 700.0 and row["gpu_util_pct_mean"] is None
    assert row["telemetry_samples_min"] == 1
    assert row["telemetry_unavailable"] == "gpu_util_pct: NVML: Not Supported"


# ------------------------------------------------------------------- the figure and the report
def scaling_rows(gpu: bool) -> pd.DataFrame:
    rows = []
    for nodes, util, low in ((1, 95.0, 94.0), (2, 90.0, 70.0), (4, 85.0, 40.0)):
        rows.append(
            {
                "hardware": "a100" if gpu else "cpu",
                "framework": "pytorch",
                "model": "cnn_small",
                "policy": "weak",
                "precision": "fp32",
                "mode": "eager",
                "nodes": nodes,
                "gpu_util_pct_mean_median": util if gpu else None,
                "gpu_util_pct_rank_min_median": low if gpu else None,
                "cpu_util_pct_mean_median": 99.0,
                "cpu_util_pct_rank_min_median": 98.0,
            }
        )
    return pd.DataFrame(rows)


@pytest.mark.parametrize("gpu", [False, True])
def test_the_telemetry_figure_draws_utilisation_per_node_count(tmp_path, gpu):
    import matplotlib

    hw = "a100" if gpu else "cpu"
    groups = [(hw, "pytorch", "cnn_small", "weak", "fp32")]
    (spec,) = [s for s in figure_layout(groups, 3.5) if s["family"] == "telemetry"]
    assert "telemetry" in FAMILIES and spec["file"] == f"{hw}/telemetry.pdf"
    drawn = []
    real_savefig = matplotlib.figure.Figure.savefig

    def keep(fig, *args, **kwargs):
        drawn.append(fig)
        return real_savefig(fig, *args, **kwargs)

    matplotlib.figure.Figure.savefig = keep
    try:
        out = tmp_path / "telemetry.pdf"
        info = plot_figure(scaling_rows(gpu), spec, str(out))
    finally:
        matplotlib.figure.Figure.savefig = real_savefig
    assert out.stat().st_size > 0 and info["panels"] == 1
    ax = drawn[0].axes[0]
    assert ax.get_ylabel() == (
        "GPU utilisation (%, NVML)" if gpu else "CPU utilisation (% of one core)"
    )
    mean, lowest = ax.get_lines()[:2]
    expected = [95.0, 90.0, 85.0] if gpu else [99.0, 99.0, 99.0]
    assert list(mean.get_ydata()) == expected
    assert lowest.get_linestyle() == ":"


def test_the_report_states_telemetry_and_names_slow_ranks():
    cells = pd.DataFrame(
        [
            {
                "hardware": "cpu",
                "framework": "pytorch",
                "model": "cnn_small",
                "policy": "weak",
                "precision": "fp32",
                "mode": "eager",
                "nodes": 2,
                "rep": 1,
                "straggler": True,
                "straggler_detail": "rank 1 (n2): 20 samples/s vs median 35; no telemetry",
                "cpu_util_pct_mean": 95.0,
                "cpu_util_pct_rank_min": 80.0,
                "telemetry_unavailable": None,
            },
            {
                "hardware": "cpu",
                "framework": "pytorch",
                "model": "cnn_small",
                "policy": "weak",
                "precision": "fp32",
                "mode": "eager",
                "nodes": 1,
                "rep": 1,
                "straggler": False,
                "straggler_detail": None,
                "cpu_util_pct_mean": 99.0,
                "cpu_util_pct_rank_min": 99.0,
                "telemetry_unavailable": None,
            },
        ]
    )
    note = telemetry_note(cells)
    assert note == (
        "CPU utilisation of the rank processes (% of one core): median over 2 cells 97 % "
        "(mean rank), lowest rank of any cell 80 %."
    )
    slow = straggler_note(cells)
    assert slow.startswith("Slow ranks: cpu/pytorch/cnn_small/weak/fp32/eager/n2/r1: rank 1 (n2)")
    assert telemetry_note(cells.drop(columns=["cpu_util_pct_mean"])) == (
        "No telemetry was sampled."
    )

"""The report's macros (dlscale.outputs.report): the study's design, the cells planned and
measured per workload, and the measured cells' facts (provenance, throughput, efficiency,
energy, telemetry, stragglers, how the cells ran) as dls... names, values LaTeX-escaped."""

from __future__ import annotations

import pandas as pd

from dlscale.analysis.mfu import MFU_METHOD, attention_summary, mfu_summary
from dlscale.analysis.stats import CI_INTERVAL, CI_METHOD
from dlscale.analysis.systems_table import MLPERF_FIELDS, MLPERF_NOT_COVERED
from dlscale.models.flops import FLOP_METHOD
from dlscale.outputs.latex_text import _fmt, _join, _macro_name, _opt, _range, tex_escape
from dlscale.registry.frameworks import FRAMEWORKS
from dlscale.study.cell import DEFAULT_WORKLOAD, WORKLOADS, cell_label
from dlscale.study.protocol import (
    ALLREDUCE_BYTES,
    ALLREDUCE_REPEATS,
    BREAKDOWN_STEPS,
    COMPETING_BUSY_CPUS,
    IDLE_PROBE_SECONDS,
    REWARM_METHOD,
    TELEMETRY_INTERVAL_S,
)


def workload_counts(status: pd.DataFrame) -> dict[str, dict[str, int]]:
    """Per workload (cell.WORKLOADS order) of status.csv (one row per planned cell): how many
    cells are planned and how many ended ok, failed and missing. The Summary and the failed and
    missing section both count from here, so they count the same cells. A status.csv from
    before workloads existed has no workload column: its cells are throughput cells."""
    if status.empty:
        return {}
    workload = status["workload"] if "workload" in status else DEFAULT_WORKLOAD
    frame = status.assign(workload=workload)
    out = {}
    for name in [w for w in WORKLOADS if w in set(frame["workload"])]:
        states = frame.loc[frame["workload"] == name, "status"]
        out[name] = {"planned": len(states)} | {
            s: int((states == s).sum()) for s in ("ok", "failed", "missing")
        }
    return out


def workload_counts_text(status: pd.DataFrame) -> str:
    """`throughput: 16 of 16; convergence: 4 of 4` (measured of planned, per workload)."""
    counts = workload_counts(status)
    return "; ".join(f"{w}: {c['ok']} of {c['planned']}" for w, c in counts.items()) or "none"


_MEASURED_KEYS = [
    "GlobalBatchStrong",
    "GitCommit",
    "ConfigHash",
    "Libraries",
    "Python",
    "DeviceModel",
    "Launcher",
    "Hosts",
    "ThroughputMax",
    "MaxNodes",
    "EfficiencyAtMaxNodesMin",
    "EfficiencyAtMaxNodesMax",
    "CellsCompeting",
    "CellsStraggler",
    "StragglerDetail",
    "TelemetryNote",
    "SharedGpuNote",
    "EnergyNote",
    "CompileNote",
    "Timer",
    "Rewarm",
    "HostSync",
    "Modes",
    "FastPaths",
    "RepsMin",
    "RepsMax",
    "Reps",
    "CompetingSummary",
    "EnergySource",
    "GpuBoardNote",
    "EarlierMeasurements",
    "ProbeSecondsMax",
]


def _study_macros(
    config: dict,
    status: pd.DataFrame,
    cells: pd.DataFrame,
    quarantine: pd.DataFrame,
    n_planned: int,
) -> dict:
    """The study's design and the cell counts (every report has them)."""
    axes = config["axes"]
    if "script" in config.get("workloads", ()):  # a study's scripts and their models too
        from dlscale.study.workloads import workload_axes

        measured = workload_axes(
            {**config, "workloads": [w for w in config["workloads"] if w != "convergence"]}
        )
        axes = {
            k: list(dict.fromkeys(v for a in measured.values() for v in a.get(k) or ()))
            for k in ("framework", "model", "hardware", "nodes", "policy", "precision")
        }
    return {
        "Study": config["study"],
        "CellsPlanned": n_planned,
        # every workload's measured cells, as the failed and missing section counts them
        "CellsMeasured": int((status["status"] == "ok").sum()) if not status.empty else 0,
        "CellsByWorkload": workload_counts_text(status),
        "ThroughputCellsMeasured": len(cells),  # cells.csv: the measured throughput cells
        "CellsCsvRows": len(cells),
        "CellsCsvColumns": len(cells.columns),
        # model FLOPs utilisation at the largest node count, or "unknown peak"
        # (dlscale.analysis.mfu)
        "MfuSummary": mfu_summary(cells),
        # the attention kernels that ran and the cells' profiler traces (dlscale.analysis.mfu)
        "AttentionSummary": attention_summary(cells),
        "MfuMethod": MFU_METHOD,
        "FlopMethod": FLOP_METHOD,
        "CellsQuarantined": len(quarantine),
        "CellsFailed": int((status["status"] == "failed").sum()) if not status.empty else 0,
        "CellsMissing": int((status["status"] == "missing").sum()) if not status.empty else 0,
        "Repetitions": config["repetitions"],
        "WarmupSteps": config["warmup_steps"],
        "TimedSteps": config["steps"],
        "PerRankBatch": config["per_rank_batch"],
        "Frameworks": _join(axes["framework"]),
        "Models": _join(axes["model"]),
        "Hardware": _join(axes["hardware"]),
        "NodeCounts": _join(axes["nodes"]),
        "Policies": _join(axes["policy"]),
        "Precisions": _join(axes["precision"]),
        "RanksPerNode": config["ranks_per_node"],
        "IdleProbeSeconds": IDLE_PROBE_SECONDS,
        "CIMethod": CI_METHOD,
        "CIInterval": CI_INTERVAL,
        "StragglerThreshold": f"{config['straggler_threshold']:.0%}",
        "BreakdownSteps": BREAKDOWN_STEPS,
        "AllreduceSizes": " and ".join(f"{b >> 20}" for b in ALLREDUCE_BYTES),
        "AllreduceRepeats": ALLREDUCE_REPEATS,
        "CompetingBusyCpus": COMPETING_BUSY_CPUS,
        "TelemetryInterval": TELEMETRY_INTERVAL_S,
        "MlperfCovered": _join(
            sorted({f.strip() for v in MLPERF_FIELDS.values() for f in v.split(",")})
        ),
        "MlperfNotCovered": _join(MLPERF_NOT_COVERED),
    }


def _measured_macros(cells: pd.DataFrame, scaling: pd.DataFrame) -> dict:
    """The facts and numbers of the measured cells (cells.csv not empty)."""
    m = {}
    strong = cells[cells["policy"] == "strong"]
    m["GlobalBatchStrong"] = (
        _join(sorted(strong["global_batch"].unique())) if not strong.empty else "n/a"
    )
    m["GitCommit"] = _join(sorted(cells["git_commit"].fillna("unknown").unique()))
    hashes = cells["config_hash"].nunique()
    m["ConfigHash"] = (
        f"configuration hashes: {hashes} distinct, one per cell setting"
        if hashes > 1
        else f"configuration hash {cells['config_hash'].iloc[0]}"
    )
    earlier = cells["earlier_measurements"].fillna(0).astype(int)
    m["EarlierMeasurements"] = (
        "No cell has an earlier measurement"
        if not earlier.any()
        else f"{int(earlier.sum())} earlier measurement(s) of {int((earlier > 0).sum())} "
        "re-measured cell(s) are kept in their cells' measurements/ folders and not used here"
    )
    m["Libraries"] = _join(sorted(cells["libraries"].unique()))
    m["Python"] = _join(sorted(cells["python"].unique()))
    m["DeviceModel"] = _join(sorted(cells["device_model"].unique()))
    m["Launcher"] = _join(sorted(cells["launcher"].unique()))
    m["Hosts"] = _join(sorted({h for hs in cells["hosts"] for h in hs.split()}))
    m["ThroughputMax"] = _fmt(cells["throughput_samples_per_s"].max())
    top = scaling[scaling["nodes"] == scaling["nodes"].max()]
    m["MaxNodes"] = int(scaling["nodes"].max())
    m["EfficiencyAtMaxNodesMin"] = _fmt(top["scaling_efficiency_median"].min())
    m["EfficiencyAtMaxNodesMax"] = _fmt(top["scaling_efficiency_median"].max())
    m["CellsCompeting"] = int(cells["competing"].sum())
    m["CompetingSummary"] = competing_summary(cells)
    gpu = uses_gpu(cells)
    m["EnergySource"] = (
        "on NVIDIA GPUs the difference of NVML's energy counter of the rank's own board, or its "
        "power sampled where the board has no counter; RAPL counters on CPUs"
        if gpu
        else "RAPL counters of the CPU packages: every cell ran on CPUs"
    )
    m["GpuBoardNote"] = (
        "Each rank records the GPU board it used (UUID, PCI bus id or Slurm's GRES index); "
        "its telemetry samples that board through NVML (utilisation, SM clock, memory, "
        "temperature, power) as well."
        if gpu
        else "Every cell ran on CPUs: no GPU board was used or sampled."
    )
    shared = cells.get("shared_gpu_ranks", pd.Series(dtype=str)).fillna("").astype(str)
    m["SharedGpuNote"] = (
        f"In {int((shared != '').sum())} cell(s) two or more ranks of a node used one GPU "
        "(a binding that gives ranks no GPU of their own; cells.csv shared_gpu_ranks)."
        if (shared != "").any()
        else "No two ranks of a node used the same GPU."
        if gpu
        else ""
    )
    m["CellsStraggler"] = int(cells["straggler"].sum())
    m["StragglerDetail"] = straggler_note(cells)
    m["TelemetryNote"] = telemetry_note(cells)
    energy = cells["joules_per_sample"].dropna()
    m.update(execution_notes(cells))
    short = int(cells["energy_short_window"].notna().sum()) if "energy_short_window" in cells else 0
    m["EnergyNote"] = (
        f"measured for {len(energy)} of {len(cells)} cells "
        f"(median {_fmt(energy.median())} J/sample)"
        + (
            f"; in {short} of them power was sampled over a window shorter than the "
            "board's power averaging (about 1 s), so their energy lags "
            "(cells.csv energy_short_window)"
            if short
            else ""
        )
        if len(energy)
        else "not available: " + "; ".join(sorted(cells["energy_unavailable"].dropna().unique()))
    )
    probe = cells["probe_seconds_max"].dropna() if "probe_seconds_max" in cells else []
    m["ProbeSecondsMax"] = _fmt(probe.max()) if len(probe) else "n/a"
    m["RepsMin"] = int(scaling["n"].min())
    m["RepsMax"] = int(scaling["n"].max())
    m["Reps"] = "n = " + _range(m["RepsMin"], m["RepsMax"])
    return m


def build_macros(
    config: dict,
    cells: pd.DataFrame,
    scaling: pd.DataFrame,
    quarantine: pd.DataFrame,
    status: pd.DataFrame,
    n_planned: int,
) -> dict[str, str]:
    m = _study_macros(config, status, cells, quarantine, n_planned)
    m.update({k: "n/a" for k in _MEASURED_KEYS})  # a report with no measured cell still builds
    if not cells.empty:
        m.update(_measured_macros(cells, scaling))
    return {_macro_name(k): tex_escape(v) for k, v in m.items()}


def uses_gpu(cells: pd.DataFrame) -> bool:
    """Whether any measured cell ran on a GPU (cells.csv `device`). A table without the column
    cannot say: True, so the report keeps its statements for both kinds of hardware."""
    if "device" in cells:
        return bool((cells["device"].fillna("cpu").astype(str) != "cpu").any())
    return True


def competing_summary(cells: pd.DataFrame) -> str:
    """The Summary's word on competition: how many throughput cells ran while other processes
    kept the host busy (the idle probe), and how many ran beside other cells of their pack
    (config pack), or nothing where none did."""
    n = int(cells["competing"].fillna(False).astype(bool).sum())
    text = (
        f"{n} of {len(cells)} throughput cells were measured while other processes kept their "
        "host's CPUs busy (the idle probe; marked in the cell table): their throughput and "
        "efficiency may understate what the hardware does alone."
        if n
        else ""
    )
    beside = (
        int((cells["ran_beside"].fillna("").astype(str) != "").sum())
        if "ran_beside" in cells
        else 0
    )
    if beside:
        text += (
            f"{' ' if text else ''}{beside} of {len(cells)} throughput cells ran beside other "
            "cells of their pack, on other nodes of one allocation (cells.csv ran_beside): a "
            "shared switch or file system may have perturbed them (config pack_steps: serial "
            "measures one cell at a time)."
        )
    return text


STRAGGLERS_NAMED = 3  # straggler cells the report details; cells.csv has every one


def straggler_note(cells: pd.DataFrame) -> str:
    """The slow ranks of the first straggler cells with their node, GPU and telemetry
    (cells.csv straggler_detail, dlscale.analysis.collect.straggler_detail)."""
    slow = cells[cells["straggler"].fillna(False).astype(bool)]
    if slow.empty or "straggler_detail" not in slow:
        return ""
    shown = [
        f"{cell_label(row)}: {row['straggler_detail']}"
        for _, row in slow.head(STRAGGLERS_NAMED).iterrows()
    ]
    more = len(slow) - len(shown)
    return (
        "Slow ranks: "
        + "; ".join(shown)
        + (f"; and {more} more cell(s) (cells.csv straggler_detail)" if more > 0 else "")
        + "."
    )


def telemetry_note(cells: pd.DataFrame) -> str:
    """What the ranks' devices did during the timed window (dlscale.rank.telemetry): the median
    over cells of the mean rank's utilisation and the lowest rank's, where sampled."""
    parts = []
    for quantity, what in (
        ("gpu_util_pct", "GPU utilisation (NVML, each rank's own board)"),
        ("cpu_util_pct", "CPU utilisation of the rank processes (% of one core)"),
    ):
        if f"{quantity}_mean" not in cells:
            continue  # tables written before telemetry
        mean = pd.to_numeric(cells[f"{quantity}_mean"], errors="coerce")
        if mean.dropna().empty:
            continue
        lowest = pd.to_numeric(cells[f"{quantity}_rank_min"], errors="coerce").dropna()
        parts.append(
            f"{what}: median over {int(mean.notna().sum())} cells {mean.median():.0f} % "
            f"(mean rank), lowest rank of any cell {lowest.min():.0f} %"
        )
    missing = cells["telemetry_unavailable"] if "telemetry_unavailable" in cells else None
    reasons = sorted(missing.dropna().unique()) if missing is not None else []
    if not parts:
        return "No telemetry was sampled" + (f" ({'; '.join(reasons)})" if reasons else "") + "."
    return "; ".join(parts) + (f". Not sampled: {'; '.join(reasons)}" if reasons else "") + "."


def execution_notes(cells: pd.DataFrame) -> dict[str, str]:
    """How the measured cells ran: compile time (outside throughput), per-step timers, modes
    and the fast paths per framework (cells.csv columns compile_seconds, timer, mode,
    fast_paths)."""
    notes = {}

    def column(name: str) -> pd.Series:
        return cells[name] if name in cells else pd.Series([None] * len(cells), index=cells.index)

    compiled = cells["mode"] == "compiled"
    seconds = pd.to_numeric(column("compile_seconds"), errors="coerce")
    if compiled.any():
        c = seconds[compiled].dropna()
        notes["CompileNote"] = (
            f"in {int(compiled.sum())} compiled cell(s) a median of {_opt(c.median(), 3)} s, at "
            f"most {_opt(c.max(), 3)} s, reported per cell as compile_seconds and never in "
            "throughput"
        )
    else:
        notes["CompileNote"] = (
            f"every cell ran eagerly; first-step overhead median {_opt(seconds.median(), 3)} s, "
            "reported per cell as compile_seconds"
        )
    notes["Timer"] = "; ".join(sorted(column("timer").dropna().astype(str).unique())) or "n/a"
    notes["Rewarm"] = REWARM_METHOD

    def host_sync(fw: str) -> str:
        record = FRAMEWORKS.get(fw)
        if record is None:
            return "not stated"
        on_gpu = uses_gpu(cells[cells["framework"] == fw])
        return (
            record.host_sync_per_step
            if on_gpu
            else (record.host_sync_per_step_cpu or record.host_sync_per_step)
        )

    notes["HostSync"] = "; ".join(
        f"{fw}: {host_sync(fw)}" for fw in sorted(cells["framework"].dropna().unique())
    )
    notes["Modes"] = ", ".join(
        f"{mode} ({n} cells)" for mode, n in cells["mode"].value_counts().sort_index().items()
    )
    per_framework = (
        cells.assign(fast_paths=column("fast_paths"))
        .dropna(subset=["fast_paths"])
        .groupby("framework")["fast_paths"]
        .first()
    )
    notes["FastPaths"] = "; ".join(f"{fw}: {paths}" for fw, paths in per_framework.items()) or "n/a"
    return notes

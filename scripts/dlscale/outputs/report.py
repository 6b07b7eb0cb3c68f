"""The report: numbers reach LaTeX only as generated macros and tables, never typed by hand.

results/report/macros.tex      \\newcommand per reported number or fact (dls... names)
results/report/cells_table.tex a bounded summary of the cells (write_cell_summary); the full
                               per-cell table (results/tables/cells.csv) is attached to the PDF
results/report/report.tex      rendered from templates/report.tex.j2 (jinja2, LaTeX-safe delimiters)
results/report/report.pdf      latexmk -pdf (Debian's TeX Live)
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Mapping
from importlib import resources
from pathlib import Path

import jinja2
import numpy as np
import pandas as pd

from dlscale.analysis.mfu import FLOP_METHOD, MFU_METHOD, mfu_summary
from dlscale.analysis.stats import CI_METHOD, EXACT, GROUP, NONE, RANGE
from dlscale.analysis.systems_table import MAX_VALUES as MAX_SYSTEM_VALUES
from dlscale.analysis.systems_table import MLPERF_FIELDS, MLPERF_NOT_COVERED
from dlscale.outputs.figure_layout import MAX_PANELS, MAX_SERIES
from dlscale.outputs.tta_section import convergence_macros, write_convergence_table
from dlscale.study.cell import DEFAULT_WORKLOAD, WORKLOADS, cell_label
from dlscale.study.protocol import (
    ALLREDUCE_BYTES,
    ALLREDUCE_REPEATS,
    BREAKDOWN_STEPS,
    COMPETING_BUSY_CPUS,
    HOST_SYNC_PER_STEP,
    IDLE_PROBE_SECONDS,
    REWARM_METHOD,
    TELEMETRY_INTERVAL_S,
)

_LATEX_SPECIAL = {
    "\\": r"\textbackslash{}",
    "&": r"\&",
    "%": r"\%",
    "$": r"\$",
    "#": r"\#",
    "_": r"\_",
    "{": r"\{",
    "}": r"\}",
    "~": r"\textasciitilde{}",
    "^": r"\textasciicircum{}",
}


def tex_escape(value) -> str:
    return re.sub(r"[\\&%$#_{}~^]", lambda m: _LATEX_SPECIAL[m.group()], str(value))


def _macro_name(name: str) -> str:
    if not re.fullmatch(r"[A-Za-z]+", name):
        raise ValueError(f"LaTeX macro names are letters only: {name!r}")
    return "dls" + name


def _fmt(x: float, digits: int = 3) -> str:
    return f"{x:.{digits}g}" if abs(x) < 10**digits else f"{x:,.0f}"


def _join(values) -> str:
    return ", ".join(str(v) for v in values)


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


def build_macros(
    config: dict,
    cells: pd.DataFrame,
    scaling: pd.DataFrame,
    quarantine: pd.DataFrame,
    status: pd.DataFrame,
    n_planned: int,
) -> dict[str, str]:
    axes = config["axes"]
    m = {
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
    measured_keys = [
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
        "EarlierMeasurements",
        "ProbeSecondsMax",
    ]
    m.update({k: "n/a" for k in measured_keys})  # a report with no measured cell still builds
    if not cells.empty:
        strong = cells[cells["policy"] == "strong"]
        m["GlobalBatchStrong"] = (
            _join(sorted(strong["global_batch"].unique())) if not strong.empty else "n/a"
        )
        m["GitCommit"] = _join(sorted(cells["git_commit"].fillna("unknown").unique()))
        hashes = cells["config_hash"].nunique()
        m["ConfigHash"] = (
            f"{hashes} per-cell configuration hashes"
            if hashes > 1
            else cells["config_hash"].iloc[0]
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
        shared = cells.get("shared_gpu_ranks", pd.Series(dtype=str)).fillna("").astype(str)
        m["SharedGpuNote"] = (
            f"In {int((shared != '').sum())} cell(s) two or more ranks of a node used one GPU "
            "(a binding that gives ranks no GPU of their own; cells.csv shared_gpu_ranks)."
            if (shared != "").any()
            else "No two ranks of a node used the same GPU."
        )
        m["CellsStraggler"] = int(cells["straggler"].sum())
        m["StragglerDetail"] = straggler_note(cells)
        m["TelemetryNote"] = telemetry_note(cells)
        energy = cells["joules_per_sample"].dropna()
        m.update(execution_notes(cells))
        short = (
            int(cells["energy_short_window"].notna().sum()) if "energy_short_window" in cells else 0
        )
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
            else "not available: "
            + "; ".join(sorted(cells["energy_unavailable"].dropna().unique()))
        )
        probe = cells["probe_seconds_max"].dropna() if "probe_seconds_max" in cells else []
        m["ProbeSecondsMax"] = _fmt(probe.max()) if len(probe) else "n/a"
        m["RepsMin"] = int(scaling["n"].min())
        m["RepsMax"] = int(scaling["n"].max())
    return {_macro_name(k): tex_escape(v) for k, v in m.items()}


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
    """What the ranks' devices did during the timed window (dlscale.run.telemetry): the median
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
    notes["HostSync"] = "; ".join(
        f"{fw}: {HOST_SYNC_PER_STEP.get(fw, 'not stated')}"
        for fw in sorted(cells["framework"].dropna().unique())
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


def write_macros(macros: dict[str, str], out: str) -> None:
    lines = ["% Generated by dlscale.outputs.report.write_macros -- do not edit."]
    lines += [f"\\newcommand{{\\{k}}}{{{v}}}" for k, v in macros.items()]
    Path(out).write_text("\n".join(lines) + "\n")


# Which interval column labels a measure's interval (dlscale.analysis.stats interval kinds).
_INTERVAL_KIND = {"throughput_samples_per_s": "interval", "scaling_efficiency": "speedup_interval"}


def _ci(r, column: str) -> str:
    """median [CI low, CI high] for an order-statistic CI, median (min--max) for a range, the
    median alone where there is no interval (one repetition, or a baseline's exact 1)."""
    med = getattr(r, f"{column}_median")
    low, high = getattr(r, f"{column}_ci_low"), getattr(r, f"{column}_ci_high")
    kind = getattr(r, _INTERVAL_KIND[column])
    if pd.isna(low) or kind in (NONE, EXACT):
        return _fmt(med)
    if kind == RANGE:
        return f"{_fmt(med)} ({_fmt(low)}--{_fmt(high)})"
    return f"{_fmt(med)} [{_fmt(low)}, {_fmt(high)}]"


def _opt(value, digits: int = 2, scale: float = 1.0) -> str:
    return "--" if value is None or pd.isna(value) else _fmt(value * scale, digits)


# The cell summary: one row per group (GROUP) when that fits in about two pages, else the
# first coarser level that does; the text above the table says which.
SUMMARY_LEVELS = [
    (GROUP, "hardware, framework, model, batch policy, precision, mode and parallelism"),
    (
        ["hardware", "framework", "policy", "precision", "mode"],
        "hardware, framework, batch policy, precision and mode",
    ),
    (["hardware", "framework", "policy"], "hardware, framework and batch policy"),
    (["hardware", "framework"], "hardware and framework"),
    (["hardware"], "hardware"),
]
MAX_SUMMARY_ROWS = 100  # about two pages of \footnotesize longtable rows


# A group's measures at its largest measured node count.
_AT_TOP = [
    f"{m}_{s}"
    for m in ("throughput_samples_per_s", "scaling_efficiency")
    for s in ("median", "ci_low", "ci_high")
] + list(_INTERVAL_KIND.values())


def group_summary(scaling: pd.DataFrame, status: pd.DataFrame) -> pd.DataFrame:
    """One row per group (hardware, framework, model, policy, precision): cells ok and planned
    (status.csv), the node counts measured, and throughput and efficiency at the group's
    largest measured node count (median over repetitions and its interval,
    dlscale.analysis.stats)."""
    keys = SUMMARY_LEVELS[0][0]
    rows = []
    for key, part in scaling.groupby(keys, sort=False) if not scaling.empty else []:
        top = part.loc[part["nodes"].idxmax()]
        rows.append(
            {
                **dict(zip(keys, key)),
                "node_counts": tuple(sorted(int(n) for n in part["nodes"].unique())),
                "top_nodes": int(top["nodes"]),
                "n_top": int(top["n"]),
                "cells_measured": int(part["n"].sum()),
                "competing_reps": int(part["competing_reps"].sum()),
                "straggler_reps": int(part["straggler_reps"].sum()),
                **{c: top[c] for c in _AT_TOP},
            }
        )
    measured = pd.DataFrame(
        rows,
        columns=[
            *keys,
            "node_counts",
            "top_nodes",
            "n_top",
            "cells_measured",
            "competing_reps",
            "straggler_reps",
            *_AT_TOP,
        ],
    )
    if status.empty:
        out = measured.assign(
            cells_ok=measured["cells_measured"], cells_planned=measured["cells_measured"]
        )
    else:
        planned = (
            status.assign(ok=status["status"] == "ok")
            .groupby(keys, sort=False)
            .agg(cells_planned=("ok", "size"), cells_ok=("ok", "sum"))
            .reset_index()
        )
        out = planned.merge(measured, on=keys, how="outer")
    out["node_counts"] = out["node_counts"].apply(lambda v: v if isinstance(v, tuple) else ())
    for col in ("cells_ok", "cells_planned", "competing_reps", "straggler_reps"):
        out[col] = out[col].fillna(0).astype(int)
    return out.sort_values(keys, kind="stable").reset_index(drop=True)


def cell_summary(
    scaling: pd.DataFrame, status: pd.DataFrame, max_rows: int = MAX_SUMMARY_ROWS
) -> tuple[pd.DataFrame, int, int]:
    """The summary at the finest level of SUMMARY_LEVELS with at most `max_rows` rows (the
    coarsest level when none fits). Returns (table, level index, number of groups)."""
    groups = group_summary(scaling, status)
    for level, (keys, _) in enumerate(SUMMARY_LEVELS):
        if level == 0:
            table = groups
        else:
            rows = []
            for key, part in groups.groupby(keys, sort=True):
                eff = part["scaling_efficiency_median"].dropna()
                rows.append(
                    {
                        **dict(zip(keys, key if isinstance(key, tuple) else (key,))),
                        "groups": len(part),
                        "cells_ok": int(part["cells_ok"].sum()),
                        "cells_planned": int(part["cells_planned"].sum()),
                        "node_counts": tuple(sorted({n for v in part["node_counts"] for n in v})),
                        "competing_reps": int(part["competing_reps"].sum()),
                        "straggler_reps": int(part["straggler_reps"].sum()),
                        "efficiency_median": eff.median() if len(eff) else np.nan,
                        "efficiency_min": eff.min() if len(eff) else np.nan,
                        "efficiency_max": eff.max() if len(eff) else np.nan,
                    }
                )
            table = pd.DataFrame(rows)
        if len(table) <= max_rows or level == len(SUMMARY_LEVELS) - 1:
            return table, level, len(groups)
    raise AssertionError("unreachable")


def _node_list(nodes) -> str:
    nodes = list(nodes)
    if not nodes:
        return "--"
    if len(nodes) <= 4:
        return ", ".join(str(n) for n in nodes)
    return f"{nodes[0]}--{nodes[-1]} ({len(nodes)})"


def _flags(r) -> str:
    return ("$^\\dagger$" if r.competing_reps else "") + (
        "$^\\ddagger$" if r.straggler_reps else ""
    )


def write_cell_summary(
    scaling: pd.DataFrame, status: pd.DataFrame, out: str, max_rows: int = MAX_SUMMARY_ROWS
) -> int:
    """The report's cell table: a bounded summary (`cell_summary`) with a sentence that says
    its level. The full per-cell table is attached to the PDF (results/tables/cells.csv).
    Returns the number of rows written."""
    table, level, n_groups = cell_summary(scaling, status, max_rows)
    keys, words = SUMMARY_LEVELS[level]
    if "parallelism" in keys and set(table.get("parallelism", [])) <= {"ddp"}:
        # a study of ddp cells only reads as it did before the parallelism axis
        keys = [k for k in keys if k != "parallelism"]
        words = words.replace(", mode and parallelism", " and mode")
    heads = {
        "hardware": "HW",
        "framework": "Framework",
        "model": "Model",
        "policy": "Policy",
        "precision": "Prec.",
        "mode": "Mode",
        "parallelism": "Parallelism",
    }
    if level == 0:
        intro = (
            f"One row per {words} ({len(table)} groups). Throughput and scaling efficiency "
            "are those at the group's largest measured node count (the last of its node "
            "counts): median over n repetitions; in square brackets its 95\\,\\% "
            "order-statistic confidence interval (n $\\geq$ 6), in parentheses the min--max "
            "range where fewer repetitions allow no such interval, nothing for one repetition."
        )
        spec = "l" * len(keys) + "rlrrr"
        head = (
            " & ".join(heads[k] for k in keys) + r" & Cells & Nodes & n & "
            r"Throughput [samples/s] & Efficiency \\"
            "\n" + "& " * len(keys) + r"ok/planned & & & median [CI] or (range) & "
            r"median [CI] or (range) \\"
        )
    else:
        intro = (
            f"The per-group summary would have {n_groups} rows (more than {max_rows}, "
            f"about two pages), so this table aggregates further: one row per {words} "
            f"({len(table)} rows). Groups counts the hardware, framework, model, batch "
            "policy and precision groups a row holds; efficiency is the median, minimum and "
            "maximum over those groups, each at its largest measured node count."
        )
        spec = "l" * len(keys) + "rrlr"
        head = (
            " & ".join(heads[k] for k in keys) + r" & Groups & Cells & Nodes & "
            r"Efficiency at largest node count \\"
            "\n" + "& " * len(keys) + r"& ok/planned & & median [min, max] \\"
        )
    rows = []
    for r in table.itertuples(index=False):
        cols = [tex_escape(getattr(r, k)) for k in keys]
        if level == 0:
            measured = not pd.isna(r.throughput_samples_per_s_median)
            cols += [
                f"{r.cells_ok}/{r.cells_planned}",
                _node_list(r.node_counts),
                str(int(r.n_top)) if measured else "--",
                _ci(r, "throughput_samples_per_s") if measured else "--",
                _ci(r, "scaling_efficiency") if measured else "--",
            ]
        else:
            eff = (
                "--"
                if pd.isna(r.efficiency_median)
                else f"{_fmt(r.efficiency_median)} [{_fmt(r.efficiency_min)}, "
                f"{_fmt(r.efficiency_max)}]"
            )
            cols += [
                str(r.groups),
                f"{r.cells_ok}/{r.cells_planned}",
                _node_list(r.node_counts),
                eff,
            ]
        rows.append(" & ".join(cols) + _flags(r) + r" \\")
    ncols = len(spec)
    body = "\n".join(rows) if rows else rf"\multicolumn{{{ncols}}}{{c}}{{no planned cells}} \\"
    foot = (
        r"\bottomrule"
        "\n"
        rf"\multicolumn{{{ncols}}}{{p{{0.9\linewidth}}}}"
        r"{$^\dagger$ a repetition was measured while other processes kept the host busy "
        r"(idle probe); $^\ddagger$ a repetition had a straggler rank.}\\"
        "\n"
    )
    Path(out).write_text(
        r"\noindent " + intro + "\n\n"
        r"{\footnotesize\setlength\tabcolsep{3pt}"
        "\n" + rf"\begin{{longtable}}{{{spec}}}"
        "\n"
        r"\toprule"
        "\n" + head + "\n" + r"\midrule\endhead"
        "\n" + body + "\n" + foot + r"\end{longtable}}" + "\n"
    )
    return len(table)


MAX_LISTED_CELLS = 60  # rows of the failed/missing and quarantine tables (~2 pages)


def write_status_table(status: pd.DataFrame, out: str) -> None:
    """Failed and missing cells with the reason, Slurm state, failing rank and last log line."""
    bad = status[status["status"] != "ok"] if not status.empty else status
    if bad.empty:
        Path(out).write_text(
            f"All {len(status)} planned cells were measured ({workload_counts_text(status)}).\n"
        )
        return
    rows = []
    # failed before missing (sorted by status), at most MAX_LISTED_CELLS rows: a large study
    # with many missing cells would otherwise fill pages; the rest are counted below the table
    ordered = bad.sort_values(["status", "hardware", "framework", "model", "nodes", "rep"])
    for r in ordered.head(MAX_LISTED_CELLS).itertuples(index=False):
        cell = cell_label(r._asdict())
        last = (str(r.log_tail).strip().splitlines() or [""])[-1] if not pd.isna(r.log_tail) else ""
        slurm = "" if pd.isna(r.slurm_state) else f"{r.slurm_state} ({r.slurm_exit_code})"
        rank = "" if pd.isna(r.failed_rank) else str(int(r.failed_rank))
        rows.append(
            " & ".join(
                tex_escape(v)
                for v in (
                    cell,
                    r.status,
                    r.reason if not pd.isna(r.reason) else "",
                    slurm,
                    rank,
                    last[:90],
                )
            )
            + r" \\"
        )
    counts = ", ".join(f"{(bad['status'] == s).sum()} {s}" for s in ("failed", "missing"))
    unfit = int((bad["status"] == "does_not_fit").sum()) if not bad.empty else 0
    if unfit:  # out of memory at this size: a result (dlscale.store.does_not_fit)
        counts += f", {unfit} did not fit in memory"
    Path(out).write_text(
        f"\\noindent {len(status) - len(bad)} of {len(status)} planned cells were measured "
        f"({workload_counts_text(status)}); {counts}.\n\n"
        "{\\footnotesize\\setlength\\tabcolsep{3pt}\n"
        "\\begin{longtable}{p{0.26\\linewidth}lp{0.22\\linewidth}p{0.12\\linewidth}r"
        "p{0.22\\linewidth}}\n\\toprule\n"
        "Cell & Status & Reason & Slurm state (exit) & Rank & Last log line \\\\\n"
        "\\midrule\\endhead\n"
        + "\n".join(rows)
        + "\n\\bottomrule\n\\end{longtable}}\n"
        + _more_rows(ordered.iloc[MAX_LISTED_CELLS:], "status.csv")
    )


def _more_rows(rest: pd.DataFrame, table: str) -> str:
    if rest.empty:
        return ""
    counts = (
        ", ".join(f"{n} {status}" for status, n in rest["status"].value_counts().items())
        if "status" in rest
        else ""
    )
    return (
        f"\\noindent {len(rest)} more not listed{f' ({counts})' if counts else ''}: "
        f"see \\texttt{{{tex_escape(table)}}}.\n"
    )


def write_quarantine_table(quarantine: pd.DataFrame, out: str) -> None:
    if quarantine.empty:
        Path(out).write_text("No metrics file was rejected.\n")
        return
    rows = "\n".join(
        f"\\texttt{{{tex_escape(r.metrics_path)}}} & {tex_escape(r.reason)} \\\\"
        for r in quarantine.head(MAX_LISTED_CELLS).itertuples(index=False)
    )
    Path(out).write_text(
        "\\begin{longtable}{p{0.45\\linewidth}p{0.5\\linewidth}}\n\\toprule\n"
        "Metrics file & Reason \\\\\n\\midrule\n"
        + rows
        + "\n\\bottomrule\n\\end{longtable}\n"
        + _more_rows(quarantine.iloc[MAX_LISTED_CELLS:], "quarantine.csv")
    )


def write_systems_table(systems: pd.DataFrame, out: str) -> None:
    """The Systems table (dlscale.analysis.systems_table): per hardware entry, one row per field
    with its
    values (how many cells show each where they differ), the MLPerf system-description field it
    fills, and a flag where the nodes of one cell disagree."""
    if systems.empty:
        Path(out).write_text("No measured cell recorded a system description.\n")
        return
    mark = r"$^\S$"
    parts = []
    for hardware, hw in systems.groupby("hardware", sort=True):
        rows = []
        for field, f in hw.groupby("field", sort=False):
            shown = f.head(MAX_SYSTEM_VALUES)
            several = len(f) > 1
            values = "; ".join(
                tex_escape(v) + (f" ({c} cell{'s' if c > 1 else ''})" if several else "")
                for v, c in zip(shown["value"].astype(str), shown["cells"])
            )
            if len(f) > MAX_SYSTEM_VALUES:
                values += f"; {len(f) - MAX_SYSTEM_VALUES} more values (systems.csv)"
            differ = int(f["cells_nodes_differ"].iloc[0])
            if differ:
                names = str(f["differing_cells"].iloc[0]).split()
                listed = ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
                values += (
                    r" \textbf{[nodes differ in "
                    + f"{differ} cell{'s' if differ > 1 else ''}: {tex_escape(listed)}]}}"
                )
            mlperf = tex_escape(f["mlperf_fields"].iloc[0])
            rows.append(
                tex_escape(field)
                + (mark if differ else "")
                + f" & {values} & \\texttt{{{mlperf}}} \\\\"
            )
        flagged = int((hw.groupby("field")["cells_nodes_differ"].first() > 0).sum())
        parts.append(
            f"\\subsection*{{Hardware \\texttt{{{tex_escape(hardware)}}}}}\n"
            + (
                f"{flagged} field(s) differ between the nodes of one cell ({mark}).\n"
                if flagged
                else "The nodes of every cell agree on every field.\n"
            )
            + "{\\footnotesize\\setlength\\tabcolsep{3pt}\n"
            "\\begin{longtable}{p{0.2\\linewidth}p{0.5\\linewidth}p{0.24\\linewidth}}\n"
            "\\toprule\nField & Value & MLPerf system-description field \\\\\n"
            "\\midrule\\endhead\n" + "\n".join(rows) + "\n\\bottomrule\n\\end{longtable}}\n"
        )
    Path(out).write_text("".join(parts))


def write_report_inputs(
    paths: Mapping[str, str], *, config: dict, n_planned: int
) -> dict[str, pd.DataFrame]:
    """The rule report_inputs (the complete and the partial report alike): the tables at
    paths["cells"], ["scaling"], ["quarantine"], ["status"] (CSV) -> the macros and LaTeX tables
    at paths["macros"], ["cells_table"], ["quarantine_table"], ["status_table"] (the keys of
    dlscale.workflow.paths.output_paths; others are ignored), and paths["systems"] ->
    ["systems_table"] where given. Returns the tables read, by the same keys."""
    tables = {key: pd.read_csv(paths[key]) for key in ("cells", "scaling", "quarantine", "status")}
    Path(paths["macros"]).parent.mkdir(parents=True, exist_ok=True)
    macros = build_macros(config, **tables, n_planned=n_planned)
    # the time-to-accuracy section (real data; dlscale.outputs.tta_section), apart from the
    # throughput
    conv = {k: pd.read_csv(paths[k]) for k in ("convergence", "time_to_accuracy") if k in paths}
    tolerance = config["convergence"]["validity_tolerance"]
    if len(conv) < 2:  # tables from before the convergence workload: an empty section
        from dlscale.analysis.time_to_accuracy import CELL_COLUMNS, time_to_accuracy_summary

        conv = {"convergence": pd.DataFrame(columns=CELL_COLUMNS)}
        conv["time_to_accuracy"] = time_to_accuracy_summary(conv["convergence"], tolerance)
    elif len(conv["convergence"]) and "convergence_validity" not in conv["time_to_accuracy"]:
        # a summary from before convergence validity: summarised again from its cells
        from dlscale.analysis.time_to_accuracy import time_to_accuracy_summary

        conv["time_to_accuracy"] = time_to_accuracy_summary(conv["convergence"], tolerance)
    macros.update(
        {
            _macro_name(k): tex_escape(v)
            for k, v in convergence_macros(
                config, conv["convergence"], conv["time_to_accuracy"]
            ).items()
        }
    )
    write_macros(macros, paths["macros"])
    if "convergence_table" in paths:
        write_convergence_table(conv["time_to_accuracy"], paths["convergence_table"], tex_escape)
    tables.update(conv)
    if "systems" in paths:  # and paths["systems_table"]
        tables["systems"] = pd.read_csv(paths["systems"], keep_default_na=False)
        write_systems_table(tables["systems"], paths["systems_table"])
    write_cell_summary(tables["scaling"], tables["status"], paths["cells_table"])
    write_quarantine_table(tables["quarantine"], paths["quarantine_table"])
    write_status_table(tables["status"], paths["status_table"])
    return tables


def render_tex(
    out: str,
    *,
    title: str,
    figures: list[dict],
    attachment: str,
    convergence_figures: list[dict] = (),
) -> None:
    """report.tex from the template. `figures`: the layout
    (dlscale.outputs.figure_layout.figure_layout) with
    file, caption, hardware, width_in, ci; `convergence_figures`: the convergence workload's
    (dlscale.outputs.figure_layout.convergence_layout), in their own section; `attachment`: the
    cell table's
    path relative to the report's folder, embedded in the PDF (attachfile2)."""
    env = jinja2.Environment(
        block_start_string="((*",
        block_end_string="*))",
        variable_start_string="(((",
        variable_end_string=")))",
        comment_start_string="((=",
        comment_end_string="=))",
        loader=jinja2.FunctionLoader(
            lambda name: resources.files("dlscale").joinpath("templates", name).read_text()
        ),
        undefined=jinja2.StrictUndefined,
        autoescape=False,
        keep_trailing_newline=True,
    )
    if not re.fullmatch(r"[A-Za-z0-9_./-]+", attachment):
        raise ValueError(f"attachment path must be a plain relative path: {attachment!r}")

    def tex_figures(layout):
        return [
            {
                "file": f["file"],
                "caption": tex_escape(f["caption"]),
                "hardware": tex_escape(f["hardware"]),
                "width_in": f"{float(f['width_in']):.3f}",
                "ci": bool(f.get("ci", True)),
                "family": f["family"],
            }
            for f in layout
        ]

    figs = tex_figures(figures)
    tex = env.get_template("report.tex.j2").render(
        title=tex_escape(title),
        figures=figs,
        convergence_figures=tex_figures(convergence_figures),
        attachment=attachment,
        attachment_name=tex_escape(Path(attachment).name),
        attachment_name_plain=Path(attachment).name,
        hardware_count=len({f["hardware"] for f in figs}),
        max_panels=MAX_PANELS,
        max_series=MAX_SERIES,
    )
    Path(out).write_text(tex)


class LatexMissing(RuntimeError):
    pass


def compile_pdf(tex: str, log: str) -> None:
    """latexmk -g -pdf in the report's folder (-g: always compile, since Snakemake already decided
    the report is out of date; latexmk would otherwise repeat a remembered failure). A clear
    message when TeX Live is missing."""
    if shutil.which("latexmk") is None or shutil.which("pdflatex") is None:
        raise LatexMissing(
            "latexmk/pdflatex not found: the report PDF needs Debian's TeX Live "
            "(apt-get install latexmk texlive-latex-base texlive-latex-recommended "
            "texlive-fonts-recommended lmodern; scripts/setup.sh does this). Tables "
            "(results/tables/) and figures (results/figures/) are already built."
        )
    tex_path = Path(tex)
    Path(log).parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as fh:
        proc = subprocess.run(
            [
                "latexmk",
                "-g",
                "-pdf",
                "-interaction=nonstopmode",
                "-halt-on-error",
                "-file-line-error",
                tex_path.name,
            ],
            cwd=tex_path.parent,
            stdout=fh,
            stderr=subprocess.STDOUT,
        )
    if proc.returncode != 0:
        tail = "\n".join(Path(log).read_text(errors="replace").splitlines()[-30:])
        raise RuntimeError(f"latexmk failed (exit {proc.returncode}); last lines of {log}:\n{tail}")

"""The report's cell table (dlscale.outputs.report): a bounded summary of the scaling table,
one row per group (hardware, framework, model, policy, precision, mode, parallelism) when that
fits in about two pages, else the first coarser level that does, with the sentence that says
which; the full per-cell table is attached to the PDF."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from dlscale.analysis.stats import EXACT, GROUP, NONE, RANGE
from dlscale.outputs.latex_text import _fmt, tex_escape
from dlscale.study.cell import DEFAULT_PARALLELISM, DEFAULT_WORKLOAD

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
_AT_TOP = (
    [
        f"{m}_{s}"
        for m in ("throughput_samples_per_s", "scaling_efficiency")
        for s in ("median", "ci_low", "ci_high")
    ]
    + list(_INTERVAL_KIND.values())
    + ["placements"]
)


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
    if "workload" in status:  # the throughput cells only, which this table summarises
        status = status[status["workload"].fillna(DEFAULT_WORKLOAD) == DEFAULT_WORKLOAD]
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
    return (
        ("$^\\dagger$" if r.competing_reps else "")
        + ("$^\\ddagger$" if r.straggler_reps else "")
        + ("$^\\S$" if getattr(r, "placements", 0) > 1 else "")
    )


def _summary_head(
    table: pd.DataFrame, level: int, keys: list, words: str, n_groups: int, max_rows: int
) -> tuple[str, str, str]:
    """The sentence above the cell table, its column spec and its header rows."""
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
            "range where fewer repetitions allow no such interval, nothing for one repetition. "
            "Cells: the group's throughput cells measured of those planned (convergence cells "
            "are counted in their own section)."
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
    return intro, spec, head


def _summary_row(r, keys: list, level: int) -> str:
    """One row of the cell table (a group at level 0, else an aggregate of groups)."""
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
            else f"{_fmt(r.efficiency_median)} [{_fmt(r.efficiency_min)}, {_fmt(r.efficiency_max)}]"
        )
        cols += [
            str(r.groups),
            f"{r.cells_ok}/{r.cells_planned}",
            _node_list(r.node_counts),
            eff,
        ]
    return " & ".join(cols) + _flags(r) + r" \\"


def write_cell_summary(
    scaling: pd.DataFrame, status: pd.DataFrame, out: str, max_rows: int = MAX_SUMMARY_ROWS
) -> int:
    """The report's cell table: a bounded summary (`cell_summary`) with a sentence that says
    its level. The full per-cell table is attached to the PDF (results/tables/cells.csv).
    Returns the number of rows written."""
    table, level, n_groups = cell_summary(scaling, status, max_rows)
    keys, words = SUMMARY_LEVELS[level]
    if "parallelism" in keys and set(table.get("parallelism", [])) <= {DEFAULT_PARALLELISM}:
        # a study of ddp cells only reads as it did before the parallelism axis
        keys = [k for k in keys if k != "parallelism"]
        words = words.replace(", mode and parallelism", " and mode")
    intro, spec, head = _summary_head(table, level, keys, words, n_groups, max_rows)
    rows = [_summary_row(r, keys, level) for r in table.itertuples(index=False)]
    ncols = len(spec)
    body = "\n".join(rows) if rows else rf"\multicolumn{{{ncols}}}{{c}}{{no planned cells}} \\"
    foot = (
        r"\bottomrule"
        "\n"
        rf"\multicolumn{{{ncols}}}{{p{{0.9\linewidth}}}}"
        r"{$^\dagger$ a repetition was measured while other processes kept the host busy "
        r"(idle probe); $^\ddagger$ a repetition had a straggler rank; $^\S$ the repetitions "
        r"at the largest node count ran on different nodes (node-to-node variance is part of "
        r"their spread; unmarked: all on the same nodes).}\\"
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

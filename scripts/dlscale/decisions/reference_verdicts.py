"""The regression check's verdicts (dlscale.decisions.regression_check): per scaling point and
metric the most specific reference (config/references.yaml), the measured median with its
interval, and the verdict (PASS, FAIL, no-reference, not-measured) with its margin and note;
the counts and the references that matched no point."""

from __future__ import annotations

import fnmatch
import math

import numpy as np
import pandas as pd

from dlscale.analysis.stats import CI, EXACT, GROUP, RANGE, interval_label
from dlscale.study.cell import AXES, DEFAULT_PARALLELISM
from dlscale.study.references import WILDCARD, Reference

# The metrics a reference may name: unit, and the scaling.csv column prefix of the measured
# median (None: dlscale does not measure it). Interval columns exist for the first two.
METRICS = {
    "throughput_samples_per_s": ("samples/s", "throughput_samples_per_s"),
    "scaling_efficiency": ("fraction", "scaling_efficiency"),
    "time_to_accuracy_s": ("s", None),
    "joules_per_sample": ("J/sample", "joules_per_sample"),
}
_INTERVAL_KIND = {"throughput_samples_per_s": "interval", "scaling_efficiency": "speedup_interval"}
NOT_MEASURED_BY_DLSCALE = {
    "time_to_accuracy_s": "the check compares the throughput cells (synthetic data); the "
    "convergence cells' time-to-accuracy (tables/time_to_accuracy.csv) is not compared yet",
}

PASS, FAIL, NO_REFERENCE, NOT_MEASURED = "PASS", "FAIL", "no-reference", "not-measured"
VERDICTS = (FAIL, NOT_MEASURED, PASS, NO_REFERENCE)  # the order of the tables
POINT = [*GROUP, "nodes"]
COLUMNS = [
    *POINT,
    "cell",
    "metric",
    "unit",
    "verdict",
    "measured",
    "interval_low",
    "interval_high",
    "interval",
    "n",
    "reference",
    "lower_bound",
    "upper_bound",
    "tolerance",
    "margin",
    "interval_vs_bounds",
    "reference_key",
    "note",
]


def cell_name(point) -> str:
    """A point's name below its hardware folder: framework/model/policy/precision/mode/n<nodes>
    (the cell's path, dlscale.study.cell.AXIS_PATH, without hardware and repetition)."""
    return "/".join(
        ("n" if a == "nodes" else "") + str(point[a])
        for a in AXES[1:]
        if a != "parallelism" or _value(point, a) not in (None, DEFAULT_PARALLELISM)
    )


def _value(point, key):
    """A point's value of a key it may lack (tables from before the key existed)."""
    try:
        return point[key]
    except (KeyError, IndexError):
        return None


def best_reference(refs: list[Reference], hardware: str, cell: str, metric: str):
    """The most specific reference for a point's metric: an exact system before '*', then the
    pattern with the most literal characters, then the first in the file; None when none."""
    matches = [
        r
        for r in refs
        if r.metric == metric
        and r.system in (hardware, WILDCARD)
        and fnmatch.fnmatchcase(cell, r.pattern)
    ]
    return max(matches, key=Reference.specificity, default=None)


def _measured(row, metric: str) -> tuple[float, float, float, str, int] | None:
    """(median, low, high, interval kind, n) of a scaling row's metric; None when not
    measured (no row, no column, or NaN)."""
    column = METRICS[metric][1]
    if row is None or column is None:
        return None
    value = row.get(f"{column}_median")
    if value is None or pd.isna(value):
        return None
    kind_col = _INTERVAL_KIND.get(metric)
    kind = row[kind_col] if kind_col else "none"
    low = row.get(f"{column}_ci_low", np.nan)
    high = row.get(f"{column}_ci_high", np.nan)
    return float(value), float(low), float(high), str(kind), int(row["n"])


def _vs_bounds(low: float, high: float, kind: str, bounds: tuple[float, float]) -> str:
    if kind not in (CI, RANGE) or pd.isna(low) or pd.isna(high):
        return "no interval"
    if low >= bounds[0] and high <= bounds[1]:
        return "inside"
    if high < bounds[0] or low > bounds[1]:
        return "outside"
    return "overlaps"


def verdicts(scaling: pd.DataFrame, status: pd.DataFrame, refs: list[Reference]) -> pd.DataFrame:
    """One row per scaling point and metric with a reference or a measured value (COLUMNS).
    `status`: every planned cell (status.csv), so a referenced point whose cells all failed is
    not-measured rather than absent; may be empty."""
    points: dict[tuple, dict] = {}
    for table in (status, scaling):
        if table is None or table.empty:
            continue
        for r in table.to_dict("records"):
            key = tuple(r[a] for a in POINT)
            points.setdefault(key, {a: r[a] for a in POINT})
    by_point = {tuple(r[a] for a in POINT): r for r in scaling.to_dict("records")}
    rows = []
    for key in sorted(points, key=lambda k: tuple(str(v) for v in k[:-1]) + (int(k[-1]),)):
        point = points[key]
        cell = cell_name(point)
        row = by_point.get(key)
        for metric, (unit, _) in METRICS.items():
            ref = best_reference(refs, str(point["hardware"]), cell, metric)
            got = _measured(row, metric)
            if ref is None and got is None:
                continue
            if ref is None and metric == "scaling_efficiency" and row["speedup_interval"] == EXACT:
                continue  # the baseline's efficiency is 1 by definition: nothing to check
            out = {**point, "cell": cell, "metric": metric, "unit": unit}
            if got is not None:
                value, low, high, kind, n = got
                out.update(
                    measured=value,
                    interval_low=low,
                    interval_high=high,
                    interval=interval_label(kind, n),
                    n=n,
                )
            if ref is None:
                out.update(verdict=NO_REFERENCE, note="no reference matches this cell")
            else:
                low_b, high_b = ref.bounds()
                out.update(
                    reference=ref.value,
                    lower_bound=low_b if math.isfinite(low_b) else np.nan,
                    upper_bound=high_b if math.isfinite(high_b) else np.nan,
                    tolerance=ref.tolerance(),
                    reference_key=ref.key,
                )
                if got is None:
                    out.update(verdict=NOT_MEASURED, note=_why_not_measured(metric, row))
                else:
                    margin = min(value - low_b, high_b - value) / ref.value
                    passed = low_b <= value <= high_b
                    out.update(
                        verdict=PASS if passed else FAIL,
                        margin=margin if math.isfinite(margin) else np.nan,
                        interval_vs_bounds=_vs_bounds(low, high, kind, (low_b, high_b)),
                        note="" if passed else _fail_note(value, low_b, high_b, ref),
                    )
            rows.append(out)
    out = pd.DataFrame(rows, columns=COLUMNS)
    if not out.empty:
        out["nodes"] = out["nodes"].astype(int)
    return out


def _why_not_measured(metric: str, row) -> str:
    if metric in NOT_MEASURED_BY_DLSCALE:
        return NOT_MEASURED_BY_DLSCALE[metric]
    if row is None:
        return "no measured cell (failed or missing: status.csv)"
    if metric == "joules_per_sample":
        return "no energy counter was readable (cells.csv: energy_unavailable)"
    return "not measured"


def _fail_note(value: float, low_b: float, high_b: float, ref: Reference) -> str:
    side, bound = ("below", low_b) if value < low_b else ("above", high_b)
    return (
        f"{abs(value / bound - 1):.1%} {side} the {'lower' if side == 'below' else 'upper'} bound"
    )


def unused_references(refs: list[Reference], verdict_table: pd.DataFrame, hardware) -> list[str]:
    """References for this study's systems (or '*') that matched no point: a stale pattern."""
    used = set(verdict_table["reference_key"].dropna()) if not verdict_table.empty else set()
    systems = set(map(str, hardware))
    return sorted(
        {
            f"{r.key} {r.metric}"
            for r in refs
            if (r.system in systems or r.system == WILDCARD) and r.key not in used
        }
    )


def counts(table: pd.DataFrame) -> dict[str, int]:
    return {v: int((table["verdict"] == v).sum()) if not table.empty else 0 for v in VERDICTS}


def summary_line(table: pd.DataFrame) -> str:
    c = counts(table)
    return ", ".join(f"{c[v]} {v}" for v in (PASS, FAIL, NOT_MEASURED, NO_REFERENCE))

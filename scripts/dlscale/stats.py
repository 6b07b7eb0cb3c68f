"""Scaling statistics: speedup, efficiency and their bootstrap confidence intervals.

speedup(N)    = median throughput(N) / median throughput(baseline)
efficiency(N) = speedup(N) / (world_size(N) / world_size(baseline))
The same formulas hold under both batch policies: under `weak` the work per rank is fixed, under
`strong` the work per step is fixed, and throughput (samples/s) is the measure in both.
The baseline is the 1-node cell of the same hardware/framework/model/policy/precision, or the
smallest node count present when that cell is missing (column `baseline_nodes` says which).

Repetitions (separate jobs) are the independent samples. Confidence intervals are 95 %
percentile bootstrap intervals over repetitions: the cell's and the baseline's repetitions are
resampled independently BOOTSTRAP_RESAMPLES times with a fixed seed, and the statistic (median
throughput, ratio of medians) is recomputed on each resample. With a single repetition on both
sides there is no interval (NaN), and tables and figures say n.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

GROUP = ["hardware", "framework", "model", "policy", "precision"]
CELL_AXES = GROUP + ["nodes", "rep"]
BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 0
CI_LEVEL = 0.95
CI_METHOD = (f"{CI_LEVEL:.0%} percentile bootstrap over repetitions "
             f"(B={BOOTSTRAP_RESAMPLES}, seed {BOOTSTRAP_SEED})")


def add_speedup(cells: pd.DataFrame) -> pd.DataFrame:
    """Per-cell speedup and efficiency against the group's baseline (median over its reps)."""
    out = cells.copy()
    if out.empty:
        for col in ("baseline_nodes", "baseline_throughput", "speedup", "scaling_efficiency"):
            out[col] = pd.Series(dtype=float)
        return out
    base_nodes = out.groupby(GROUP)["nodes"].transform("min")
    is_base = out["nodes"] == base_nodes
    base = (out[is_base].groupby(GROUP)
            .agg(baseline_throughput=("throughput_samples_per_s", "median"),
                 baseline_world_size=("world_size", "first"))
            .reset_index())
    out["baseline_nodes"] = base_nodes
    out = out.merge(base, on=GROUP, how="left")
    out["speedup"] = out["throughput_samples_per_s"] / out["baseline_throughput"]
    out["scaling_efficiency"] = out["speedup"] / (out["world_size"] / out["baseline_world_size"])
    return out


def bootstrap_medians(values: np.ndarray, rng: np.random.Generator,
                      resamples: int = BOOTSTRAP_RESAMPLES) -> np.ndarray:
    """Medians of `resamples` resamples (with replacement) of `values`."""
    values = np.asarray(values, dtype=float)
    idx = rng.integers(0, len(values), size=(resamples, len(values)))
    return np.median(values[idx], axis=1)


def _interval(samples: np.ndarray) -> tuple[float, float]:
    tail = (1 - CI_LEVEL) / 2 * 100
    low, high = np.percentile(samples, [tail, 100 - tail])
    return float(low), float(high)


def ratio_ci(x: np.ndarray, base: np.ndarray, rng: np.random.Generator) -> tuple[float, float]:
    """CI of median(x) / median(base); NaN when neither side has two repetitions."""
    if len(x) < 2 and len(base) < 2:
        return float("nan"), float("nan")
    return _interval(bootstrap_medians(x, rng) / bootstrap_medians(base, rng))


def median_ci(x: np.ndarray, rng: np.random.Generator) -> tuple[float, float]:
    if len(x) < 2:
        return float("nan"), float("nan")
    return _interval(bootstrap_medians(x, rng))


# Per-cell measures summarised by their median over repetitions (no interval).
MEDIAN_ONLY = ["step_seconds_median", "compute_seconds_median", "comm_fraction",
               "allreduce_busbw_gb_per_s", "joules_per_sample", "peak_rss_mb_max"]


def _median_or_nan(part: pd.DataFrame, column: str) -> float:
    if column not in part:
        return float("nan")
    values = pd.to_numeric(part[column], errors="coerce").dropna()
    return float(values.median()) if len(values) else float("nan")


SUMMARY_KEYS = GROUP + ["nodes", "world_size", "per_rank_batch", "global_batch", "baseline_nodes"]


def scaling_summary(cells: pd.DataFrame) -> pd.DataFrame:
    """One row per group x node count: point estimates, bootstrap CIs, min/max and n."""
    columns = SUMMARY_KEYS + ["n", "n_baseline", "competing_reps", "straggler_reps"] + [
        f"{m}_{s}" for m in ("throughput_samples_per_s", "speedup", "scaling_efficiency")
        for s in ("median", "ci_low", "ci_high", "min", "max")] + [f"{c}_median" for c in MEDIAN_ONLY]
    if cells.empty:
        return pd.DataFrame(columns=columns)
    rng = np.random.default_rng(BOOTSTRAP_SEED)
    baselines = dict(iter(cells[cells["nodes"] == cells["baseline_nodes"]].groupby(GROUP)))
    rows = []
    for key, part in cells.groupby(SUMMARY_KEYS, sort=True):
        row = dict(zip(SUMMARY_KEYS, key))
        base = baselines[tuple(row[c] for c in GROUP)]
        x = part["throughput_samples_per_s"].to_numpy(dtype=float)
        b = base["throughput_samples_per_s"].to_numpy(dtype=float)
        scale = row["world_size"] / base["world_size"].iloc[0]
        speedup = float(np.median(x) / np.median(b))
        s_low, s_high = ratio_ci(x, b, rng)
        t_low, t_high = median_ci(x, rng)
        row.update({
            "n": len(x), "n_baseline": len(b),
            "competing_reps": int(part["competing"].sum()) if "competing" in part else 0,
            "straggler_reps": int(part["straggler"].sum()) if "straggler" in part else 0,
            "throughput_samples_per_s_median": float(np.median(x)),
            "throughput_samples_per_s_ci_low": t_low, "throughput_samples_per_s_ci_high": t_high,
            "throughput_samples_per_s_min": float(x.min()),
            "throughput_samples_per_s_max": float(x.max()),
            "speedup_median": speedup, "speedup_ci_low": s_low, "speedup_ci_high": s_high,
            "speedup_min": float(part["speedup"].min()), "speedup_max": float(part["speedup"].max()),
            "scaling_efficiency_median": speedup / scale,
            "scaling_efficiency_ci_low": s_low / scale, "scaling_efficiency_ci_high": s_high / scale,
            "scaling_efficiency_min": float(part["scaling_efficiency"].min()),
            "scaling_efficiency_max": float(part["scaling_efficiency"].max()),
            **{f"{c}_median": _median_or_nan(part, c) for c in MEDIAN_ONLY},
        })
        rows.append(row)
    return pd.DataFrame(rows, columns=columns)


def stragglers(rank_throughputs: list[float], threshold: float) -> list[int]:
    """Ranks (by position) slower than the median rank by more than `threshold` (a fraction)."""
    median = float(np.median(rank_throughputs))
    return [i for i, t in enumerate(rank_throughputs) if t < median * (1 - threshold)]

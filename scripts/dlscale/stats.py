"""Scaling statistics: speedup, efficiency and their bootstrap confidence intervals.

speedup(N)    = median throughput(N) / median throughput(baseline)
efficiency(N) = speedup(N) / (world_size(N) / world_size(baseline))
The same formulas hold under both batch policies: under `weak` the work per rank is fixed, under
`strong` the work per step is fixed, and throughput (samples/s) is the measure in both.
The baseline is the 1-node cell of the same hardware/framework/model/policy/precision, or the
smallest node count present when that cell is missing (column `baseline_nodes` says which).

Repetitions (separate jobs) are the independent samples. Confidence intervals are 95 %
percentile bootstrap intervals over repetitions (`bootstrap_cis`, one batched implementation for
every row of a study): the cell's and the baseline's repetitions are resampled independently
BOOTSTRAP_RESAMPLES times with a fixed seed (all groups from one stream, in batches of equal
size), and the statistic (median throughput, ratio of medians) is recomputed on each resample; a
row's throughput and speedup intervals share the row's resamples, and the baseline row's speedup
is 1 by definition (same resamples on both sides). With a single repetition on both sides there
is no interval (NaN), and tables and figures say n.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import pandas as pd

from .cell import AXES

# A scaling group: every axis but the node count (speedup and efficiency compare the node counts
# of one group; a cell's key, dlscale.cell.KEY, adds the node count and the repetition).
GROUP = [axis for axis in AXES if axis != "nodes"]
BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 0
CI_LEVEL = 0.95
CI_METHOD = (
    f"{CI_LEVEL:.0%} percentile bootstrap over repetitions "
    f"(B={BOOTSTRAP_RESAMPLES}, seed {BOOTSTRAP_SEED})"
)


def add_speedup(cells: pd.DataFrame) -> pd.DataFrame:
    """Per-cell speedup and efficiency against the group's baseline (median over its reps)."""
    out = cells.copy()
    if out.empty:
        for col in ("baseline_nodes", "baseline_throughput", "speedup", "scaling_efficiency"):
            out[col] = pd.Series(dtype=float)
        return out
    base_nodes = out.groupby(GROUP)["nodes"].transform("min")
    is_base = out["nodes"] == base_nodes
    base = (
        out[is_base]
        .groupby(GROUP)
        .agg(
            baseline_throughput=("throughput_samples_per_s", "median"),
            baseline_world_size=("world_size", "first"),
        )
        .reset_index()
    )
    out["baseline_nodes"] = base_nodes
    out = out.merge(base, on=GROUP, how="left")
    out["speedup"] = out["throughput_samples_per_s"] / out["baseline_throughput"]
    out["scaling_efficiency"] = out["speedup"] / (out["world_size"] / out["baseline_world_size"])
    return out


_BATCH_DRAWS = 4_000_000  # resampled values per batch (32 MB of indices)


def bootstrap_medians(
    samples: list[np.ndarray], rng: np.random.Generator, resamples: int = BOOTSTRAP_RESAMPLES
) -> list[np.ndarray]:
    """For each array, the medians of `resamples` resamples (with replacement) of it. Arrays of
    equal length are resampled together in one numpy call (a large study has thousands)."""
    out: list[np.ndarray] = [np.empty(0)] * len(samples)
    by_length: dict[int, list[int]] = {}
    for i, values in enumerate(samples):
        by_length.setdefault(len(values), []).append(i)
    for n, members in sorted(by_length.items()):
        step = max(1, _BATCH_DRAWS // (resamples * n))
        for start in range(0, len(members), step):
            chunk = members[start : start + step]
            values = np.stack([np.asarray(samples[i], dtype=float) for i in chunk])
            idx = rng.integers(0, n, size=(len(chunk), resamples, n))
            drawn = np.take_along_axis(np.broadcast_to(values[:, None, :], idx.shape), idx, axis=2)
            for i, medians in zip(chunk, np.median(drawn, axis=2)):
                out[i] = medians
    return out


class Intervals(NamedTuple):
    """Interval bounds per sample (arrays aligned with the samples; NaN: no interval)."""

    median_low: np.ndarray
    median_high: np.ndarray
    ratio_low: np.ndarray
    ratio_high: np.ndarray


def bootstrap_cis(
    xs: Sequence[np.ndarray],
    rng: np.random.Generator,
    bases: Sequence[np.ndarray] = (),
    base_of: Sequence[int] = (),
    own_base: Sequence[bool] = (),
) -> Intervals:
    """CI_LEVEL percentile bootstrap intervals of many samples at once: the one implementation
    (scaling_summary calls it once for every row of a study).

    xs[i]: the repetitions of row i; bases[base_of[i]]: those of its baseline; own_base[i]: row i
    is its own baseline. Every x and every base is resampled once (bootstrap_medians, xs first,
    then bases, from `rng`). Median interval of x: percentiles of its resample medians, NaN where
    x has fewer than two values. Ratio interval of median(x) / median(base): percentiles of the
    ratio of the same resample medians of x to those of its base (1 where x is its own baseline),
    NaN where neither side has two values, and everywhere without bases."""
    xs, bases = list(xs), list(bases)
    tail = (1 - CI_LEVEL) / 2 * 100
    medians = bootstrap_medians(xs + bases, rng)
    x_medians = np.reshape(medians[: len(xs)], (len(xs), BOOTSTRAP_RESAMPLES))
    n = np.array([len(x) for x in xs], dtype=int)
    median_low, median_high = np.where(
        n < 2, np.nan, np.percentile(x_medians, [tail, 100 - tail], axis=1)
    )
    if not bases:
        return Intervals(
            median_low, median_high, np.full(len(xs), np.nan), np.full(len(xs), np.nan)
        )
    base_medians = np.stack(medians[len(xs) :])[list(base_of)]
    own = np.asarray(own_base, dtype=bool)
    if own.any():
        base_medians[own] = x_medians[own]
    n_base = np.array([len(bases[b]) for b in base_of], dtype=int)
    ratio_low, ratio_high = np.where(
        (n < 2) & (n_base < 2),
        np.nan,
        np.percentile(x_medians / base_medians, [tail, 100 - tail], axis=1),
    )
    return Intervals(median_low, median_high, ratio_low, ratio_high)


# Per-cell measures summarised by their median over repetitions (no interval).
MEDIAN_ONLY = [
    "step_seconds_median",
    "compute_seconds_median",
    "comm_fraction",
    "allreduce_busbw_gb_per_s",
    "joules_per_sample",
    "peak_rss_mb_max",
]


SUMMARY_KEYS = GROUP + ["nodes", "world_size", "per_rank_batch", "global_batch", "baseline_nodes"]


def scaling_summary(cells: pd.DataFrame) -> pd.DataFrame:
    """One row per group x node count: point estimates, bootstrap CIs, min/max and n.
    Vectorised over groups (a 10,000-cell study has thousands): per-row statistics come from one
    groupby, intervals from one bootstrap_cis call."""
    columns = (
        SUMMARY_KEYS
        + ["n", "n_baseline", "competing_reps", "straggler_reps"]
        + [
            f"{m}_{s}"
            for m in ("throughput_samples_per_s", "speedup", "scaling_efficiency")
            for s in ("median", "ci_low", "ci_high", "min", "max")
        ]
        + [f"{c}_median" for c in MEDIAN_ONLY]
    )
    if cells.empty:
        return pd.DataFrame(columns=columns)
    data = cells.copy()
    for c in ("competing", "straggler"):
        data[c] = data[c].fillna(False).astype(bool) if c in data else False
    for c in MEDIAN_ONLY:  # NaN where a measure is absent (None) or missing: medians skip them
        data[c] = pd.to_numeric(data[c], errors="coerce") if c in data else np.nan
    thr = "throughput_samples_per_s"
    out = (
        data.groupby(SUMMARY_KEYS, sort=True)
        .agg(
            n=(thr, "size"),
            competing_reps=("competing", "sum"),
            straggler_reps=("straggler", "sum"),
            **{f"{thr}_{f}": (thr, f) for f in ("median", "min", "max")},
            **{
                f"{m}_{f}": (m, f)
                for m in ("speedup", "scaling_efficiency")
                for f in ("min", "max")
            },
            **{f"{c}_median": (c, "median") for c in MEDIAN_ONLY},
        )
        .reset_index()
    )
    values = data[thr].to_numpy(dtype=float)
    world = data["world_size"].to_numpy(dtype=float)
    is_base = (data["nodes"] == data["baseline_nodes"]).to_numpy()
    base_rows = {key: idx[is_base[idx]] for key, idx in data.groupby(GROUP).indices.items()}
    row_keys, row_idx = zip(*sorted(data.groupby(SUMMARY_KEYS).indices.items()))
    assert list(row_keys) == list(out[SUMMARY_KEYS].itertuples(index=False, name=None))
    groups = list(base_rows)
    bases = [values[base_rows[g]] for g in groups]
    where = {g: i for i, g in enumerate(groups)}
    group_of = [where[key] for key in out[GROUP].itertuples(index=False, name=None)]
    base_idx = [base_rows[groups[g]] for g in group_of]
    out["n_baseline"] = [len(b) for b in base_idx]
    base_median = np.array([np.median(b) for b in bases])[group_of]
    scale = out["world_size"].to_numpy(dtype=float) / np.array([world[b[0]] for b in base_idx])
    speedup = out[f"{thr}_median"].to_numpy() / base_median
    out["speedup_median"] = speedup
    out["scaling_efficiency_median"] = speedup / scale
    ci = bootstrap_cis(
        [values[idx] for idx in row_idx],
        np.random.default_rng(BOOTSTRAP_SEED),
        bases=bases,
        base_of=group_of,
        own_base=[np.array_equal(idx, b) for idx, b in zip(row_idx, base_idx)],
    )
    out[f"{thr}_ci_low"], out[f"{thr}_ci_high"] = ci.median_low, ci.median_high
    out["speedup_ci_low"], out["speedup_ci_high"] = ci.ratio_low, ci.ratio_high
    out["scaling_efficiency_ci_low"] = ci.ratio_low / scale
    out["scaling_efficiency_ci_high"] = ci.ratio_high / scale
    out = out.astype({"competing_reps": int, "straggler_reps": int})
    return out[columns]


def stragglers(rank_throughputs: list[float], threshold: float) -> list[int]:
    """Ranks (by position) slower than the median rank by more than `threshold` (a fraction)."""
    median = statistics.median(rank_throughputs)  # a few values per cell: no numpy call
    return [i for i, t in enumerate(rank_throughputs) if t < median * (1 - threshold)]

"""Scaling statistics: speedup, efficiency and honest intervals for their medians.

speedup(N)    = median throughput(N) / median throughput(baseline)
efficiency(N) = speedup(N) / (world_size(N) / world_size(baseline))
The same formulas hold under both batch policies: under `weak` the work per rank is fixed, under
`strong` the work per step is fixed, and throughput (samples/s) is the measure in both.
The baseline is the smallest world size measured in the same hardware/framework/model/policy/
precision/mode/parallelism group: world size 1 where it was measured (config
axes.ranks_per_node: 1 GPU of one node), else the fewest ranks per node on the fewest nodes. A
table of one ranks per node per group (every study without the axis) thus keeps its baseline:
the 1-node cell, or the smallest node count present when that cell is missing. Columns
`baseline_nodes` and `baseline_world_size` say which.

Repetitions (separate jobs) are the independent samples. The interval of a median is the
nonparametric order-statistic confidence interval (Hoefler & Belli, SC'15, rule 5): the sorted
repetitions' ranks (l, n+1-l) with the largest l for which P(x(l) <= median <= x(n+1-l)), from
the binomial distribution (scipy.stats.binom), is at least CI_LEVEL. That needs n >= 6 for 95 %;
with 2 to 5 repetitions the interval is the min-max RANGE (labelled as such, never called a CI),
with one there is none. A ratio of medians (speedup) takes the conservative quotient of the two
medians' intervals, [low(x) / high(base), high(x) / low(base)], labelled by the weaker of the
two; a baseline row's speedup is exactly 1. Column `interval` (throughput) and
`speedup_interval` say which kind each row has: ci, range, none or exact (`median_interval`,
`ratio_interval`: the one implementation, used by the tables, the figures and the report).
"""

from __future__ import annotations

import statistics
from functools import cache

import numpy as np
import pandas as pd
from scipy.stats import binom

from dlscale.study.cell import AXES, DEFAULT_PARALLELISM

# A scaling group: every axis but the node count (speedup and efficiency compare the world sizes
# of one group, its node counts and ranks per node; a cell's key, dlscale.study.cell.KEY, adds
# those and the repetition).
GROUP = [axis for axis in AXES if axis != "nodes"]
CI_LEVEL = 0.95
# Interval kinds, weakest first.
NONE, RANGE, CI, EXACT = "none", "range", "ci", "exact"
_STRENGTH = {NONE: 0, RANGE: 1, CI: 2, EXACT: 3}


@cache
def order_statistic_ranks(n: int, level: float = CI_LEVEL) -> tuple[int, int] | None:
    """1-based ranks (l, n + 1 - l) of the sorted sample that bracket the median with
    probability >= level: the largest l with 2 * P(Binomial(n, 1/2) <= l - 1) <= 1 - level.
    None when even (1, n) does not reach the level (n < 6 for 95 %)."""
    alpha = (1 - level) / 2
    k = int(binom.ppf(alpha, n, 0.5))  # smallest k with P(B <= k) >= alpha
    if binom.cdf(k, n, 0.5) > alpha + 1e-12:
        k -= 1
    if k < 0:
        return None
    return k + 1, n - k


def ci_coverage(n: int, ranks: tuple[int, int]) -> float:
    """P(x(l) <= median <= x(u)) for a continuous distribution: 1 - 2 P(B <= l - 1)."""
    return float(1 - 2 * binom.cdf(ranks[0] - 1, n, 0.5))


def median_interval(values, level: float = CI_LEVEL) -> tuple[float, float, str]:
    """(low, high, kind) for the median of `values`: the order-statistic CI (kind "ci") where
    n allows, the min-max range ("range") for 2 <= n below that, nothing ("none") for n <= 1."""
    x = np.sort(np.asarray(values, dtype=float))
    n = len(x)
    if n < 2:
        return np.nan, np.nan, NONE
    ranks = order_statistic_ranks(n, level)
    if ranks is None:
        return float(x[0]), float(x[-1]), RANGE
    return float(x[ranks[0] - 1]), float(x[ranks[1] - 1]), CI


def ratio_interval(
    x: tuple[float, float, str], base: tuple[float, float, str]
) -> tuple[float, float, str]:
    """Conservative interval of median(x) / median(base) from the two medians' intervals
    (median_interval results): [low_x / high_base, high_x / low_base], of the weaker kind."""
    kind = min(x[2], base[2], key=_STRENGTH.__getitem__)
    if kind == NONE:
        return np.nan, np.nan, NONE
    return x[0] / base[1], x[1] / base[0], kind


BOOTSTRAP_RESAMPLES = 999


def bootstrap_interval(
    samples, statistic, level: float = CI_LEVEL, n_resamples: int = BOOTSTRAP_RESAMPLES
) -> tuple[np.ndarray, np.ndarray, str]:
    """(low, high, kind) of a vector `statistic(*samples)` over independent samples (e.g. the
    repetitions of each node count), by scipy.stats.bootstrap (each sample resampled on its
    own). The kind follows median_interval's rule for the smallest sample: a percentile CI
    ("ci") where every sample has the n an order-statistic CI needs, the min-max over the
    resamples ("range") for 2 <= n below that, nothing ("none") when a sample has one value."""
    from scipy.stats import bootstrap

    samples = [np.asarray(s) for s in samples]
    n = min((len(s) for s in samples), default=0)
    if n < 2:
        shape = np.shape(statistic(*samples))
        return np.full(shape, np.nan), np.full(shape, np.nan), NONE
    res = bootstrap(
        samples,
        statistic,
        vectorized=False,
        paired=False,
        n_resamples=n_resamples,
        confidence_level=level,
        method="percentile",
        random_state=np.random.default_rng(0),
    )
    if order_statistic_ranks(n, level) is None:
        dist = res.bootstrap_distribution
        return np.nanmin(dist, axis=-1), np.nanmax(dist, axis=-1), RANGE
    return res.confidence_interval.low, res.confidence_interval.high, CI


def interval_label(kind: str, n: int) -> str:
    """How a table or figure names an interval of this kind."""
    return {CI: f"{CI_LEVEL:.0%} CI", RANGE: "range", NONE: "no interval", EXACT: "exact"}[
        kind
    ] + f" (n={n})"


# the interval alone, for a sentence that already says what the point is (the report)
CI_INTERVAL = (
    f"the {CI_LEVEL:.0%} nonparametric order-statistic CI "
    f"(binomial, n >= {min(n for n in range(2, 50) if order_statistic_ranks(n))}), "
    "the min-max range for fewer repetitions, none for one repetition"
)
CI_METHOD = f"median over repetitions; interval: {CI_INTERVAL.removeprefix('the ')}"


def with_axes(cells: pd.DataFrame) -> pd.DataFrame:
    """The table with every axis column: an axis added after it was written (parallelism)
    takes the value every earlier cell had; ranks per node, where a table lacks them, are its
    world size over its nodes."""
    if "parallelism" not in cells.columns:
        cells = cells.assign(parallelism=DEFAULT_PARALLELISM)
    if "ranks_per_node" not in cells.columns and {"world_size", "nodes"} <= set(cells.columns):
        cells = cells.assign(ranks_per_node=cells["world_size"] // cells["nodes"])
    return cells


def baseline_rows(cells: pd.DataFrame) -> pd.Series:
    """Which rows are their group's baseline: the smallest world size of the group (world size
    1 where measured; with one ranks per node per group, the smallest node count). That world
    size has one node count: the fewest nodes times the fewest ranks per node."""
    world = pd.to_numeric(cells["world_size"])
    return world == world.groupby([cells[g] for g in GROUP]).transform("min")


def add_speedup(cells: pd.DataFrame) -> pd.DataFrame:
    """Per-cell speedup and efficiency against the group's baseline (median over its reps)."""
    out = with_axes(cells)
    if out.empty:
        for col in ("baseline_nodes", "baseline_throughput", "speedup", "scaling_efficiency"):
            out[col] = pd.Series(dtype=float)
        return out
    is_base = baseline_rows(out)
    base = (
        out[is_base]
        .groupby(GROUP)
        .agg(
            baseline_nodes=("nodes", "first"),
            baseline_throughput=("throughput_samples_per_s", "median"),
            baseline_world_size=("world_size", "first"),
        )
        .reset_index()
    )
    out = out.merge(base, on=GROUP, how="left")
    out["speedup"] = out["throughput_samples_per_s"] / out["baseline_throughput"]
    out["scaling_efficiency"] = out["speedup"] / (out["world_size"] / out["baseline_world_size"])
    return out


# Per-cell measures summarised by their median over repetitions (no interval).
MEDIAN_ONLY = [
    "step_seconds_median",
    "compute_seconds_median",
    "comm_fraction",
    "allreduce_busbw_gb_per_s",
    "joules_per_sample",
    "peak_rss_mb_max",
    # memory per rank (the memory figure; Adapter.memory_per_rank)
    "state_bytes_per_rank_max",
    "peak_allocated_mb_max",
    # telemetry (dlscale.rank.telemetry): the utilisation the telemetry figure draws
    "gpu_util_pct_mean",
    "gpu_util_pct_rank_min",
    "cpu_util_pct_mean",
    "cpu_util_pct_rank_min",
    # tokens and model FLOPs (dlscale.analysis.mfu): the MFU figure draws these
    "throughput_tokens_per_s",
    "achieved_tflops_per_device",
    "mfu",
]


SUMMARY_KEYS = GROUP + [
    "nodes",
    "ranks_per_node",
    "world_size",
    "per_rank_batch",
    "global_batch",
    "baseline_nodes",
    "baseline_world_size",
]


def scaling_summary(cells: pd.DataFrame) -> pd.DataFrame:
    """One row per group x node count: point estimates, intervals (median_interval,
    ratio_interval) with their kind, min/max and n. Per-row statistics come from one groupby."""
    columns = (
        SUMMARY_KEYS
        + ["n", "n_baseline", "interval", "speedup_interval", "competing_reps", "straggler_reps"]
        + ["placements"]
        + [
            f"{m}_{s}"
            for m in ("throughput_samples_per_s", "speedup", "scaling_efficiency")
            for s in ("median", "ci_low", "ci_high", "min", "max")
        ]
        + [f"{c}_median" for c in MEDIAN_ONLY]
    )
    if cells.empty:
        return pd.DataFrame(columns=columns)
    cells = with_axes(cells)
    data = cells.copy()
    for c in ("competing", "straggler"):
        data[c] = data[c].fillna(False).astype(bool) if c in data else False
    # where the repetitions ran: their distinct node sets (1: every repetition on the same
    # nodes, as a pack places them; more: node-to-node variance is part of the spread)
    data["hosts"] = data["hosts"].fillna("") if "hosts" in data else ""
    for c in MEDIAN_ONLY:  # NaN where a measure is absent (None) or missing: medians skip them
        data[c] = pd.to_numeric(data[c], errors="coerce") if c in data else np.nan
    thr = "throughput_samples_per_s"
    out = (
        data.groupby(SUMMARY_KEYS, sort=True)
        .agg(
            n=(thr, "size"),
            competing_reps=("competing", "sum"),
            straggler_reps=("straggler", "sum"),
            placements=("hosts", "nunique"),
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
    is_base = baseline_rows(data).to_numpy()
    base_rows = {key: idx[is_base[idx]] for key, idx in data.groupby(GROUP).indices.items()}
    row_keys, row_idx = zip(*sorted(data.groupby(SUMMARY_KEYS).indices.items()))
    assert list(row_keys) == list(out[SUMMARY_KEYS].itertuples(index=False, name=None))
    base_idx = [base_rows[key] for key in out[GROUP].itertuples(index=False, name=None)]
    out["n_baseline"] = [len(b) for b in base_idx]
    base_median = np.array([np.median(values[b]) for b in base_idx])
    scale = out["world_size"].to_numpy(dtype=float) / np.array([world[b[0]] for b in base_idx])
    speedup = out[f"{thr}_median"].to_numpy() / base_median
    out["speedup_median"] = speedup
    out["scaling_efficiency_median"] = speedup / scale
    base_cache: dict[bytes, tuple] = {}
    rows, ratios = [], []
    for idx, b in zip(row_idx, base_idx):
        own = median_interval(values[idx])
        rows.append(own)
        if np.array_equal(idx, b):
            ratios.append((1.0, 1.0, EXACT))
            continue
        key = b.tobytes()
        if key not in base_cache:
            base_cache[key] = median_interval(values[b])
        ratios.append(ratio_interval(own, base_cache[key]))
    out[f"{thr}_ci_low"], out[f"{thr}_ci_high"], out["interval"] = map(list, zip(*rows))
    ratio_low, ratio_high, out["speedup_interval"] = map(np.array, zip(*ratios))
    out["speedup_ci_low"], out["speedup_ci_high"] = ratio_low, ratio_high
    out["scaling_efficiency_ci_low"] = ratio_low.astype(float) / scale
    out["scaling_efficiency_ci_high"] = ratio_high.astype(float) / scale
    out = out.astype({"competing_reps": int, "straggler_reps": int, "placements": int})
    return out[columns]


def stragglers(rank_throughputs: list[float], threshold: float) -> list[int]:
    """Ranks (by position) slower than the median rank by more than `threshold` (a fraction)."""
    median = statistics.median(rank_throughputs)  # a few values per cell: no numpy call
    return [i for i, t in enumerate(rank_throughputs) if t < median * (1 - threshold)]

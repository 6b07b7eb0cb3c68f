"""Speedup and efficiency on constructed numbers with known answers."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from dlscale.analysis.stats import (
    CI,
    EXACT,
    NONE,
    RANGE,
    add_speedup,
    ci_coverage,
    median_interval,
    order_statistic_ranks,
    ratio_interval,
    scaling_summary,
    stragglers,
)
from dlscale.store.metrics_summary import bus_bandwidth


def cells(rows):
    base = {
        "hardware": "cpu",
        "framework": "pytorch",
        "model": "m",
        "precision": "fp32",
        "mode": "eager",
        "per_rank_batch": 8,
    }
    out = []
    for policy, nodes, rep, world, thr in rows:
        out.append(
            {
                **base,
                "policy": policy,
                "nodes": nodes,
                "rep": rep,
                "world_size": world,
                "global_batch": 8 * world,
                "throughput_samples_per_s": thr,
            }
        )
    return pd.DataFrame(out)


def test_speedup_and_efficiency_against_one_node_median():
    df = add_speedup(
        cells(
            [
                ("weak", 1, 1, 2, 90.0),
                ("weak", 1, 2, 2, 110.0),  # baseline median 100
                ("weak", 2, 1, 4, 180.0),
                ("weak", 4, 1, 8, 300.0),
            ]
        )
    )
    got = df.set_index(["nodes", "rep"])
    assert got.loc[(1, 1), "speedup"] == pytest.approx(0.9)
    assert got.loc[(2, 1), "speedup"] == pytest.approx(1.8)
    assert got.loc[(2, 1), "scaling_efficiency"] == pytest.approx(0.9)  # 1.8 / (4/2)
    assert got.loc[(4, 1), "scaling_efficiency"] == pytest.approx(0.75)  # 3.0 / 4
    assert set(df["baseline_nodes"]) == {1}


def test_groups_are_separate_and_missing_one_node_uses_smallest():
    df = add_speedup(
        cells(
            [
                ("weak", 1, 1, 1, 100.0),
                ("weak", 2, 1, 2, 200.0),
                ("strong", 2, 1, 2, 50.0),
                ("strong", 4, 1, 4, 75.0),
            ]
        )
    )
    strong = df[df["policy"] == "strong"].set_index("nodes")
    assert strong.loc[4, "baseline_nodes"] == 2
    assert strong.loc[4, "speedup"] == pytest.approx(1.5)
    assert strong.loc[4, "scaling_efficiency"] == pytest.approx(0.75)
    weak = df[df["policy"] == "weak"].set_index("nodes")
    assert weak.loc[2, "scaling_efficiency"] == pytest.approx(1.0)


def test_summary_median_min_max_and_n():
    df = scaling_summary(
        add_speedup(
            cells(
                [
                    ("weak", 1, 1, 1, 100.0),
                    ("weak", 1, 2, 1, 100.0),
                    ("weak", 2, 1, 2, 150.0),
                    ("weak", 2, 2, 2, 170.0),
                    ("weak", 2, 3, 2, 190.0),
                ]
            )
        )
    )
    row = df[df["nodes"] == 2].iloc[0]
    assert row["n"] == 3
    assert row["throughput_samples_per_s_median"] == pytest.approx(170.0)
    assert row["speedup_min"] == pytest.approx(1.5) and row["speedup_max"] == pytest.approx(1.9)
    assert row["speedup_median"] == pytest.approx(1.7)  # ratio of medians
    assert row["scaling_efficiency_median"] == pytest.approx(0.85)
    assert row["n_baseline"] == 2
    # 3 repetitions: the interval is the min-max range, and says so; the baseline (2 equal
    # repetitions, range [100, 100]) divides it
    assert row["interval"] == RANGE and row["speedup_interval"] == RANGE
    assert (row["throughput_samples_per_s_ci_low"], row["throughput_samples_per_s_ci_high"]) == (
        150.0,
        190.0,
    )
    assert row["speedup_ci_low"] == pytest.approx(1.5)
    assert row["speedup_ci_high"] == pytest.approx(1.9)
    assert row["scaling_efficiency_ci_low"] == pytest.approx(row["speedup_ci_low"] / 2)


def test_summary_intervals_are_those_of_median_interval_and_ratio_interval():
    """scaling_summary runs the tested functions: its intervals are median_interval's on the
    rows' repetitions and ratio_interval's against the baseline's; the baseline row's speedup is
    exactly 1."""
    base = [90.0, 95.0, 100.0, 105.0, 110.0, 115.0]  # n = 6: a 95 % CI (ranks 1 and 6)
    two = [150.0, 160.0, 170.0, 180.0, 190.0, 200.0, 210.0]
    rows = [("weak", 1, i + 1, 1, v) for i, v in enumerate(base)]
    rows += [("weak", 2, i + 1, 2, v) for i, v in enumerate(two)]
    df = scaling_summary(add_speedup(cells(rows))).set_index("nodes")
    own, b = median_interval(two), median_interval(base)
    assert own == (150.0, 210.0, CI) and b == (90.0, 115.0, CI)
    low, high, kind = ratio_interval(own, b)
    assert (low, high, kind) == (150.0 / 115.0, 210.0 / 90.0, CI)
    assert df.loc[2, "speedup_ci_low"] == low and df.loc[2, "speedup_ci_high"] == high
    assert df.loc[2, "scaling_efficiency_ci_high"] == pytest.approx(high / 2)
    assert df.loc[2, "interval"] == CI and df.loc[2, "speedup_interval"] == CI
    assert df.loc[1, "speedup_ci_low"] == df.loc[1, "speedup_ci_high"] == 1.0
    assert df.loc[1, "speedup_interval"] == EXACT


def test_empty_tables_keep_their_columns():
    empty = add_speedup(
        cells([]).reindex(
            columns=[
                "hardware",
                "framework",
                "model",
                "policy",
                "precision",
                "nodes",
                "rep",
                "world_size",
                "throughput_samples_per_s",
            ]
        )
    )
    assert "scaling_efficiency" in empty.columns
    assert "scaling_efficiency_median" in scaling_summary(empty).columns


def test_single_repetitions_have_no_interval():
    assert median_interval([5.0])[2] == NONE and np.isnan(median_interval([5.0])[0])
    assert ratio_interval(median_interval([5.0]), median_interval([2.0, 3.0]))[2] == NONE


@pytest.mark.parametrize(
    "n, ranks, coverage",
    [  # known answers: coverage = 1 - 2 P(Binomial(n, 1/2) <= l - 1)
        (5, None, None),  # (1, 5) covers only 1 - 2/32 = 0.9375 < 0.95
        (6, (1, 6), 1 - 2 / 64),
        (8, (1, 8), 1 - 2 / 256),
        (9, (2, 8), 1 - 2 * 10 / 512),
        (10, (2, 9), 1 - 2 * 11 / 1024),
        (12, (3, 10), 1 - 2 * 79 / 4096),
    ],
)
def test_order_statistic_ranks_known_answers(n, ranks, coverage):
    assert order_statistic_ranks(n) == ranks
    if ranks:
        assert ci_coverage(n, ranks) == pytest.approx(coverage)
        assert ci_coverage(n, ranks) >= 0.95
        # one step narrower would fall below the level
        narrower = (ranks[0] + 1, ranks[1] - 1)
        assert narrower[0] > narrower[1] or ci_coverage(n, narrower) < 0.95


def test_fewer_than_six_repetitions_give_a_range_not_a_ci():
    assert median_interval([3.0, 1.0]) == (1.0, 3.0, RANGE)
    assert median_interval([5.0, 1.0, 4.0, 2.0, 3.0]) == (1.0, 5.0, RANGE)
    assert median_interval([6.0, 1.0, 4.0, 2.0, 3.0, 5.0]) == (1.0, 6.0, CI)
    assert median_interval(list(range(10, 0, -1))) == (2.0, 9.0, CI)


def test_order_statistic_interval_covers_the_true_median_at_least_95_percent():
    """Coverage on constructed samples with a known answer: exponential(1) (skewed), n = 10,
    true median ln 2; the exact method's coverage is 0.9785, so over 1,000 studies it must be
    at least 0.95 (and below 1: the interval is not trivially wide)."""
    rng = np.random.default_rng(12345)
    trials, covered = 1000, 0
    for _ in range(trials):
        low, high, kind = median_interval(rng.exponential(1.0, size=10))
        assert kind == CI
        covered += low <= np.log(2) <= high
    assert 0.95 <= covered / trials < 1.0


def test_ratio_interval_covers_the_true_ratio():
    rng = np.random.default_rng(7)
    covered = 0
    for _ in range(200):
        x = rng.normal(300.0, 15.0, size=25)
        b = rng.normal(100.0, 5.0, size=25)
        low, high, _ = ratio_interval(median_interval(x), median_interval(b))
        covered += low <= 3.0 <= high
    assert covered / 200 >= 0.95


@pytest.mark.parametrize("n, factor", [(1, 0.0), (2, 1.0), (4, 1.5), (8, 1.75)])
def test_bus_bandwidth_formula(n, factor):
    assert bus_bandwidth(10.0, n) == pytest.approx(10.0 * factor)


def test_straggler_flag():
    assert stragglers([100, 100, 100, 100], 0.1) == []
    assert stragglers([100, 100, 95, 80], 0.1) == [3]  # median 97.5 -> limit 87.75
    assert stragglers([100, 89], 0.1) == []  # median 94.5 -> limit 85.05


def test_the_summary_counts_where_the_repetitions_ran():
    """placements: the distinct node sets of a row's repetitions (cells.csv `hosts`): 1 where
    every repetition ran on the same nodes (as a pack places them), more where node-to-node
    variance is part of the spread; the report's cell table marks the latter."""
    from dlscale.outputs.cell_table import _flags

    data = cells([("weak", 1, 1, 1, 100.0), ("weak", 1, 2, 1, 101.0), ("weak", 2, 1, 2, 190.0)])
    data["hosts"] = ["n1", "n2", "n1 n2"]
    df = scaling_summary(add_speedup(data)).set_index("nodes")
    assert df.loc[1, "placements"] == 2 and df.loc[2, "placements"] == 1
    row = df.reset_index().iloc[0]
    assert "$^\\S$" in _flags(row) and "$^\\S$" not in _flags(df.reset_index().iloc[1])

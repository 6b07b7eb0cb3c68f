"""Speedup and efficiency on constructed numbers with known answers."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from dlscale.metrics import bus_bandwidth
from dlscale.stats import BOOTSTRAP_SEED, add_speedup, bootstrap_cis, scaling_summary, stragglers


def median_ci(x, rng):
    """The interval of one sample's median, from the batched function scaling_summary calls."""
    ci = bootstrap_cis([x], rng)
    return ci.median_low[0], ci.median_high[0]


def ratio_ci(x, base, rng):
    """The interval of median(x) / median(base), from the same batched function."""
    ci = bootstrap_cis([x], rng, bases=[base], base_of=[0])
    return ci.ratio_low[0], ci.ratio_high[0]


def cells(rows):
    base = {
        "hardware": "cpu",
        "framework": "pytorch",
        "model": "m",
        "precision": "fp32",
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
    # constant baseline: the speedup interval is the throughput interval / 100
    assert 1.5 <= row["speedup_ci_low"] <= 1.7 <= row["speedup_ci_high"] <= 1.9
    assert row["scaling_efficiency_ci_low"] == pytest.approx(row["speedup_ci_low"] / 2)


def test_summary_intervals_are_those_of_bootstrap_cis():
    """scaling_summary runs the tested bootstrap: its intervals are bootstrap_cis's on the rows'
    repetitions (same stream); the baseline row is its own baseline (speedup 1 on every
    resample) and shares its resamples with the other rows' speedups."""
    df = scaling_summary(
        add_speedup(
            cells(
                [
                    ("weak", 1, 1, 1, 90.0),
                    ("weak", 1, 2, 1, 100.0),
                    ("weak", 1, 3, 1, 115.0),
                    ("weak", 2, 1, 2, 150.0),
                    ("weak", 2, 2, 2, 170.0),
                    ("weak", 2, 3, 2, 190.0),
                ]
            )
        )
    ).set_index("nodes")
    base, two = np.array([90.0, 100.0, 115.0]), np.array([150.0, 170.0, 190.0])
    ci = bootstrap_cis(
        [base, two],
        np.random.default_rng(BOOTSTRAP_SEED),
        bases=[base],
        base_of=[0, 0],
        own_base=[True, False],
    )
    assert df["throughput_samples_per_s_ci_low"].tolist() == ci.median_low.tolist()
    assert df["throughput_samples_per_s_ci_high"].tolist() == ci.median_high.tolist()
    assert df["speedup_ci_low"].tolist() == ci.ratio_low.tolist()
    assert df.loc[1, "speedup_ci_low"] == df.loc[1, "speedup_ci_high"] == 1.0
    assert df.loc[2, "scaling_efficiency_ci_high"] == pytest.approx(ci.ratio_high[1] / 2)


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
    rng = np.random.default_rng(0)
    assert all(np.isnan(v) for v in median_ci(np.array([5.0]), rng))
    assert all(np.isnan(v) for v in ratio_ci(np.array([5.0]), np.array([2.0]), rng))


def test_bootstrap_interval_covers_the_true_median_about_95_percent():
    """Coverage on constructed samples with a known answer: normal(100, 10), n=30, the true
    median is 100; a 95 % interval must cover it in roughly 95 % of 400 independent studies
    (the percentile bootstrap of a median runs a little below nominal at this n)."""
    rng = np.random.default_rng(12345)
    covered = 0
    trials = 400
    for _ in range(trials):
        sample = rng.normal(100.0, 10.0, size=30)
        low, high = median_ci(sample, rng)
        covered += low <= 100.0 <= high
    assert 0.88 <= covered / trials <= 0.99


def test_ratio_interval_covers_the_true_ratio():
    rng = np.random.default_rng(7)
    covered = 0
    for _ in range(200):
        x = rng.normal(300.0, 15.0, size=25)
        b = rng.normal(100.0, 5.0, size=25)
        low, high = ratio_ci(x, b, rng)
        covered += low <= 3.0 <= high
    assert 0.88 <= covered / 200 <= 1.0


@pytest.mark.parametrize("n, factor", [(1, 0.0), (2, 1.0), (4, 1.5), (8, 1.75)])
def test_bus_bandwidth_formula(n, factor):
    assert bus_bandwidth(10.0, n) == pytest.approx(10.0 * factor)


def test_straggler_flag():
    assert stragglers([100, 100, 100, 100], 0.1) == []
    assert stragglers([100, 100, 95, 80], 0.1) == [3]  # median 97.5 -> limit 87.75
    assert stragglers([100, 89], 0.1) == []  # median 94.5 -> limit 85.05

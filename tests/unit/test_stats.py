"""Speedup and efficiency on constructed numbers with known answers."""
from __future__ import annotations

import pandas as pd
import pytest

from dlscale.stats import add_speedup, scaling_summary


def cells(rows):
    base = {"hardware": "cpu", "framework": "pytorch", "model": "m", "precision": "fp32",
            "per_rank_batch": 8}
    out = []
    for policy, nodes, rep, world, thr in rows:
        out.append({**base, "policy": policy, "nodes": nodes, "rep": rep, "world_size": world,
                    "global_batch": 8 * world, "throughput_samples_per_s": thr})
    return pd.DataFrame(out)


def test_speedup_and_efficiency_against_one_node_median():
    df = add_speedup(cells([
        ("weak", 1, 1, 2, 90.0), ("weak", 1, 2, 2, 110.0),    # baseline median 100
        ("weak", 2, 1, 4, 180.0), ("weak", 4, 1, 8, 300.0),
    ]))
    got = df.set_index(["nodes", "rep"])
    assert got.loc[(1, 1), "speedup"] == pytest.approx(0.9)
    assert got.loc[(2, 1), "speedup"] == pytest.approx(1.8)
    assert got.loc[(2, 1), "scaling_efficiency"] == pytest.approx(0.9)     # 1.8 / (4/2)
    assert got.loc[(4, 1), "scaling_efficiency"] == pytest.approx(0.75)    # 3.0 / 4
    assert set(df["baseline_nodes"]) == {1}


def test_groups_are_separate_and_missing_one_node_uses_smallest():
    df = add_speedup(cells([
        ("weak", 1, 1, 1, 100.0), ("weak", 2, 1, 2, 200.0),
        ("strong", 2, 1, 2, 50.0), ("strong", 4, 1, 4, 75.0),
    ]))
    strong = df[df["policy"] == "strong"].set_index("nodes")
    assert strong.loc[4, "baseline_nodes"] == 2
    assert strong.loc[4, "speedup"] == pytest.approx(1.5)
    assert strong.loc[4, "scaling_efficiency"] == pytest.approx(0.75)
    weak = df[df["policy"] == "weak"].set_index("nodes")
    assert weak.loc[2, "scaling_efficiency"] == pytest.approx(1.0)


def test_summary_median_min_max_and_n():
    df = scaling_summary(add_speedup(cells([
        ("weak", 1, 1, 1, 100.0), ("weak", 1, 2, 1, 100.0),
        ("weak", 2, 1, 2, 150.0), ("weak", 2, 2, 2, 170.0), ("weak", 2, 3, 2, 190.0),
    ])))
    row = df[df["nodes"] == 2].iloc[0]
    assert row["n"] == 3
    assert row["throughput_samples_per_s_median"] == pytest.approx(170.0)
    assert row["speedup_min"] == pytest.approx(1.5) and row["speedup_max"] == pytest.approx(1.9)
    assert row["scaling_efficiency_median"] == pytest.approx(0.85)


def test_empty_tables_keep_their_columns():
    empty = add_speedup(cells([]).reindex(columns=["hardware", "framework", "model", "policy",
                                                   "precision", "nodes", "rep", "world_size",
                                                   "throughput_samples_per_s"]))
    assert "scaling_efficiency" in empty.columns
    assert "scaling_efficiency_median" in scaling_summary(empty).columns

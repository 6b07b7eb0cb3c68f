"""Scaling arithmetic: speedup and efficiency against the smallest node count of a group.

speedup(N)    = throughput(N) / throughput(baseline)
efficiency(N) = speedup(N) / (world_size(N) / world_size(baseline))
The same formulas hold under both batch policies: under `weak` the work per rank is fixed, under
`strong` the work per step is fixed, and throughput (samples/s) is the measure in both.
The baseline is the 1-node cell of the same hardware/framework/model/policy/precision, or the
smallest node count present when that cell is missing (column `baseline_nodes` says which).
"""
from __future__ import annotations

import pandas as pd

GROUP = ["hardware", "framework", "model", "policy", "precision"]
CELL_AXES = GROUP + ["nodes", "rep"]


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


def scaling_summary(cells: pd.DataFrame) -> pd.DataFrame:
    """One row per group x node count: median over repetitions with min/max and n."""
    cols = ["throughput_samples_per_s", "speedup", "scaling_efficiency"]
    keys = GROUP + ["nodes", "world_size", "per_rank_batch", "global_batch", "baseline_nodes"]
    if cells.empty:
        return pd.DataFrame(columns=keys + ["n"] + [f"{c}_{s}" for c in cols
                                                    for s in ("median", "min", "max")])
    agg = {f"{c}_{s}": (c, s) for c in cols for s in ("median", "min", "max")}
    agg["n"] = ("rep", "count")
    if "competing" in cells.columns:
        agg["competing_reps"] = ("competing", "sum")
    return cells.groupby(keys).agg(**agg).reset_index()

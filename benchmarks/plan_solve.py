"""The planner at its target size: 5 jobs x 4 partitions x 1..64 nodes
(dlscale.decisions.planner, CBC).

    PYTHONPATH=scripts .venv/bin/python benchmarks/plan_solve.py [--repeats 5] [--frameworks 2]

The predictions come from scaling models fitted (dlscale.analysis.scaling_model) to synthetic
cells of known parameters measured at 1..8 nodes (2 repetitions, 2 % noise) on each partition,
extended to 64 nodes (max_extrapolation 8): 5 models x 4 partitions x --frameworks series. Each
repeat plans three cases: min_time without limits, min_time within a charged node-hour budget
(half of the unconstrained plan's), min_node_hours within a deadline (twice the unconstrained
makespan). Prints per case the median and range over the repeats of the solve (the
lexicographic integer programs) and of the whole make_plan (with the alternatives and the
binding test, one more solve per constraint), the options the program holds and the plan.

Goal: the solve <= 2 s on a 2-core machine.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import pandas as pd

from dlscale.analysis import scaling_model as sm
from dlscale.decisions import planner as pl

PARTITIONS = {  # name: (throughput per node at 1 node, USL sigma, node-hour cost, power W)
    "cpu": (400.0, 0.02, 0.2, 400.0),
    "v100": (2_000.0, 0.04, 1.0, 1_600.0),
    "a100": (5_000.0, 0.05, 2.0, 2_000.0),
    "h100": (9_000.0, 0.06, 3.5, 2_800.0),
}
MODELS = ["cnn_small", "transformer_small", "resnet18", "resnet34", "resnet50"]


def synthetic_cells(frameworks: int, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    rows = []
    for hw, (lam, sigma, _, _) in PARTITIONS.items():
        for f in range(frameworks):
            for k, model in enumerate(MODELS):
                scale = (0.9**f) / (1 + k)
                for n in range(1, 9):
                    for rep in range(2):
                        x = lam * scale * n / (1 + sigma * (n - 1))
                        rows.append(
                            {
                                "hardware": hw,
                                "framework": f"fw{f}",
                                "model": model,
                                "policy": "weak",
                                "precision": "fp32",
                                "mode": "eager",
                                "nodes": n,
                                "rep": rep + 1,
                                "ranks_per_node": 1,
                                "world_size": n,
                                "per_rank_batch": 32,
                                "global_batch": 32 * n,
                                "throughput_samples_per_s": x * (1 + 0.02 * rng.standard_normal()),
                                "compute_seconds_median": np.nan,  # -> the USL
                                "allreduce_busbw_gb_per_s": np.nan,
                            }
                        )
    return pd.DataFrame(rows)


def summary(values: list[float]) -> str:
    return (
        f"{statistics.median(values):.3f} s ({min(values):.3f}..{max(values):.3f}, n={len(values)})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--frameworks", type=int, default=2)
    parser.add_argument(
        "--models", type=int, default=len(MODELS), help="the first N models (and jobs) only"
    )
    args = parser.parse_args()

    started = time.perf_counter()
    models = MODELS[: args.models]
    cells = synthetic_cells(args.frameworks)
    cells = cells[cells["model"].isin(models)]
    _, preds = sm.model_tables(cells, plan_nodes={hw: 64 for hw in PARTITIONS})
    n_series = cells.groupby(["hardware", "framework", "model"]).ngroups
    print(
        f"predictions: {len(preds)} rows for {n_series}"
        f" series, nodes {preds['nodes'].min()}..{preds['nodes'].max()} "
        f"(fitted in {time.perf_counter() - started:.1f} s, not part of the solve)"
    )
    parts = [pl.Partition(h, 64, cost, power) for h, (_, _, cost, power) in PARTITIONS.items()]
    jobs = [{"name": f"job{i + 1}", "model": m, "samples": 5e8} for i, m in enumerate(models)]
    free = pl.make_plan(preds, jobs, parts)
    cases = {
        "min_time": {},
        "min_time, budget": {"budget_node_hours": free.plan["charged_node_hours"].sum() / 2},
        "min_node_hours, deadline": {
            "objective": pl.MIN_NODE_HOURS,
            "deadline_hours": 2 * free.plan["hours"].max(),
        },
    }
    for name, kwargs in cases.items():
        solve, total = [], []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            result = pl.make_plan(preds, jobs, parts, **kwargs)
            total.append(time.perf_counter() - t0)
            solve.append(result.solve_seconds)
        print(f"\n== {name} {kwargs or ''}")
        print(f"options in the program: {len(result.options)} (binary variables)")
        print(f"solve: {summary(solve)}; make_plan total: {summary(total)}")
        cols = ["job", "framework", "hardware", "nodes", "hours", "charged_node_hours"]
        print(result.plan[cols].to_string(index=False))
        binding = result.constraints[result.constraints["binding"]]["constraint"].tolist()
        print(f"binding: {', '.join(binding) or 'none'}")


if __name__ == "__main__":
    main()

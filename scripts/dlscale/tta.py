"""Convergence cells -> time-to-accuracy tables (results/<study>/tables/).

convergence.csv        one row per convergence cell: reached or not, time-, epochs- and
                       samples-to-accuracy, the learning-rate rule and rates, provenance
epochs.csv             one row per convergence cell and epoch: train loss, validation accuracy,
                       epoch and cumulative training seconds, samples seen, learning rate
time_to_accuracy.csv   one row per group (hardware, framework, model, policy, precision, mode)
                       and node count: median time- and epochs-to-accuracy over repetitions with
                       their interval (dlscale.stats.median_interval: a 95 % order-statistic CI
                       for n >= 6, the min-max range below, none for one), how many
                       repetitions reached the target, the input pipeline (the smallest
                       loader-only / training throughput ratio, input-bound repetitions,
                       the longest staging), speedup against the group's smallest
                       node count and the ideal time (baseline x its world size / world size)

A cell that never reached its target is a row with reached = False and no time-to-accuracy
(never dropped). A median over repetitions counts such a repetition as longer than any that
reached (its time is at least its training time at the epoch cap): when half or more of a
point's repetitions did not reach the target, the point has no median (reached_reps says
how many did), and its interval is open above.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from .cell import KEY
from .method import CONVERGENCE, EPOCH, RANK_START
from .stats import GROUP, NONE, median_interval

EPOCH_FIELDS = [
    "epoch",
    "train_loss",
    "val_accuracy",
    "val_samples",
    "epoch_seconds",
    "training_seconds",
    "samples",
    "samples_seen",
    "steps",
    "learning_rate",
    "learning_rate_first",
    "validation_seconds",
]
OUTCOME_FIELDS = [
    "reached",
    "time_to_accuracy_s",
    "epochs_to_accuracy",
    "samples_to_accuracy",
    "target_accuracy",
    "max_epochs",
    "epochs_run",
    "best_val_accuracy",
    "final_val_accuracy",
    "training_seconds",
    "samples_seen",
    "lr_rule",
    "base_learning_rate",
    "reference_batch",
    "warmup_epochs",
    "effective_learning_rate",
    "dataset",
    "data_format",
    "train_samples",
    "val_samples",
    "warmup_pass_seconds",
    "startup_seconds",
    "validation_seconds",
    "loader_samples_per_s",
    "loader_train_ratio",
    "input_bound",
    "loader_batches",
    "stage_dir",
    "staged_seconds",
    "staged_bytes",
]
CELL_COLUMNS = [
    "study",
    *KEY,
    "world_size",
    "ranks_per_node",
    "per_rank_batch",
    "global_batch",
    *OUTCOME_FIELDS,
]
# From the row dlscale.collect.cell_rows makes of every cell.
PROVENANCE = [
    "nodes_seen",
    "hosts",
    "competing",
    "host_busy_cpus_max",
    "peak_rss_mb_max",
    "device_model",
    "libraries",
    "python",
    "launcher",
    "slurm_job_id",
    "git_commit",
    "config_hash",
    "metrics_path",
    "earlier_measurements",
]
EPOCH_COLUMNS = ["study", *KEY, "world_size", "global_batch", *EPOCH_FIELDS]


def convergence_rows(records: list[dict], base: dict) -> tuple[dict, list[dict]]:
    """A convergence cell's row (its outcome, from the convergence record) and its epoch rows
    (rank 0's epoch records: the global values every rank agrees on). `base`: the key columns
    and batch sizes dlscale.collect derives for every cell."""
    outcome = next(r["value"] for r in records if r["event"] == CONVERGENCE)
    epochs = [r["value"] for r in records if r["event"] == EPOCH and r["rank"] == 0]
    start = next(r["value"] for r in records if r["event"] == RANK_START and r["rank"] == 0)
    row = {k: base[k] for k in CELL_COLUMNS if k in base}
    row.update({k: outcome.get(k) for k in OUTCOME_FIELDS})
    row["data"] = start.get("data")
    # samples per second of training time, summed over ranks (real data, loading included)
    row["throughput_samples_per_s"] = outcome["samples_seen"] / outcome["training_seconds"]
    row.update({k: base.get(k) for k in PROVENANCE})
    keys = {k: base[k] for k in ("study", *KEY, "world_size", "global_batch")}
    return row, [{**keys, **{k: e[k] for k in EPOCH_FIELDS}} for e in epochs]


def _censored(part: pd.DataFrame, column: str, at_cap: str) -> np.ndarray:
    """A column's values over repetitions, a repetition that did not reach the target counted
    as +inf (it is longer than `at_cap`, its value at the epoch cap)."""
    reached = part["reached"].astype(bool).to_numpy()
    values = pd.to_numeric(part[column], errors="coerce").to_numpy(dtype=float)
    return np.where(reached, values, np.inf)


def numbers(part: pd.DataFrame, column: str) -> pd.Series:
    """A column as numbers (NaN where missing: tables from before the column existed)."""
    if column not in part:
        return pd.Series(np.nan, index=part.index)
    return pd.to_numeric(part[column], errors="coerce")


def _median(values: np.ndarray) -> float:
    """The median with +inf for not reached: NaN (no median) when half or more are +inf."""
    if not len(values) or np.isinf(values).sum() * 2 >= len(values):
        return np.nan
    return float(np.median(values))


# How a group's cells were trained: the same for every repetition, taken from the first.
SETTINGS = (
    "lr_rule",
    "base_learning_rate",
    "reference_batch",
    "effective_learning_rate",
    "target_accuracy",
    "max_epochs",
)


def time_to_accuracy_summary(cells: pd.DataFrame) -> pd.DataFrame:
    """One row per group x node count (see the module docstring)."""
    keys = [*GROUP, "nodes", "world_size", "per_rank_batch", "global_batch"]
    columns = [
        *keys,
        *SETTINGS,
        "n",
        "reached_reps",
        "interval",
        "time_to_accuracy_s_median",
        "time_to_accuracy_s_ci_low",
        "time_to_accuracy_s_ci_high",
        "epochs_to_accuracy_median",
        "epochs_to_accuracy_min",
        "epochs_to_accuracy_max",
        "training_seconds_at_cap_max",
        "best_val_accuracy_median",
        "loader_train_ratio_min",
        "input_bound_reps",
        "staged_seconds_max",
        "baseline_nodes",
        "tta_speedup",
        "tta_efficiency",
        "ideal_time_to_accuracy_s",
    ]
    if cells.empty:
        return pd.DataFrame(columns=columns)
    rows = []
    for key, part in cells.groupby(keys, sort=True):
        tta = _censored(part, "time_to_accuracy_s", "training_seconds")
        epochs = _censored(part, "epochs_to_accuracy", "epochs_run")
        low, high, kind = median_interval(tta) if len(tta) > 1 else (np.nan, np.nan, NONE)
        not_reached = ~part["reached"].astype(bool)
        first = part.iloc[0]
        rows.append(
            {
                **dict(zip(keys, key)),
                **{k: first[k] for k in SETTINGS},
                "n": len(part),
                "reached_reps": int(part["reached"].astype(bool).sum()),
                "interval": kind,
                "time_to_accuracy_s_median": _median(tta),
                "time_to_accuracy_s_ci_low": low,
                "time_to_accuracy_s_ci_high": high,
                "epochs_to_accuracy_median": _median(epochs),
                "epochs_to_accuracy_min": float(np.min(epochs)),
                "epochs_to_accuracy_max": float(np.max(epochs)),
                "training_seconds_at_cap_max": part.loc[not_reached, "training_seconds"].max()
                if not_reached.any()
                else np.nan,
                "best_val_accuracy_median": float(part["best_val_accuracy"].median()),
                # the input pipeline: the worst repetition's loader / train ratio, how many
                # repetitions were input-bound, the longest staging (NaN: not measured)
                "loader_train_ratio_min": numbers(part, "loader_train_ratio").min(),
                "input_bound_reps": int(part["input_bound"].eq(True).sum())
                if "input_bound" in part
                else 0,
                "staged_seconds_max": numbers(part, "staged_seconds").max(),
            }
        )
    out = pd.DataFrame(rows, columns=[c for c in columns if c not in _DERIVED])
    return _add_tta_speedup(out)[columns]


_DERIVED = ("baseline_nodes", "tta_speedup", "tta_efficiency", "ideal_time_to_accuracy_s")


def _add_tta_speedup(out: pd.DataFrame) -> pd.DataFrame:
    """Against the group's smallest node count: speedup = its median time-to-accuracy over
    this point's, efficiency = speedup over the ratio of world sizes, and the ideal time (the
    baseline's time x its world size / this world size)."""
    out = out.copy()
    base_nodes = out.groupby(GROUP)["nodes"].transform("min")
    base = out[out["nodes"] == base_nodes].set_index(GROUP)
    idx = list(out[GROUP].itertuples(index=False, name=None))
    base_tta = np.array([base.loc[k, "time_to_accuracy_s_median"] for k in idx], dtype=float)
    base_world = np.array([base.loc[k, "world_size"] for k in idx], dtype=float)
    tta = out["time_to_accuracy_s_median"].to_numpy(dtype=float)
    world = out["world_size"].to_numpy(dtype=float)
    out["baseline_nodes"] = base_nodes
    out["tta_speedup"] = base_tta / tta
    out["tta_efficiency"] = out["tta_speedup"] / (world / base_world)
    out["ideal_time_to_accuracy_s"] = base_tta * base_world / world
    return out


def convergence_tables(cell_rows: list[dict], epoch_rows: list[dict]) -> dict[str, pd.DataFrame]:
    """convergence, epochs and time_to_accuracy tables (empty, with their columns, when the
    study has no measured convergence cell)."""
    cells = pd.DataFrame(cell_rows, columns=None if cell_rows else CELL_COLUMNS)
    epochs = pd.DataFrame(epoch_rows, columns=None if epoch_rows else EPOCH_COLUMNS)
    return {
        "convergence": cells,
        "epochs": epochs,
        "time_to_accuracy": time_to_accuracy_summary(cells),
    }

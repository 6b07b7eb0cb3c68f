"""Convergence cells -> time-to-accuracy tables (results/<study>/tables/).

convergence.csv        one row per convergence cell: reached or not, time-, epochs- and
                       samples-to-accuracy, the learning-rate rule and rates, provenance
epochs.csv             one row per convergence cell and epoch: train loss, validation accuracy,
                       epoch and cumulative training seconds, samples seen, learning rate
time_to_accuracy.csv   one row per group (hardware, framework, model, policy, precision, mode)
                       and node count: median time- and epochs-to-accuracy over repetitions with
                       their interval (dlscale.analysis.stats.median_interval: a 95 %
                       order-statistic CI
                       for n >= 6, the min-max range below, none for one), how many
                       repetitions reached the target, the input pipeline (the smallest
                       loader-only / training throughput ratio, input-bound repetitions,
                       the longest staging), speedup against the group's smallest
                       node count and the ideal time (baseline x its world size / world size),
                       and the point's convergence validity (below)

A cell that never reached its target is a row with reached = False and no time-to-accuracy
(never dropped). A median over repetitions counts such a repetition as longer than any that
reached (its time is at least its training time at the epoch cap): when half or more of a
point's repetitions did not reach the target, the point has no median (reached_reps says
how many did), and its interval is open above.

Convergence validity (after MLPerf's reference convergence points, but flagging both ways): a
series (a group: every axis but the node count) has one reference convergence point, its
smallest global batch (at equal global batch, e.g. under the strong policy, its smallest node
count). Every other point's epochs-to-target are compared with a tolerance band around the
reference's (VALIDITY_METHOD): with 2 or more repetitions at the reference, the band is the
interval its repetitions give its median epochs (dlscale.analysis.stats.median_interval: the 95 %
order-statistic CI for n >= 6, the min-max range for 2 to 5; `epochs_band` says which); with one
repetition there is no band from repetitions, and the band is the reference's epochs x (1 -/+
convergence.validity_tolerance), labelled `fixed`. A point is `too_fast` when its own interval
(its value, for one repetition) lies wholly below the band, `too_slow` when wholly above it,
`in_band` otherwise; `not_reached` when it has no median, `no_reference` when its reference has
none. A flag marks a point to look at; nothing is dropped.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from dlscale.analysis.stats import CI_LEVEL, GROUP, NONE, median_interval, with_axes
from dlscale.study.cell import KEY
from dlscale.study.protocol import CONVERGENCE, EPOCH, RANK_START

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
    *KEY,  # ranks_per_node among them
    "world_size",
    "per_rank_batch",
    "global_batch",
    *OUTCOME_FIELDS,
]
# From the row dlscale.analysis.collect.cell_rows makes of every cell.
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
    and batch sizes dlscale.analysis.collect derives for every cell."""
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


def _censored(part: pd.DataFrame, column: str) -> np.ndarray:
    """A column's values over repetitions, a repetition that did not reach the target counted
    as +inf (it would take longer than its value at the epoch cap)."""
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


# Convergence validity (module docstring). The default of convergence.validity_tolerance
# (config/schemas/config.schema.json, where a study sets it): the fixed band's half-width,
# relative to the reference's epochs, used only where the reference has one repetition.
DEFAULT_VALIDITY_TOLERANCE = 0.25
REFERENCE, IN_BAND, TOO_FAST, TOO_SLOW = "reference", "in_band", "too_fast", "too_slow"
NOT_REACHED, NO_REFERENCE = "not_reached", "no_reference"
FIXED = "fixed"  # the band's kind where the reference has one repetition
VALIDITY_COLUMNS = [
    "epochs_to_accuracy_ci_low",  # the interval of the point's median epochs (kind: interval)
    "epochs_to_accuracy_ci_high",
    "reference_nodes",
    "reference_global_batch",
    "reference_n",
    "reference_epochs_median",
    "epochs_ratio",  # this point's median epochs / the reference's
    "epochs_band",  # ci, range (from the reference's repetitions), fixed (one repetition), none
    "epochs_band_low",
    "epochs_band_high",
    "validity_tolerance",  # the fixed band's relative half-width; NaN where not fixed
    "convergence_validity",  # reference, in_band, too_fast, too_slow, not_reached, no_reference
]
VALIDITY_METHOD = (
    "each series' reference convergence point is its smallest global batch (at equal global "
    "batch, its smallest node count); the band around the reference's epochs to target is the "
    f"interval of its median over its repetitions ({CI_LEVEL:.0%} order-statistic CI for n >= 6, "
    "the min-max range for 2 to 5) or, with one repetition (no band from repetitions), its "
    "epochs x (1 -/+ convergence.validity_tolerance); a point is flagged too fast (too slow) when "
    "its own interval of epochs, or its value for one repetition, lies wholly below (above) "
    "the band"
)


def _epochs_interval(values: np.ndarray) -> tuple[float, float]:
    """A point's epochs-to-target interval for the comparison: its median's interval
    (median_interval) with 2 or more repetitions, its value for one."""
    if len(values) == 1:
        return float(values[0]), float(values[0])
    low, high, _ = median_interval(values)
    return low, high


def reference_band(values: np.ndarray, tolerance: float) -> tuple[float, float, str]:
    """(low, high, kind) of the tolerance band around a reference point's epochs-to-target
    (+inf: a repetition that did not reach the target): its median's interval over 2 or more
    repetitions (kind ci or range), its value x (1 -/+ tolerance) for one (kind fixed); none
    when the reference has no median."""
    if np.isnan(_median(values)):
        return np.nan, np.nan, NONE
    if len(values) == 1:
        return float(values[0] * (1 - tolerance)), float(values[0] * (1 + tolerance)), FIXED
    return median_interval(values)


def validity_flag(values: np.ndarray, band: tuple[float, float, str]) -> str:
    """A point's flag against its reference's band (module docstring)."""
    if np.isnan(_median(values)):
        return NOT_REACHED
    if band[2] == NONE:
        return NO_REFERENCE
    low, high = _epochs_interval(values)
    scale = 1e-9 * max(1.0, abs(band[0]))  # a band edge met exactly is inside (1 - 0.25) x 4
    if high < band[0] - scale:
        return TOO_FAST
    if low > band[1] + scale:
        return TOO_SLOW
    return IN_BAND


def add_convergence_validity(
    out: pd.DataFrame, epoch_values: list[np.ndarray], tolerance: float
) -> pd.DataFrame:
    """The validity columns (VALIDITY_COLUMNS) of the summary `out`, whose row i has the
    epochs-to-target `epoch_values[i]` over its repetitions (+inf: not reached)."""
    if not 0 < tolerance < 1:
        raise ValueError(
            f"convergence.validity_tolerance: {tolerance!r} is not a fraction in (0, 1)"
        )
    out = out.copy().reset_index(drop=True)
    for column in VALIDITY_COLUMNS:
        out[column] = np.nan
    out["epochs_band"] = NONE
    out["convergence_validity"] = ""
    out = out.astype({"epochs_band": object, "convergence_validity": object})
    intervals = [median_interval(v)[:2] for v in epoch_values]
    out["epochs_to_accuracy_ci_low"] = [i[0] for i in intervals]
    out["epochs_to_accuracy_ci_high"] = [i[1] for i in intervals]
    for _, part in out.groupby(GROUP, sort=False):
        ref = part.sort_values(["global_batch", "nodes"]).index[0]
        values = epoch_values[ref]
        band = reference_band(values, tolerance)
        for i in part.index:
            out.loc[i, "reference_nodes"] = out.loc[ref, "nodes"]
            out.loc[i, "reference_global_batch"] = out.loc[ref, "global_batch"]
            out.loc[i, "reference_n"] = len(values)
            out.loc[i, "reference_epochs_median"] = _median(values)
            out.loc[i, "epochs_ratio"] = _median(epoch_values[i]) / _median(values)
            out.loc[i, "epochs_band_low"], out.loc[i, "epochs_band_high"] = band[:2]
            out.loc[i, "epochs_band"] = band[2]
            out.loc[i, "validity_tolerance"] = tolerance if band[2] == FIXED else np.nan
            out.loc[i, "convergence_validity"] = (
                REFERENCE if i == ref else validity_flag(epoch_values[i], band)
            )
    return out.astype({"reference_nodes": int, "reference_global_batch": int, "reference_n": int})


def time_to_accuracy_summary(
    cells: pd.DataFrame, validity_tolerance: float = DEFAULT_VALIDITY_TOLERANCE
) -> pd.DataFrame:
    """One row per group x node count (see the module docstring); `validity_tolerance`:
    convergence.validity_tolerance, the fixed band of a reference with one repetition."""
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
        *VALIDITY_COLUMNS,
    ]
    if cells.empty:
        return pd.DataFrame(columns=columns)
    cells = with_axes(cells)  # a table from before the parallelism axis: every cell ddp
    rows, epoch_values = [], []
    for key, part in cells.groupby(keys, sort=True):
        tta = _censored(part, "time_to_accuracy_s")
        epochs = _censored(part, "epochs_to_accuracy")
        epoch_values.append(epochs)
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
    out = add_convergence_validity(_add_tta_speedup(out), epoch_values, validity_tolerance)
    return out[columns]


_DERIVED = (
    "baseline_nodes",
    "tta_speedup",
    "tta_efficiency",
    "ideal_time_to_accuracy_s",
    *VALIDITY_COLUMNS,
)


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


def convergence_tables(
    cell_rows: list[dict],
    epoch_rows: list[dict],
    validity_tolerance: float = DEFAULT_VALIDITY_TOLERANCE,
) -> dict[str, pd.DataFrame]:
    """convergence, epochs and time_to_accuracy tables (empty, with their columns, when the
    study has no measured convergence cell)."""
    cells = pd.DataFrame(cell_rows, columns=None if cell_rows else CELL_COLUMNS)
    epochs = pd.DataFrame(epoch_rows, columns=None if epoch_rows else EPOCH_COLUMNS)
    return {
        "convergence": cells,
        "epochs": epochs,
        "time_to_accuracy": time_to_accuracy_summary(cells, validity_tolerance),
    }

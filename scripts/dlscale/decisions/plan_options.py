"""The planner's options (dlscale.decisions.planner): the jobs from the plan config or the
command line (samples, epochs x samples_per_epoch, or tokens for a model with a sequence
length), and every (job, series, partition, nodes) they could run on with its predicted time,
node-hours, energy and memory check; options whose memory per rank does not fit the
partition's device_memory_gib, or that a does_not_fit cell rules out, are kept with the reason
(`not_offered_because`) and not offered."""

from __future__ import annotations

import numpy as np
import pandas as pd

from dlscale.analysis.scaling_series import LOWER_BOUND
from dlscale.analysis.stats import GROUP, with_axes
from dlscale.decisions.plan_jobs import (  # noqa: F401 (re-exported: the planner's job checks)
    DEFAULT_SAMPLES,
    JOB_AMOUNTS,
    PlanError,
    jobs_from_config,
    parse_job,
    tokens_refusal,
)
from dlscale.study.partitions import DEVICE_MEMORY_KEY, Partition

DOES_NOT_FIT = "does_not_fit"  # the status of a cell whose ranks ran out of memory


def _seq_lens(pred: pd.DataFrame) -> pd.Series:
    """Each prediction row's sequence length: the series' measured seq_len, else the registry's
    (a table written before the column), NaN for models without one."""
    from dlscale.models import SPECS, seq_len_of

    measured = (
        pd.to_numeric(pred["seq_len"], errors="coerce")
        if "seq_len" in pred
        else pd.Series(np.nan, index=pred.index)
    )
    registry = pred["model"].map(lambda m: (seq_len_of(SPECS[m]) if m in SPECS else None) or np.nan)
    return measured.fillna(registry).astype(float)


def _token_models(pred: pd.DataFrame) -> list[str]:
    if pred.empty:
        return []
    return sorted(pred.loc[_seq_lens(pred).notna(), "model"].unique())


def _dominated(row, dnf: pd.DataFrame) -> int | None:
    """The node count of a cell of this row's series that ran out of memory while holding no
    more per rank than this row would (at least as much sharding, no smaller per-rank batch);
    None if there is none."""
    from dlscale.analysis.scaling_series import shard_degree

    rpn = max(1, int(round(row["world_size"] / row["nodes"])))
    d = shard_degree(row["parallelism"], int(row["nodes"]), rpn)
    for n0 in sorted(dnf["nodes"].astype(int), reverse=True):
        d0 = shard_degree(row["parallelism"], n0, rpn)
        batch_not_smaller = row["policy"] != "strong" or int(row["nodes"]) <= n0
        if (int(row["nodes"]) == n0) or (d <= d0 and batch_not_smaller):
            return n0
    return None


def _does_not_fit_reason(row: dict, dnf: pd.DataFrame) -> str:
    """Why a does_not_fit cell rules this option out ("" if none does)."""
    same = dnf
    for c in GROUP:
        same = same[same[c] == row[c]]
    n0 = _dominated(row, same) if len(same) else None
    if n0 is None:
        return ""
    return (
        f"does not fit: a cell of this series ran out of memory at {n0} "
        f"node{'s' if n0 != 1 else ''} (status does_not_fit)"
        + ("" if n0 == int(row["nodes"]) else " and this holds at least as much per rank")
    )


def _mib(x: float) -> str:
    return f"{x / 1024:.3g} GiB" if x >= 1024 else f"{x:.4g} MiB"


def _job_series(pred: pd.DataFrame, job: dict, parts: dict) -> pd.DataFrame:
    """The prediction rows of a job: its model, the axes it allows, at most the partition's
    nodes_available, a finite positive predicted throughput."""
    sel = pred[pred["model"] == job["model"]] if len(pred) else pred
    for axis, key in (
        ("framework", "frameworks"),
        ("hardware", "hardware"),
        ("policy", "policy"),
        ("precision", "precision"),
        ("mode", "mode"),
        ("parallelism", "parallelism"),
    ):
        allowed = job.get(key)
        if allowed:
            sel = sel[sel[axis].isin([allowed] if isinstance(allowed, str) else allowed)]
    sel = sel[sel["nodes"] <= sel["hardware"].map(lambda h: parts[h].nodes_available)]
    rate = sel["throughput_samples_per_s_pred"].to_numpy(float)
    return sel[np.isfinite(rate) & (rate > 0)]  # a model that predicts nothing there


def _job_samples(sel: pd.DataFrame, job: dict, pred: pd.DataFrame) -> tuple[np.ndarray, pd.Series]:
    """Per row the job's samples (a job in tokens: tokens / seq_len) and the sequence length."""
    seq_len = _seq_lens(sel)
    if job.get("tokens") is not None:
        if seq_len.isna().all():
            raise PlanError(tokens_refusal(job, _token_models(pred)))
        samples = job["tokens"] / seq_len.to_numpy(float)
    else:
        samples = np.full(len(sel), job["samples"], dtype=float)
    return samples, seq_len


def _memory_columns(sel: pd.DataFrame, parts: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per row the memory per rank (MiB), where it comes from, and the partition's limit."""
    memory = (
        pd.to_numeric(sel["memory_per_rank_mb"], errors="coerce").to_numpy(float)
        if "memory_per_rank_mb" in sel
        else np.full(len(sel), np.nan)
    )
    source = (
        sel["memory_from"].fillna("unknown").astype(str).to_numpy()
        if "memory_from" in sel
        else np.full(len(sel), "unknown: no memory per rank in the predictions")
    )
    limit = (
        sel["hardware"]
        .map(lambda h: np.nan if parts[h].device_memory_mb is None else parts[h].device_memory_mb)
        .to_numpy(float)
    )
    return memory, source, limit


def _memory_checks(sel, memory, source, limit, dnf, parts) -> tuple[list[str], list[str]]:
    """Per row the memory check in words and why the option is not offered ("" if it is). The
    limit is the partition's device_memory_gib less its memory_headroom_gib; a series with no
    measured memory has only a lower bound (its model's state, dlscale.analysis.scaling_series:
    LOWER_BOUND), which can rule an option out but not in."""
    check, why = [], []
    records = sel[[*GROUP, "nodes", "world_size"]].to_dict("records")
    for k, row in enumerate(records):
        reason = _does_not_fit_reason(row, dnf) if dnf is not None else ""
        where = parts[row["hardware"]].limit_words()
        bound = str(source[k]).startswith(LOWER_BOUND)
        if np.isnan(limit[k]):
            check.append(f"not checked: {row['hardware']} has no {DEVICE_MEMORY_KEY}")
        elif np.isnan(memory[k]):
            check.append(f"not checked: memory per rank unknown ({source[k]})")
        elif bound and memory[k] <= limit[k]:
            check.append(
                f"not checked: no memory measured; at least {_mib(memory[k])} per rank "
                f"({source[k]}) within {_mib(limit[k])} ({where})"
            )
        else:
            fits = memory[k] <= limit[k]
            check.append(
                f"{'fits' if fits else 'does not fit'}: {'at least ' if bound else ''}"
                f"{_mib(memory[k])} per rank "
                f"({source[k]}) {'within' if fits else 'over'} {_mib(limit[k])} "
                f"({where})"
            )
            if not fits and not reason:
                reason = check[-1]
        why.append(reason)
    return check, why


def candidate_options(
    predictions: pd.DataFrame,
    jobs: list[dict],
    partitions: list[Partition],
    *,
    budget_kwh: float | None = None,
    does_not_fit: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """Every (job, series, partition, nodes) the jobs could run on (a predicted throughput, at
    most the partition's nodes_available), with `offered` and, where not, `not_offered_because`
    (memory per rank over the partition's device_memory_gib; a does_not_fit cell or a node
    count that holds at least as much per rank). Per row: samples (a job in tokens: tokens /
    seq_len), time (hours, with its interval), node-hours, charged node-hours (x
    node_hour_cost), energy (kWh; NaN where the power is unknown), memory per rank, the limit
    and `memory_check` (measured, predicted or not checked)."""
    parts = {p.name: p for p in partitions}
    rows = []
    predictions = with_axes(predictions)
    pred = predictions[predictions["hardware"].isin(parts)] if len(predictions) else predictions
    dnf = with_axes(does_not_fit) if does_not_fit is not None and len(does_not_fit) else None
    if dnf is not None and "status" in dnf:
        dnf = dnf[dnf["status"] == DOES_NOT_FIT]
    for j, job in enumerate(jobs):
        sel = _job_series(pred, job, parts)
        if sel.empty:
            continue
        samples, seq_len = _job_samples(sel, job, pred)
        x = sel["throughput_samples_per_s_pred"].to_numpy(float)
        hours = samples / x / 3600
        cost = sel["hardware"].map(lambda h: parts[h].node_hour_cost).to_numpy(float)
        power = (
            sel["hardware"]
            .map(lambda h: np.nan if parts[h].node_power_w is None else parts[h].node_power_w)
            .to_numpy(float)
        )
        memory, source, limit = _memory_columns(sel, parts)
        check, why = _memory_checks(sel, memory, source, limit, dnf, parts)
        rows.append(
            sel.assign(
                job=job["name"],
                job_index=j,
                samples=samples,
                tokens=job.get("tokens"),
                seq_len=seq_len.to_numpy(float),
                hours=hours,
                hours_low=samples / sel["throughput_samples_per_s_high"] / 3600,
                hours_high=samples / sel["throughput_samples_per_s_low"] / 3600,
                node_hours=sel["nodes"] * hours,
                charged_node_hours=sel["nodes"] * hours * cost,
                energy_kwh=sel["nodes"] * hours * power / 1000,
                memory_per_rank_mb=memory,
                memory_limit_mb=limit,
                memory_check=check,
                offered=[not w for w in why],
                not_offered_because=why,
            )
        )
    out = pd.concat(rows, ignore_index=True) if rows else pd.DataFrame()
    if budget_kwh is not None and len(out):
        out = out[out["energy_kwh"].notna()]
    return out


def options(
    predictions: pd.DataFrame,
    jobs: list[dict],
    partitions: list[Partition],
    *,
    budget_kwh: float | None = None,
    does_not_fit: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """The options offered to the jobs (candidate_options' rows that fit)."""
    cands = candidate_options(
        predictions, jobs, partitions, budget_kwh=budget_kwh, does_not_fit=does_not_fit
    )
    if cands.empty:
        return cands
    return cands[cands["offered"]].reset_index(drop=True)


def fastest_per_slot(opts: pd.DataFrame) -> pd.DataFrame:
    """Per job, partition and node count the fastest series (the only one that can be optimal)."""
    if opts.empty:
        return opts
    best = opts.sort_values(["job_index", "hardware", "nodes", "hours", *GROUP], kind="stable")
    return best.drop_duplicates(["job_index", "hardware", "nodes"]).reset_index(drop=True)

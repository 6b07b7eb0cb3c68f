"""The planner: which framework, parallelism strategy, partition and node count for each
training job, within a budget or a deadline, from the fitted scaling models (one per series, so
per strategy: dlscale.analysis.scaling_model) and the site's partitions (config/hardware.yaml:
nodes_available, node_hour_cost, node_power_w, device_memory_gib).

What is offered (`candidate_options`): an option (series, partition, nodes) only where its
peak memory per rank fits the partition's device_memory_gib: measured where the series
measured that node count, else predicted from its nearest measured node count (the state
bytes as 1 / the strategy's sharding degree, the rest held: scaling_model.memory_per_rank);
the plan's `memory_check` says which. Never a cell whose ranks ran out of memory (status
does_not_fit), nor a node count of its series that holds at least as much per rank (no more
sharding, no smaller per-rank batch). Options left out are listed with the reason in the
alternatives (`lost_because`: "does not fit ...") and in Plan.excluded, not dropped silently.
A partition without device_memory_gib, or a series without a memory measure, is not checked
(and the plan says so).

A job is given in samples (or epochs x samples_per_epoch) or, for a model that reads token
sequences, in tokens (`tokens:`; on the command line MODEL:tokens=N): samples = tokens /
seq_len, the series' measured sequence length (cells.csv seq_len; the registry's where an older
table has none). Tokens for a model without a sequence length are refused with the allowed
models.

The model (`solve`: variables, objective, constraints, in that order) is an integer program on
PuLP with its bundled CBC:

- x[j, o] in {0, 1}: job j runs option o = (series, partition, nodes) of those offered (above),
  with the predicted time T[j, o] = samples_j / throughput_o; sum_o x[j, o] = 1 for every job;
- shared capacity: for every partition h, the nodes of the options on h summed over jobs <=
  nodes_available[h] (the jobs run at the same time);
- objective `min_time`: the makespan max_j T_j, then (ties) the sum of the jobs' times, then
  the charged node-hours, within an optional budget of charged node-hours (sum of
  node_hour_cost x nodes x hours) and/or of energy (kWh; only partitions with a known power);
- objective `min_node_hours`: the charged node-hours, then (ties) the makespan, with every job
  done within `deadline_hours`.

Ties are broken by solving again with the earlier objective fixed at its optimum (lexicographic),
so a plan is the exact optimum of a well-defined order, reproducible by enumeration (the tests
do that). For one job, partition and node count only the fastest series can be optimal (same
nodes, less time, so fewer node-hours and less energy), so the program holds only those.

Out: the plan (per job its choice, predicted time and its interval, node-hours, charged
node-hours, energy), the alternatives it beat (per job the best option of every other
framework x partition and why it lost), the constraints (used, limit, tight, binding: the
objective improves when the constraint is dropped). An infeasible budget or deadline
names the smallest one that would be feasible.

    python -m dlscale.decisions.planner results/demo [--study-file F]
        [--job MODEL:SAMPLES | MODEL:samples=N | MODEL:tokens=N] [--objective O]
        [--budget-node-hours B] [--budget-kwh E] [--deadline-hours D] [--out DIR]
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from dlscale.analysis.stats import GROUP, with_axes
from dlscale.study.config import PLANNING_KEYS  # noqa: F401 (the hardware keys read here)
from dlscale.study.partitions import (  # noqa: F401 (re-exported)
    DEVICE_MEMORY_KEY,
    Partition,
    partitions_from_hardware,
)

MIN_TIME, MIN_NODE_HOURS = "min_time", "min_node_hours"
OBJECTIVES = (MIN_TIME, MIN_NODE_HOURS)
DEFAULT_SAMPLES = 1_000_000
DOES_NOT_FIT = "does_not_fit"  # the status of a cell whose ranks ran out of memory
JOB_AMOUNTS = ("samples", "tokens")  # what a job may be given in (--job MODEL:KEY=N)
_REL = 1e-7  # relative slack when an earlier objective is fixed at its optimum


class PlanError(ValueError):
    """No plan: the message says why and, for a budget or deadline, the smallest feasible one."""


def jobs_from_config(plan: dict, models: list[str]) -> list[dict]:
    """The plan's jobs; none configured: one per model of the study, default_samples each."""
    jobs = plan.get("jobs") or [
        {"name": m, "model": m, "samples": plan.get("default_samples", DEFAULT_SAMPLES)}
        for m in models
    ]
    out = []
    for i, job in enumerate(jobs):
        if job.get("target_accuracy") is not None:
            raise PlanError(
                f"plan.jobs[{i}].target_accuracy: the planner plans from the throughput cells "
                "(the convergence cells' time-to-accuracy is not planned from yet); give samples "
                "or epochs x samples_per_epoch"
            )
        samples, tokens = job.get("samples"), job.get("tokens")
        if tokens is not None:
            if samples is not None or job.get("epochs") is not None:
                raise PlanError(f"plan.jobs[{i}]: give tokens or samples (or epochs), not both")
            # samples per option: tokens / the series' seq_len (options)
            out.append(
                {
                    **job,
                    "name": job.get("name") or f"job{i + 1}",
                    "samples": None,
                    "tokens": float(tokens),
                }
            )
            continue
        if samples is None and job.get("epochs") is not None:
            samples = job["epochs"] * job["samples_per_epoch"]
        if samples is None:
            raise PlanError(
                f"plan.jobs[{i}]: give samples, epochs and samples_per_epoch, or tokens "
                "(models with a sequence length)"
            )
        out.append(
            {
                **job,
                "name": job.get("name") or f"job{i + 1}",
                "samples": float(samples),
                "tokens": None,
            }
        )
    names = [job["name"] for job in out]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise PlanError(f"plan.jobs: job names must differ; given more than once: {twice}")
    return out


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
    from dlscale.analysis.scaling_model import shard_degree

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
        sel = sel[np.isfinite(rate) & (rate > 0)]  # a model that predicts nothing there
        if sel.empty:
            continue
        seq_len = _seq_lens(sel)
        if job.get("tokens") is not None:
            if seq_len.isna().all():
                raise PlanError(
                    f"job {job['name']!r}: tokens is for models with a sequence length; "
                    f"{job['model']!r} has none (give samples); allowed models for tokens: "
                    f"{', '.join(_token_models(pred)) or 'none measured'}"
                )
            samples = job["tokens"] / seq_len.to_numpy(float)
        else:
            samples = np.full(len(sel), job["samples"], dtype=float)
        x = sel["throughput_samples_per_s_pred"].to_numpy(float)
        hours = samples / x / 3600
        cost = sel["hardware"].map(lambda h: parts[h].node_hour_cost).to_numpy(float)
        power = (
            sel["hardware"]
            .map(lambda h: np.nan if parts[h].node_power_w is None else parts[h].node_power_w)
            .to_numpy(float)
        )
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
            .map(
                lambda h: np.nan if parts[h].device_memory_mb is None else parts[h].device_memory_mb
            )
            .to_numpy(float)
        )
        check, why = [], []
        records = sel[[*GROUP, "nodes", "world_size"]].to_dict("records")
        for k, row in enumerate(records):
            reason = _does_not_fit_reason(row, dnf) if dnf is not None else ""
            if np.isnan(limit[k]):
                check.append(f"not checked: {row['hardware']} has no {DEVICE_MEMORY_KEY}")
            elif np.isnan(memory[k]):
                check.append(f"not checked: memory per rank unknown ({source[k]})")
            else:
                fits = memory[k] <= limit[k]
                check.append(
                    f"{'fits' if fits else 'does not fit'}: {_mib(memory[k])} per rank "
                    f"({source[k]}) {'within' if fits else 'over'} {_mib(limit[k])} "
                    f"({row['hardware']} {DEVICE_MEMORY_KEY})"
                )
                if not fits and not reason:
                    reason = check[-1]
            why.append(reason)
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


# ---- the integer program ----------------------------------------------------------------------


def _program(
    opts: pd.DataFrame,
    n_jobs: int,
    capacity: dict,
    limits: dict,
    objective: str,
    fixed: dict,
    drop: str | None = None,
):
    """Variables, objective, constraints. `limits`: budget_node_hours, budget_kwh,
    deadline_hours (None: absent); `fixed`: earlier objectives' optima (lexicographic);
    `drop`: a constraint name to leave out (binding test)."""
    import pulp  # here, not at import: the workflow imports this module at every parse

    prob = pulp.LpProblem("dlscale_plan", pulp.LpMinimize)
    # variables
    x = [prob.add_variable(f"x{i}", cat=pulp.LpBinary) for i in range(len(opts))]
    makespan = prob.add_variable("makespan", lowBound=0)
    hours = opts["hours"].to_numpy(float)
    charged = opts["charged_node_hours"].to_numpy(float)
    energy = opts["energy_kwh"].to_numpy(float)
    job_of = opts["job_index"].to_numpy(int)
    by_job = [np.flatnonzero(job_of == j) for j in range(n_jobs)]
    terms = {
        "makespan": makespan,
        "sum_hours": pulp.lpSum(hours[i] * x[i] for i in range(len(x))),
        "charged_node_hours": pulp.lpSum(charged[i] * x[i] for i in range(len(x))),
    }
    # objective
    prob += terms[objective]
    # constraints
    for j, idx in enumerate(by_job):
        prob += pulp.lpSum(x[i] for i in idx) == 1, f"one_option_job{j}"
        prob += pulp.lpSum(hours[i] * x[i] for i in idx) <= makespan, f"makespan_job{j}"
    hw = opts["hardware"].to_numpy()
    nodes = opts["nodes"].to_numpy(int)
    for h, cap in capacity.items():
        idx = np.flatnonzero(hw == h)
        if len(idx) and f"capacity_{h}" != drop:
            prob += pulp.lpSum(int(nodes[i]) * x[i] for i in idx) <= cap, f"capacity_{h}"
    if limits.get("budget_node_hours") is not None and drop != "budget_node_hours":
        prob += terms["charged_node_hours"] <= limits["budget_node_hours"], "budget_node_hours"
    if limits.get("budget_kwh") is not None and drop != "budget_kwh":
        prob += (
            pulp.lpSum(energy[i] * x[i] for i in range(len(x))) <= limits["budget_kwh"],
            "budget_kwh",
        )
    if limits.get("deadline_hours") is not None and drop != "deadline_hours":
        prob += makespan <= limits["deadline_hours"], "deadline_hours"
    for name, value in fixed.items():
        prob += terms[name] <= value * (1 + _REL) + 1e-12, f"fixed_{name}"
    return prob, x, terms


def _solve(prob) -> bool:
    import pulp

    # PuLP's bundled CBC (PULP_CBC_CMD; PuLP 3.3 marks it deprecated in favour of a separately
    # installed CBC, which this project does not require)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        status = prob.solve(pulp.PULP_CBC_CMD(msg=False))
    return pulp.LpStatus[status] == "Optimal"


ORDER = {
    MIN_TIME: ("makespan", "sum_hours", "charged_node_hours"),
    MIN_NODE_HOURS: ("charged_node_hours", "makespan", "sum_hours"),
}


def solve(
    opts: pd.DataFrame,
    n_jobs: int,
    capacity: dict,
    limits: dict,
    objective: str,
    drop: str | None = None,
) -> tuple[list[int], dict] | None:
    """The lexicographic optimum: chosen option rows (one per job) and the objectives' values;
    None when infeasible."""
    fixed: dict = {}
    chosen = None
    for stage, name in enumerate(ORDER[objective]):
        prob, x, _ = _program(opts, n_jobs, capacity, limits, name, fixed, drop)
        if not _solve(prob):
            if stage == 0:
                return None
            break  # defensive: the earlier stage's plan is optimal for the earlier objectives
        chosen = [i for i, v in enumerate(x) if v.value() > 0.5]
        # the values from the chosen rows, exactly: CBC's solution file rounds continuous
        # values (the makespan) to a few digits, too coarse to fix an objective with
        fixed = objective_values(opts.iloc[chosen])
        fixed = {k: fixed[k] for k in ORDER[objective][: stage + 1]}
    return chosen, objective_values(opts.iloc[chosen])


def objective_values(rows: pd.DataFrame) -> dict:
    """makespan, sum_hours and charged_node_hours of a plan's rows (one per job)."""
    return {
        "makespan": float(rows["hours"].max()),
        "sum_hours": float(rows["hours"].sum()),
        "charged_node_hours": float(rows["charged_node_hours"].sum()),
    }


# ---- the plan -----------------------------------------------------------------------------------


@dataclass
class Plan:
    plan: pd.DataFrame
    alternatives: pd.DataFrame
    constraints: pd.DataFrame
    objective: str
    objectives: dict
    limits: dict
    solve_seconds: float
    options: pd.DataFrame
    # the options not offered (memory, does_not_fit), one row each with not_offered_because
    excluded: pd.DataFrame | None = None


PLAN_COLUMNS = [
    "job",
    "model",
    "samples",
    "tokens",
    "seq_len",
    *[c for c in GROUP if c != "model"],
    "nodes",
    "world_size",
    "hours",
    "hours_low",
    "hours_high",
    "interval",
    "node_hours",
    "charged_node_hours",
    "energy_kwh",
    "throughput_samples_per_s_pred",
    "model_kind",
    "measured",
    "extrapolated",
    "measured_max_nodes",
    "validated",
    "interval_spans",
    "memory_per_rank_mb",
    "memory_limit_mb",
    "memory_check",
]


def _smallest_feasible(opts, n_jobs, capacity, limits, objective) -> str:
    """Why no plan exists and the smallest budget or deadline that would have one."""
    if not solve(opts, n_jobs, capacity, {}, MIN_TIME):
        return (
            "infeasible even without budget or deadline: the jobs need more nodes than the "
            f"partitions offer together ({', '.join(f'{h}: {c}' for h, c in capacity.items())})"
        )
    msgs = []
    for key, term, unit in (
        ("budget_node_hours", "charged_node_hours", "charged node-hours"),
        ("deadline_hours", "makespan", "hours"),
    ):
        if limits.get(key) is None:
            continue
        other = {k: v for k, v in limits.items() if k != key}
        best = solve(
            opts, n_jobs, capacity, other, MIN_NODE_HOURS if term != "makespan" else MIN_TIME
        )
        if best is None:
            continue
        need = best[1][term]
        if need > limits[key] * (1 + _REL):
            msgs.append(
                f"{key} {limits[key]:.4g} is infeasible; the smallest feasible {key} is "
                f"{need:.4g} {unit}"
            )
    if limits.get("budget_kwh") is not None:
        other = {k: v for k, v in limits.items() if k != "budget_kwh"}
        prob_best = _min_energy(opts, n_jobs, capacity, other)
        if prob_best is not None and prob_best > limits["budget_kwh"] * (1 + _REL):
            msgs.append(
                f"budget_kwh {limits['budget_kwh']:.4g} is infeasible; the smallest feasible "
                f"budget_kwh is {prob_best:.4g} kWh"
            )
    return "; ".join(msgs) or "the budget and deadline together are infeasible"


def _min_energy(opts, n_jobs, capacity, limits) -> float | None:
    import pulp

    prob, x, _ = _program(opts, n_jobs, capacity, limits, "sum_hours", {})
    energy = opts["energy_kwh"].to_numpy(float)
    prob.setObjective(pulp.lpSum(energy[i] * x[i] for i in range(len(x))))
    return pulp.value(prob.objective) if _solve(prob) else None


def make_plan(
    predictions: pd.DataFrame,
    jobs: list[dict],
    partitions: list[Partition],
    objective: str = MIN_TIME,
    budget_node_hours: float | None = None,
    budget_kwh: float | None = None,
    deadline_hours: float | None = None,
    does_not_fit: pd.DataFrame | None = None,
) -> Plan:
    """The plan for `jobs` on `partitions` from the predictions table
    (dlscale.analysis.scaling_model); `does_not_fit`: the status table (or its rows with status
    does_not_fit), whose cells and the node counts they rule out are never offered."""
    if objective not in OBJECTIVES:
        raise PlanError(f"objective {objective!r}; allowed: {', '.join(OBJECTIVES)}")
    if objective == MIN_NODE_HOURS and deadline_hours is None:
        raise PlanError("objective min_node_hours needs deadline_hours")
    limits = {
        "budget_node_hours": budget_node_hours,
        "budget_kwh": budget_kwh,
        "deadline_hours": deadline_hours,
    }
    cands = candidate_options(
        predictions, jobs, partitions, budget_kwh=budget_kwh, does_not_fit=does_not_fit
    )
    all_opts = cands[cands["offered"]].reset_index(drop=True) if len(cands) else cands
    excluded = cands[~cands["offered"]].reset_index(drop=True) if len(cands) else cands
    for j, job in enumerate(jobs):
        if all_opts.empty or not (all_opts["job_index"] == j).any():
            mine = excluded[excluded["job_index"] == j] if len(excluded) else excluded
            if len(mine):
                reasons = mine.drop_duplicates("not_offered_because")["not_offered_because"]
                raise PlanError(
                    f"job {job['name']!r}: no option of model {job['model']!r} fits in memory "
                    f"({len(mine)} left out): " + "; ".join(reasons.head(3))
                )
            why = " with a known node_power_w" if budget_kwh is not None else ""
            raise PlanError(
                f"job {job['name']!r}: no measured series of model {job['model']!r} on any "
                f"partition{why} ({', '.join(p.name for p in partitions)}) matches it"
            )
    opts = fastest_per_slot(all_opts)
    capacity = {p.name: p.nodes_available for p in partitions}
    started = time.perf_counter()
    result = solve(opts, len(jobs), capacity, limits, objective)
    seconds = time.perf_counter() - started
    if result is None:
        raise PlanError(_smallest_feasible(opts, len(jobs), capacity, limits, objective))
    chosen, values = result
    plan = opts.iloc[chosen].sort_values("job_index")
    return Plan(
        plan=plan.reindex(columns=PLAN_COLUMNS).reset_index(drop=True),
        alternatives=_alternatives(all_opts, plan, objective, limits, excluded),
        constraints=_constraints(opts, plan, len(jobs), capacity, limits, objective, values),
        objective=objective,
        objectives=values,
        limits=limits,
        solve_seconds=seconds,
        options=opts,
        excluded=excluded,
    )


def _not_offered(excluded: pd.DataFrame) -> list[dict]:
    """Per job and series x partition, the node counts not offered and why (the largest of them,
    the one holding the least per rank, named with its reason)."""
    rows = []
    if excluded is None or excluded.empty:
        return rows
    for _, grp in excluded.groupby(["job_index", *GROUP], sort=True):
        top = grp.sort_values("nodes").iloc[-1]
        nodes = sorted(int(n) for n in grp["nodes"])
        span = str(nodes[0]) if len(nodes) == 1 else f"{nodes[0]}-{nodes[-1]}"
        rows.append(
            {
                "job": top["job"],
                **{c: top[c] for c in GROUP if c != "model"},
                "nodes": int(top["nodes"]),
                "hours": top["hours"],
                "charged_node_hours": top["charged_node_hours"],
                "lost_because": f"not offered at {span} node{'s' if span != '1' else ''}: "
                f"{top['not_offered_because']}",
            }
        )
    return rows


def _alternatives(all_opts, plan, objective, limits, excluded=None) -> pd.DataFrame:
    """Per job, the best option of every series x partition it did not choose, and why it lost;
    then the options not offered (memory, does_not_fit) with the reason."""
    rows = []
    key = "hours" if objective == MIN_TIME else "charged_node_hours"
    for _, chosen in plan.iterrows():
        mine = all_opts[all_opts["job_index"] == chosen["job_index"]]
        if objective == MIN_NODE_HOURS:
            mine = mine[mine["hours"] <= limits["deadline_hours"] * (1 + _REL)]
        for _, grp in mine.groupby([*GROUP], sort=True):
            best = grp.sort_values([key, "nodes"]).iloc[0]
            if all(best[c] == chosen[c] for c in GROUP):
                continue
            if best[key] > chosen[key] * (1 + _REL):
                why = "slower" if objective == MIN_TIME else "more charged node-hours"
            else:
                why = "better alone, but not within the budget or capacity shared with the jobs"
            rows.append(
                {
                    "job": chosen["job"],
                    **{c: best[c] for c in GROUP if c != "model"},
                    "nodes": int(best["nodes"]),
                    "hours": best["hours"],
                    "charged_node_hours": best["charged_node_hours"],
                    "lost_because": why,
                }
            )
    rows += _not_offered(excluded)
    return pd.DataFrame(
        rows,
        columns=[
            "job",
            *[c for c in GROUP if c != "model"],
            "nodes",
            "hours",
            "charged_node_hours",
            "lost_because",
        ],
    )


def _better(a: dict, b: dict, order) -> bool:
    """Whether objective values `a` are lexicographically better than `b` (beyond 1e-6)."""
    for name in order:
        if a[name] < b[name] * (1 - 1e-6) - 1e-12:
            return True
        if a[name] > b[name] * (1 + 1e-6) + 1e-12:
            return False
    return False


def _constraints(opts, plan, n_jobs, capacity, limits, objective, values) -> pd.DataFrame:
    """Every capacity, budget and deadline: used, limit, tight (used = limit), and binding:
    dropping it improves the objective (the first, or a later one at an equal first; ORDER).
    In an integer program a constraint can bind without being tight (a budget that rules out
    the faster partition while the plan it leaves costs less)."""
    first = ORDER[objective][0]
    rows = []
    used_nodes = plan.groupby("hardware")["nodes"].sum()
    cands = [
        (f"capacity_{h}", float(used_nodes.get(h, 0)), float(c))
        for h, c in capacity.items()
        if (opts["hardware"] == h).any()
    ]
    if limits["budget_node_hours"] is not None:
        cands.append(
            (
                "budget_node_hours",
                float(plan["charged_node_hours"].sum()),
                limits["budget_node_hours"],
            )
        )
    if limits["budget_kwh"] is not None:
        cands.append(("budget_kwh", float(plan["energy_kwh"].sum()), limits["budget_kwh"]))
    if limits["deadline_hours"] is not None:
        cands.append(("deadline_hours", float(plan["hours"].max()), limits["deadline_hours"]))
    for name, used, limit in cands:
        tight = used >= limit * (1 - 1e-6)
        relaxed = solve(opts, n_jobs, capacity, limits, objective, drop=name)
        without = relaxed[1] if relaxed else values
        rows.append(
            {
                "constraint": name,
                "used": used,
                "limit": limit,
                "tight": tight,
                "binding": _better(without, values, ORDER[objective]),
                f"{first}_without": without[first],
            }
        )
    return pd.DataFrame(rows)


# ---- files, report fragments, figure, command line ---------------------------------------------


def plan_from_config(
    predictions: pd.DataFrame,
    plan_config: dict,
    hardware: dict,
    models: list[str],
    does_not_fit: pd.DataFrame | None = None,
) -> Plan:
    return make_plan(
        predictions,
        jobs_from_config(plan_config, models),
        partitions_from_hardware(hardware),
        objective=plan_config.get("objective", MIN_TIME),
        budget_node_hours=plan_config.get("budget_node_hours"),
        budget_kwh=plan_config.get("budget_kwh"),
        deadline_hours=plan_config.get("deadline_hours"),
        does_not_fit=does_not_fit,
    )


def read_status(path: str | Path) -> pd.DataFrame | None:
    """The status table's cells that did not fit (None when there is no table)."""
    path = Path(path)
    if not path.exists() or path.stat().st_size == 0:
        return None
    try:
        status = pd.read_csv(path)
    except pd.errors.EmptyDataError:
        return None
    if "status" not in status:
        return None
    return status[status["status"] == DOES_NOT_FIT]


def parse_job(text: str) -> dict:
    """A --job argument: MODEL:SAMPLES, MODEL:samples=N or MODEL:tokens=N."""
    model, _, amount = text.partition(":")
    key, eq, value = amount.partition("=")
    if not eq:
        key, value = "samples", amount
    key = key.strip()
    if not model or key not in JOB_AMOUNTS:
        raise ValueError(
            f"--job {text!r}: give MODEL:SAMPLES, MODEL:samples=N or MODEL:tokens=N "
            f"(e.g. resnet50:1.28e8, gpt2_124m:tokens=2e9); allowed keys: {', '.join(JOB_AMOUNTS)}"
        )
    try:
        number = float(value)
    except ValueError:
        raise ValueError(
            f"--job {text!r}: {key} must be a number, e.g. {model}:{key}=1e9"
        ) from None
    if not number > 0:
        raise ValueError(f"--job {text!r}: {key} must be above 0")
    return {"model": model, key: number}


def write_plan(result: Plan | PlanError, out_dir: str) -> None:
    """plan.csv (empty with a `message` column when infeasible), alternatives.csv,
    constraints.csv in out_dir."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if isinstance(result, PlanError):
        pd.DataFrame({"message": [str(result)]}).to_csv(out / "plan.csv", index=False)
        pd.DataFrame().to_csv(out / "alternatives.csv", index=False)
        pd.DataFrame().to_csv(out / "constraints.csv", index=False)
        return
    result.plan.to_csv(out / "plan.csv", index=False)
    result.alternatives.to_csv(out / "alternatives.csv", index=False)
    result.constraints.to_csv(out / "constraints.csv", index=False)


def plot_plan(result: Plan | PlanError, out: str, width_in: float = 3.5) -> None:
    """Predicted time-to-train against nodes, per job: one line per series x partition (the
    fastest per node count), the chosen option starred; a plan that failed says why."""
    from dlscale.outputs.plotting import plot_plan_options

    plot_plan_options(result, out, width_in)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m dlscale.decisions.planner",
        description="Plan training jobs from an existing study's results (no cell is rerun).",
    )
    parser.add_argument("results", help="the study's results folder, e.g. results/demo")
    parser.add_argument("--workflow-dir", default=".", help="the workflow (config/, default .)")
    parser.add_argument(
        "--study-file",
        help="a study file over config/config.yaml, as "
        "--config study_file=... (its plan: section is used)",
    )
    parser.add_argument("--objective", choices=OBJECTIVES)
    parser.add_argument("--budget-node-hours", type=float)
    parser.add_argument("--budget-kwh", type=float)
    parser.add_argument("--deadline-hours", type=float)
    parser.add_argument(
        "--job",
        action="append",
        default=[],
        metavar="MODEL:SAMPLES|MODEL:tokens=N",
        help="a job (repeatable; replaces the config's jobs): samples, or tokens for a model "
        "with a sequence length (converted with its cells' seq_len)",
    )
    parser.add_argument("--out", help="write plan.csv, alternatives.csv, constraints.csv here")
    args = parser.parse_args(argv)

    from dlscale.analysis.scaling_model import model_tables
    from dlscale.study.config import load_schema, load_yaml, validate_config, validate_hardware
    from dlscale.study.matrix import workflow_config

    root = Path(args.workflow_dir)
    schemas = root / "config" / "schemas"
    cli = {"study_file": args.study_file} if args.study_file else {}
    config = validate_config(
        workflow_config(cli, root), load_schema(schemas / "config.schema.json")
    )
    hardware = validate_hardware(
        load_yaml(root / config["hardware_file"]), load_schema(schemas / "hardware.schema.json")
    )
    plan_config = dict(config["plan"])
    for key in ("objective", "budget_node_hours", "budget_kwh", "deadline_hours"):
        if getattr(args, key) is not None:
            plan_config[key] = getattr(args, key)
    if args.job:
        plan_config["jobs"] = []
        for j in args.job:
            try:
                plan_config["jobs"].append(parse_job(j))
            except ValueError as exc:
                parser.error(str(exc))
    cells = pd.read_csv(Path(args.results) / "tables" / "cells.csv")
    does_not_fit = read_status(Path(args.results) / "tables" / "status.csv")
    plan_nodes = {p.name: p.nodes_available for p in partitions_from_hardware(hardware)}
    _, preds = model_tables(
        cells,
        plan_config.get("predict_nodes"),
        plan_config["max_extrapolation"],
        plan_nodes,
        plan_config["max_extrapolation_unvalidated"],
    )
    try:
        result = plan_from_config(
            preds, plan_config, hardware, sorted(cells["model"].unique()), does_not_fit
        )
    except PlanError as exc:
        print(f"dlscale plan: {exc}", file=sys.stderr)
        if args.out:
            write_plan(exc, args.out)
        return 2
    with pd.option_context("display.width", 160, "display.max_columns", 30):
        print(
            result.plan[
                [
                    "job",
                    "framework",
                    "hardware",
                    "policy",
                    "parallelism",
                    "nodes",
                    "samples",
                    "hours",
                    "hours_low",
                    "hours_high",
                    "interval",
                    "charged_node_hours",
                    "energy_kwh",
                    "extrapolated",
                    "memory_check",
                ]
            ].to_string(index=False)
        )
        print("\nconstraints:\n" + result.constraints.to_string(index=False))
        print("\nalternatives:\n" + result.alternatives.to_string(index=False))
    print(f"\nsolved in {result.solve_seconds:.3f} s ({len(result.options)} options)")
    if args.out:
        write_plan(result, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


# ---- the report's Recommendations section (macros and tables, never typed numbers) ------------


def _hours(h: float) -> str:
    from dlscale.outputs.report import _fmt

    return _fmt(h) if pd.notna(h) else "--"


def recommendation_macros(result, fits: pd.DataFrame, plan_config: dict) -> dict[str, str]:
    """The numbers of the Recommendations section, as dls... macros (dlscale.outputs.report)."""
    from dlscale.analysis.scaling_model import (
        DEFAULT_MAX_EXTRAPOLATION_UNVALIDATED,
        MIN_NODE_COUNTS_LOO,
        MODEL_METHOD,
    )
    from dlscale.outputs.report import _fmt, _macro_name, tex_escape

    validated = fits[fits["loo_status"] == "validated"] if len(fits) else fits
    m = {
        "ModelMethod": MODEL_METHOD,
        "ModelSeries": len(fits),
        "ModelValidated": len(validated),
        "ModelTooShort": len(fits) - len(validated),
        "ModelMinNodeCounts": MIN_NODE_COUNTS_LOO,
        "ModelKinds": ", ".join(
            f"{k} ({n})" for k, n in fits["model_kind"].value_counts().sort_index().items()
        )
        if len(fits)
        else "none",
        "LooMedianError": f"{validated['loo_median_error'].median():.1%}"
        if len(validated)
        else "n/a",
        "LooMaxError": f"{validated['loo_max_error'].max():.1%}" if len(validated) else "n/a",
        "MaxExtrapolation": _fmt(plan_config["max_extrapolation"]),
        "MaxExtrapolationUnvalidated": _fmt(
            min(
                plan_config["max_extrapolation"],
                plan_config.get(
                    "max_extrapolation_unvalidated", DEFAULT_MAX_EXTRAPOLATION_UNVALIDATED
                ),
            )
        ),
        "PlanObjective": {
            MIN_TIME: "the shortest time to train all jobs (makespan)",
            MIN_NODE_HOURS: "the fewest charged node-hours",
        }[plan_config["objective"]],
        "PlanLimits": "; ".join(
            f"{k.replace('_', ' ')} {_fmt(v)}"
            for k in ("budget_node_hours", "budget_kwh", "deadline_hours")
            if (v := plan_config.get(k)) is not None
        )
        or "no budget or deadline",
    }
    if isinstance(result, Exception):
        m.update(
            PlanOutcome=f"No plan: {result}",
            PlanJobs=len(plan_config.get("jobs") or []),
            PlanMakespanHours="n/a",
            PlanChargedNodeHours="n/a",
            PlanSolveSeconds="n/a",
            PlanBinding="n/a",
            PlanExtrapolated="n/a",
        )
    else:
        binding = (
            result.constraints[result.constraints["binding"]]
            if len(result.constraints)
            else result.constraints
        )
        m.update(
            PlanOutcome="The plan below is the exact optimum of the integer program",
            PlanJobs=len(result.plan),
            PlanMakespanHours=_hours(result.plan["hours"].max()),
            PlanChargedNodeHours=_hours(result.plan["charged_node_hours"].sum()),
            PlanSolveSeconds=f"{result.solve_seconds:.2f}",
            PlanBinding=", ".join(binding["constraint"]) if len(binding) else "none",
            PlanExtrapolated=int(result.plan["extrapolated"].astype(bool).sum()),
        )
    return {_macro_name(k): tex_escape(v) for k, v in m.items()}


def _memory_lines(plan: pd.DataFrame) -> str:
    """Per planned job, its memory check in words (measured, predicted or not checked)."""
    from dlscale.outputs.report import tex_escape

    if "memory_check" not in plan or plan.empty:
        return ""
    items = "; ".join(
        f"{r.job}: {r.memory_check}" for r in plan.itertuples(index=False) if r.memory_check
    )
    return f"\\noindent Memory per rank: {tex_escape(items)}.\n" if items else ""


def _longtable(spec: str, head: str, rows: list[str], empty: str) -> str:
    if not rows:
        return empty + "\n"
    return (
        "{\\footnotesize\\setlength\\tabcolsep{3pt}\n"
        f"\\begin{{longtable}}{{{spec}}}\n\\toprule\n{head} \\\\\n\\midrule\\endhead\n"
        + "\n".join(rows)
        + "\n\\bottomrule\n\\end{longtable}}\n"
    )


def recommendation_tables(
    result, fits: pd.DataFrame, max_rows: int = 40, max_fit_rows: int = 60
) -> str:
    """The plan, constraints, alternatives (at most max_rows) and model-fit (at most
    max_fit_rows, about two pages) tables in LaTeX."""
    from dlscale.outputs.report import _fmt, tex_escape

    e = tex_escape
    parts = []
    if not isinstance(result, Exception):
        rows = [
            " & ".join(
                [
                    e(r.job),
                    e(r.framework),
                    e(r.hardware),
                    e(r.policy),
                    e(r.parallelism),
                    str(int(r.nodes)) + ("$^*$" if r.extrapolated else ""),
                    _hours(r.hours),
                    f"{_hours(r.hours_low)}--{_hours(r.hours_high)}"
                    if pd.notna(r.hours_low) and pd.notna(r.hours_high)
                    else "--",
                    e(r.interval) + (" + LOO" if r.validated in (True, 1) else ""),
                    _hours(r.node_hours),
                    _hours(r.charged_node_hours),
                    _hours(r.energy_kwh),
                ]
            )
            + r" \\"
            for r in result.plan.itertuples(index=False)
        ]
        parts.append(
            "\\subsection*{Plan}\n"
            + _longtable(
                "llllllrlrrrr",
                "Job & Framework & Partition & Policy & Strategy & Nodes & Time (h) & Interval & "
                "Kind & Node-h & Charged & kWh",
                rows,
                "No job.",
            )
            + "\\noindent $^*$ beyond the series' largest measured node count (extrapolated). "
            "Kind: the interval over repetitions (range, ci, none); + LOO: widened by the "
            "series' largest leave-one-out error (validated series only).\n"
            + _memory_lines(result.plan)
        )
        rows = [
            f"{e(r.constraint)} & {_fmt(r.used)} & {_fmt(r.limit)} & "
            f"{'yes' if r.tight else 'no'} & {'yes' if r.binding else 'no'} \\\\"
            for r in result.constraints.itertuples(index=False)
        ]
        parts.append(
            "\\subsection*{Constraints}\n"
            + _longtable("lrrll", "Constraint & Used & Limit & Tight & Binding", rows, "None.")
        )
        alt = result.alternatives.head(max_rows)
        rows = [
            f"{e(r.job)} & {e(r.framework)} & {e(r.hardware)} & {e(r.policy)} & "
            f"{e(r.parallelism)} & {int(r.nodes)} & {_hours(r.hours)} & "
            f"{_hours(r.charged_node_hours)} & {e(r.lost_because)} \\\\"
            for r in alt.itertuples(index=False)
        ]
        more = len(result.alternatives) - len(alt)
        parts.append(
            "\\subsection*{Alternatives the plan beat}\n"
            + _longtable(
                "llllllrrp{0.3\\linewidth}",
                "Job & Framework & Partition & Policy & Strategy & Nodes & Time (h) & Charged & "
                "Lost because",
                rows,
                "No alternative: every job had one option.",
            )
            + (f"\\noindent {more} more in \\texttt{{plan/alternatives.csv}}.\n" if more else "")
        )
    rows = []
    shown = fits.head(max_fit_rows)
    for r in shown.itertuples(index=False):
        err = (
            f"{r.loo_median_error:.1%} / {r.loo_max_error:.1%}"
            if r.loo_status == "validated"
            else e(r.loo_status)
        )
        rows.append(
            f"{e(r.framework)} & {e(r.model)} & {e(r.hardware)} & {e(r.policy)} & "
            f"{e(r.precision)} {e(r.mode)} & {e(r.node_counts)} & {int(r.reps_min)} & "
            f"{e(r.model_kind)} & {e(err)} \\\\"
        )
    parts.append(
        "\\subsection*{Scaling model per series}\n"
        + _longtable(
            "llllllrlp{0.28\\linewidth}",
            "Framework & Model & HW & Policy & Variant & Nodes & n & Model & "
            "LOO error median / max",
            rows,
            "No measured series.",
        )
        + (
            f"\\noindent {len(fits) - len(shown)} more series in "
            "\\texttt{tables/model\\_fit.csv}.\n"
            if len(fits) > len(shown)
            else ""
        )
    )
    return "".join(parts)


def write_recommendations(
    result, fits: pd.DataFrame, plan_config: dict, macros_out: str, tables_out: str
) -> None:
    from dlscale.outputs.report import write_macros

    Path(macros_out).parent.mkdir(parents=True, exist_ok=True)
    write_macros(recommendation_macros(result, fits, plan_config), macros_out)
    Path(tables_out).write_text(recommendation_tables(result, fits))


def run_plan_rule(
    predictions_csv: str,
    fits_csv: str,
    plan_config: dict,
    hardware: dict,
    models: list[str],
    out: dict,
    width_in: float = 3.5,
    status_csv: str | None = None,
) -> None:
    """The rule `plan`: plan.csv, alternatives.csv, constraints.csv, the figure and the
    report's Recommendations inputs; an infeasible plan is written as its message (the
    workflow goes on: the report says why there is no plan). `status_csv`: the status table,
    whose does_not_fit cells are never offered."""
    preds = pd.read_csv(predictions_csv)
    fits = pd.read_csv(fits_csv)
    does_not_fit = read_status(status_csv) if status_csv else None
    try:
        result = plan_from_config(preds, plan_config, hardware, models, does_not_fit)
    except PlanError as exc:
        result = exc
    write_plan(result, str(Path(out["plan"]).parent))
    plot_plan(result, out["plan_figure"], width_in)
    write_recommendations(result, fits, plan_config, out["plan_macros"], out["plan_tables"])

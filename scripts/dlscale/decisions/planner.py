"""The planner: which framework, partition and node count for each training job, within a budget
or a deadline, from the fitted scaling models (dlscale.analysis.scaling_model) and the site's
partitions
(config/hardware.yaml: nodes_available, node_hour_cost, node_power_w).

The model (`solve`: variables, objective, constraints, in that order) is an integer program on
PuLP with its bundled CBC:

- x[j, o] in {0, 1}: job j runs option o = (series, partition, nodes), with the predicted time
  T[j, o] = samples_j / throughput_o; sum_o x[j, o] = 1 for every job;
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

    python -m dlscale.decisions.planner results/demo [--study-file F] [--job MODEL:SAMPLES]
    [--objective O]
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
from dlscale.study.partitions import Partition, partitions_from_hardware  # noqa: F401 (re-exported)

MIN_TIME, MIN_NODE_HOURS = "min_time", "min_node_hours"
OBJECTIVES = (MIN_TIME, MIN_NODE_HOURS)
DEFAULT_SAMPLES = 1_000_000
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
        samples = job.get("samples")
        if samples is None and job.get("epochs") is not None:
            samples = job["epochs"] * job["samples_per_epoch"]
        if samples is None:
            raise PlanError(f"plan.jobs[{i}]: give samples, or epochs and samples_per_epoch")
        out.append({**job, "name": job.get("name") or f"job{i + 1}", "samples": float(samples)})
    names = [job["name"] for job in out]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise PlanError(f"plan.jobs: job names must differ; given more than once: {twice}")
    return out


def options(
    predictions: pd.DataFrame,
    jobs: list[dict],
    partitions: list[Partition],
    *,
    budget_kwh: float | None = None,
) -> pd.DataFrame:
    """Every (job, series, partition, nodes) the jobs may run on: a predicted throughput, at
    most the partition's nodes_available; time (hours, with its interval), node-hours, charged
    node-hours (x node_hour_cost), energy (kWh; NaN where the power is unknown)."""
    parts = {p.name: p for p in partitions}
    rows = []
    predictions = with_axes(predictions)
    pred = predictions[predictions["hardware"].isin(parts)] if len(predictions) else predictions
    for j, job in enumerate(jobs):
        sel = pred[pred["model"] == job["model"]] if len(pred) else pred
        for axis, key in (
            ("framework", "frameworks"),
            ("hardware", "hardware"),
            ("policy", "policy"),
            ("precision", "precision"),
            ("mode", "mode"),
        ):
            allowed = job.get(key)
            if allowed:
                sel = sel[sel[axis].isin([allowed] if isinstance(allowed, str) else allowed)]
        sel = sel[sel["nodes"] <= sel["hardware"].map(lambda h: parts[h].nodes_available)]
        rate = sel["throughput_samples_per_s_pred"].to_numpy(float)
        sel = sel[np.isfinite(rate) & (rate > 0)]  # a model that predicts nothing there
        if sel.empty:
            continue
        x = sel["throughput_samples_per_s_pred"].to_numpy(float)
        hours = job["samples"] / x / 3600
        cost = sel["hardware"].map(lambda h: parts[h].node_hour_cost).to_numpy(float)
        power = (
            sel["hardware"]
            .map(lambda h: np.nan if parts[h].node_power_w is None else parts[h].node_power_w)
            .to_numpy(float)
        )
        rows.append(
            sel.assign(
                job=job["name"],
                job_index=j,
                samples=job["samples"],
                hours=hours,
                hours_low=job["samples"] / sel["throughput_samples_per_s_high"] / 3600,
                hours_high=job["samples"] / sel["throughput_samples_per_s_low"] / 3600,
                node_hours=sel["nodes"] * hours,
                charged_node_hours=sel["nodes"] * hours * cost,
                energy_kwh=sel["nodes"] * hours * power / 1000,
            )
        )
    out = pd.concat(rows, ignore_index=True) if rows else pd.DataFrame()
    if budget_kwh is not None and len(out):
        out = out[out["energy_kwh"].notna()]
    return out


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


PLAN_COLUMNS = [
    "job",
    "model",
    "samples",
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
) -> Plan:
    """The plan for `jobs` on `partitions` from the predictions table
    (dlscale.analysis.scaling_model)."""
    if objective not in OBJECTIVES:
        raise PlanError(f"objective {objective!r}; allowed: {', '.join(OBJECTIVES)}")
    if objective == MIN_NODE_HOURS and deadline_hours is None:
        raise PlanError("objective min_node_hours needs deadline_hours")
    limits = {
        "budget_node_hours": budget_node_hours,
        "budget_kwh": budget_kwh,
        "deadline_hours": deadline_hours,
    }
    all_opts = options(predictions, jobs, partitions, budget_kwh=budget_kwh)
    for j, job in enumerate(jobs):
        if all_opts.empty or not (all_opts["job_index"] == j).any():
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
        alternatives=_alternatives(all_opts, plan, objective, limits),
        constraints=_constraints(opts, plan, len(jobs), capacity, limits, objective, values),
        objective=objective,
        objectives=values,
        limits=limits,
        solve_seconds=seconds,
        options=opts,
    )


def _alternatives(all_opts, plan, objective, limits) -> pd.DataFrame:
    """Per job, the best option of every series x partition it did not choose, and why it lost."""
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
    predictions: pd.DataFrame, plan_config: dict, hardware: dict, models: list[str]
) -> Plan:
    return make_plan(
        predictions,
        jobs_from_config(plan_config, models),
        partitions_from_hardware(hardware),
        objective=plan_config.get("objective", MIN_TIME),
        budget_node_hours=plan_config.get("budget_node_hours"),
        budget_kwh=plan_config.get("budget_kwh"),
        deadline_hours=plan_config.get("deadline_hours"),
    )


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
        metavar="MODEL:SAMPLES",
        help="a job (repeatable); replaces the config's jobs",
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
            model, _, samples = j.partition(":")
            try:
                plan_config["jobs"].append({"model": model, "samples": float(samples)})
            except ValueError:
                parser.error(f"--job {j!r}: give MODEL:SAMPLES, e.g. resnet50:1.28e8")
    cells = pd.read_csv(Path(args.results) / "tables" / "cells.csv")
    plan_nodes = {p.name: p.nodes_available for p in partitions_from_hardware(hardware)}
    _, preds = model_tables(
        cells,
        plan_config.get("predict_nodes"),
        plan_config["max_extrapolation"],
        plan_nodes,
        plan_config["max_extrapolation_unvalidated"],
    )
    try:
        result = plan_from_config(preds, plan_config, hardware, sorted(cells["model"].unique()))
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
                    "nodes",
                    "hours",
                    "hours_low",
                    "hours_high",
                    "interval",
                    "charged_node_hours",
                    "energy_kwh",
                    "extrapolated",
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
                "lllllrlrrrr",
                "Job & Framework & Partition & Policy & Nodes & Time (h) & Interval & Kind & "
                "Node-h & Charged & kWh",
                rows,
                "No job.",
            )
            + "\\noindent $^*$ beyond the series' largest measured node count (extrapolated). "
            "Kind: the interval over repetitions (range, ci, none); + LOO: widened by the "
            "series' largest leave-one-out error (validated series only).\n"
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
            f"{e(r.job)} & {e(r.framework)} & {e(r.hardware)} & {e(r.policy)} & {int(r.nodes)} "
            f"& {_hours(r.hours)} & {_hours(r.charged_node_hours)} & {e(r.lost_because)} \\\\"
            for r in alt.itertuples(index=False)
        ]
        more = len(result.alternatives) - len(alt)
        parts.append(
            "\\subsection*{Alternatives the plan beat}\n"
            + _longtable(
                "lllllrrp{0.3\\linewidth}",
                "Job & Framework & Partition & Policy & Nodes & Time (h) & Charged & Lost because",
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
) -> None:
    """The rule `plan`: plan.csv, alternatives.csv, constraints.csv, the figure and the
    report's Recommendations inputs; an infeasible plan is written as its message (the
    workflow goes on: the report says why there is no plan)."""
    preds = pd.read_csv(predictions_csv)
    fits = pd.read_csv(fits_csv)
    try:
        result = plan_from_config(preds, plan_config, hardware, models)
    except PlanError as exc:
        result = exc
    write_plan(result, str(Path(out["plan"]).parent))
    plot_plan(result, out["plan_figure"], width_in)
    write_recommendations(result, fits, plan_config, out["plan_macros"], out["plan_tables"])

"""The planner: which framework, parallelism strategy, partition and node count for each
training job, within a budget or a deadline, from the fitted scaling models (one per series, so
per strategy: dlscale.analysis.scaling_model) and the site's partitions (config/hardware.yaml:
nodes_available, node_hour_cost, node_power_w, device_memory_gib).

What is offered (`plan_options.candidate_options`): an option (series, partition, nodes) only
where its peak memory per rank fits the partition's device_memory_gib: measured where the series
measured that node count, else predicted from its nearest measured node count (the state
bytes as 1 / the strategy's sharding degree, the rest held: scaling_series.memory_per_rank);
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

The model (`plan_program.solve`: variables, objective, constraints, in that order) is an
integer program on PuLP with its bundled CBC:

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
names the smallest one that would be feasible. The report's Recommendations section:
`plan_report`.

    python -m dlscale.decisions.planner results/demo [--study-file F]
        [--job MODEL:SAMPLES | MODEL:samples=N | MODEL:tokens=N] [--objective O]
        [--budget-node-hours B] [--budget-kwh E] [--deadline-hours D] [--out DIR]
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from dlscale.analysis.stats import GROUP
from dlscale.decisions.plan_jobs import NOTHING_TO_PLAN, no_series_refusal, objective_refusal
from dlscale.decisions.plan_options import (
    DOES_NOT_FIT,
    PlanError,
    candidate_options,
    fastest_per_slot,
    jobs_from_config,
    parse_job,
)
from dlscale.decisions.plan_program import (
    _REL,
    MIN_NODE_HOURS,
    MIN_TIME,
    OBJECTIVES,
    _constraints,
    _smallest_feasible,
    solve,
)
from dlscale.decisions.plan_report import write_recommendations
from dlscale.study.partitions import (  # noqa: F401 (re-exported)
    DEVICE_MEMORY_KEY,
    Partition,
    partitions_from_hardware,
)

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
    refused = objective_refusal(objective, deadline_hours)
    if refused:
        raise PlanError(refused)
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
            raise PlanError(no_series_refusal(job, partitions, budget_kwh))
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


# ---- files, report fragments, figure, command line ---------------------------------------------


def plan_from_config(
    predictions: pd.DataFrame,
    plan_config: dict,
    hardware: dict,
    models: list[str],
    does_not_fit: pd.DataFrame | None = None,
) -> Plan:
    jobs = jobs_from_config(plan_config, models)
    if not jobs:
        raise PlanError(NOTHING_TO_PLAN)
    return make_plan(
        predictions,
        jobs,
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
    from dlscale.outputs.plan_figure import plot_plan_options

    plot_plan_options(result, out, width_in)


def _parser() -> argparse.ArgumentParser:
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
    return parser


def _workflow_config(args) -> tuple[dict, dict]:
    """The workflow's validated config (with the study file) and hardware file."""
    from dlscale.study.config import load_schema, load_yaml, validate_config
    from dlscale.study.hardware import validate_hardware
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
    return config, hardware


def _plan_config(args, config: dict, parser: argparse.ArgumentParser) -> dict:
    """The config's plan: section with the command line's objective, limits and jobs over it."""
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
    return plan_config


def _table_or(table: pd.DataFrame, sentence: str) -> str:
    """`table` as text, or `sentence` where it has no rows (pandas would print "Empty
    DataFrame" and its columns)."""
    return table.to_string(index=False) if len(table) else sentence


def _print_plan(result: Plan) -> None:
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
        print("\nconstraints:\n" + _table_or(result.constraints, "none."))
        print(
            "\nalternatives:\n"
            + _table_or(
                result.alternatives,
                "none: each job had one measured series (framework, hardware, policy, "
                "precision, ...) to run on, so no other series lost to the plan's choice.",
            )
        )
    print(f"\nsolved in {result.solve_seconds:.3f} s ({len(result.options)} options)")


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)

    from dlscale.analysis.scaling_model import model_tables

    config, hardware = _workflow_config(args)
    plan_config = _plan_config(args, config, parser)
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
    _print_plan(result)
    if args.out:
        write_plan(result, args.out)
    return 0


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


if __name__ == "__main__":
    raise SystemExit(main())

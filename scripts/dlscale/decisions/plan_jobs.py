"""The planner's jobs and every check it makes on the study's own settings, in pure Python.

The planner (dlscale.decisions.planner) refuses a plan whose jobs cannot be planned: a job in
tokens for a model without a sequence length, a model or axis value the study does not measure,
an energy budget without any partition's node power, a deadline objective without a deadline.
Those refusals depend on the study's settings alone, so the workflow makes the same checks when
it parses the study (`plan_problems`, rules/common.smk), with the same messages, instead of
after every cell has run. Nothing here imports numpy, pandas or scipy: it runs at every parse.
"""

from __future__ import annotations

DEFAULT_SAMPLES = 1_000_000
JOB_AMOUNTS = ("samples", "tokens")  # what a job may be given in (--job MODEL:KEY=N)


# Why a study without throughput cells and without plan.jobs has no plan: its default jobs are
# the models of its throughput cells (rules/plan.smk), so it has none.
NOTHING_TO_PLAN = (
    "nothing to plan: the study has no throughput cells (the planner plans from their "
    "scaling) and plan.jobs names no job"
)


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


MIN_TIME, MIN_NODE_HOURS = "min_time", "min_node_hours"
OBJECTIVES = (MIN_TIME, MIN_NODE_HOURS)


def objective_refusal(objective: str, deadline_hours) -> str | None:
    """Why the plan's objective cannot be planned for (None when it can)."""
    if objective not in OBJECTIVES:
        return f"objective {objective!r}; allowed: {', '.join(OBJECTIVES)}"
    if objective == MIN_NODE_HOURS and deadline_hours is None:
        return "objective min_node_hours needs deadline_hours"
    return None


def tokens_refusal(job: dict, token_models: list[str]) -> str:
    """The refusal of a job in tokens for a model without a sequence length; `token_models`:
    the models the study measures that have one."""
    return (
        f"job {job['name']!r}: tokens is for models with a sequence length; "
        f"{job['model']!r} has none (give samples); allowed models for tokens: "
        f"{', '.join(token_models) or 'none measured'}"
    )


def no_series_refusal(job: dict, partitions, budget_kwh=None) -> str:
    """The refusal of a job that no measured series of the study matches."""
    why = " with a known node_power_w" if budget_kwh is not None else ""
    return (
        f"job {job['name']!r}: no measured series of model {job['model']!r} on any "
        f"partition{why} ({', '.join(p.name for p in partitions)}) matches it"
    )


# A job's filters (plan.jobs[].<key>) and the axis of the study's cells each one selects.
JOB_FILTERS = {
    "frameworks": "framework",
    "hardware": "hardware",
    "policy": "policy",
    "precision": "precision",
    "mode": "mode",
    "parallelism": "parallelism",
}


def plan_problems(plan: dict, models: list[str], cells, partitions) -> list[str]:
    """The refusals the planner would make of `plan` (the study's validated plan: section) for
    the study whose models are `models` (its throughput axis: the default jobs) and whose
    throughput cells are `cells` (dlscale.study.cell.Cell), on `partitions`
    (dlscale.study.partitions.partitions_from_hardware), from the settings alone: [] when the
    planner can plan from what the cells will measure."""
    from dlscale.models import SPECS, seq_len_of

    problems = []
    objective = objective_refusal(plan.get("objective", MIN_TIME), plan.get("deadline_hours"))
    if objective:
        problems.append(objective)
    try:
        jobs = jobs_from_config(plan, models)
    except PlanError as exc:
        return [*problems, str(exc)]
    budget_kwh = plan.get("budget_kwh")
    usable = [p for p in partitions if budget_kwh is None or p.node_power_w is not None]
    names = {p.name for p in usable}
    measured = sorted({c.model for c in cells})
    token_models = [m for m in measured if m in SPECS and seq_len_of(SPECS[m])]
    for job in jobs:
        series = [c for c in cells if c.model == job["model"] and c.hardware in names]
        for key, axis in JOB_FILTERS.items():
            allowed = job.get(key)
            if allowed:
                allowed = [allowed] if isinstance(allowed, str) else allowed
                series = [c for c in series if getattr(c, axis) in allowed]
        if not series:
            problems.append(no_series_refusal(job, partitions, budget_kwh))
        elif job.get("tokens") is not None and job["model"] not in token_models:
            problems.append(tokens_refusal(job, token_models))
    return problems

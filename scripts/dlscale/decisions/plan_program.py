"""The planner's integer program (dlscale.decisions.planner) on PuLP with its bundled CBC:
the objectives and their lexicographic order, the program (variables, objective, constraints),
the solve, the smallest feasible budget or deadline when none is met, and the constraints'
binding test (solve again without each)."""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd

from dlscale.decisions.plan_jobs import (  # noqa: F401 (re-exported)
    MIN_NODE_HOURS,
    MIN_TIME,
    OBJECTIVES,
)

_REL = 1e-7  # relative slack when an earlier objective is fixed at its optimum


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


def _apart(asked: float, least: float) -> tuple[str, str]:
    """The asked and the smallest feasible limit, each with as many significant digits (4 at
    least) as it takes for the two to read differently: a budget of 19.0476 against a need of
    19.0512 reads 19.048 and 19.051, not 19.05 and 19.05."""
    for digits in range(4, 17):
        a, b = f"{asked:.{digits}g}", f"{least:.{digits}g}"
        if a != b:
            return a, b
    return repr(asked), repr(least)


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
            asked, least = _apart(limits[key], need)
            msgs.append(
                f"{key} {asked} is infeasible; the smallest feasible {key} is {least} {unit}"
            )
    if limits.get("budget_kwh") is not None:
        other = {k: v for k, v in limits.items() if k != "budget_kwh"}
        prob_best = _min_energy(opts, n_jobs, capacity, other)
        if prob_best is not None and prob_best > limits["budget_kwh"] * (1 + _REL):
            asked, least = _apart(limits["budget_kwh"], prob_best)
            msgs.append(
                f"budget_kwh {asked} is infeasible; the smallest feasible budget_kwh is {least} kWh"
            )
    return "; ".join(msgs) or "the budget and deadline together are infeasible"


def _min_energy(opts, n_jobs, capacity, limits) -> float | None:
    import pulp

    prob, x, _ = _program(opts, n_jobs, capacity, limits, "sum_hours", {})
    energy = opts["energy_kwh"].to_numpy(float)
    prob.setObjective(pulp.lpSum(energy[i] * x[i] for i in range(len(x))))
    return pulp.value(prob.objective) if _solve(prob) else None


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

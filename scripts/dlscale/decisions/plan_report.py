"""The report's Recommendations section from a plan (dlscale.decisions.planner): the dls...
macros (the scaling models' validation, the objective, the limits, the plan's outcome) and the
LaTeX tables (plan, constraints, alternatives, model fit per series), never typed numbers."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from dlscale.decisions.plan_program import MIN_NODE_HOURS, MIN_TIME


def _hours(h: float) -> str:
    from dlscale.outputs.latex_text import _fmt

    return _fmt(h) if pd.notna(h) else "--"


def recommendation_macros(result, fits: pd.DataFrame, plan_config: dict) -> dict[str, str]:
    """The numbers of the Recommendations section, as dls... macros (dlscale.outputs.latex_text)."""
    from dlscale.analysis.scaling_model import (
        DEFAULT_MAX_EXTRAPOLATION_UNVALIDATED,
        MIN_NODE_COUNTS_LOO,
        MODEL_METHOD,
    )
    from dlscale.outputs.latex_text import _fmt, _macro_name, tex_escape

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
        "ModelContradicts": contradicts_text(fits),
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


def contradicts_text(fits: pd.DataFrame) -> str:
    """The series whose predictions contradict their own measurements
    (dlscale.analysis.scaling_model.CONTRADICTS), named, or that none does."""
    from dlscale.analysis.scaling_model import CONTRADICTS
    from dlscale.analysis.stats import GROUP

    column = fits.get("contradicts_measurements", pd.Series(dtype=object))
    bad = fits[column.fillna(False).astype(bool)] if len(fits) else fits
    if bad.empty:
        return "no series' prediction contradicts its measurements"
    names = "; ".join("/".join(str(row[k]) for k in GROUP if k in row) for _, row in bad.iterrows())
    return (
        f"{len(bad)} series ({names}) {'is' if len(bad) == 1 else 'are'} {CONTRADICTS} "
        "(crossed in red in the scaling figures): read such a prediction as the model "
        "failing on this series, not as a forecast"
    )


def _memory_lines(plan: pd.DataFrame) -> str:
    """Per planned job, its memory check in words (measured, predicted or not checked)."""
    from dlscale.outputs.latex_text import tex_escape

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


def _plan_tables(result, max_rows: int) -> list[str]:
    """The plan, constraints and alternatives (at most max_rows) tables in LaTeX."""
    from dlscale.outputs.latex_text import _fmt, tex_escape

    e = tex_escape
    parts = []
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
    return parts


def _fit_table(fits: pd.DataFrame, max_fit_rows: int) -> str:
    """The model-fit table (at most max_fit_rows, about two pages) in LaTeX."""
    from dlscale.outputs.latex_text import tex_escape

    e = tex_escape
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
    return (
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


def recommendation_tables(
    result, fits: pd.DataFrame, max_rows: int = 40, max_fit_rows: int = 60
) -> str:
    """The plan, constraints, alternatives (at most max_rows) and model-fit (at most
    max_fit_rows, about two pages) tables in LaTeX."""
    parts = []
    if not isinstance(result, Exception):
        parts += _plan_tables(result, max_rows)
    parts.append(_fit_table(fits, max_fit_rows))
    return "".join(parts)


def write_recommendations(
    result, fits: pd.DataFrame, plan_config: dict, macros_out: str, tables_out: str
) -> None:
    from dlscale.outputs.latex_text import write_macros

    Path(macros_out).parent.mkdir(parents=True, exist_ok=True)
    write_macros(recommendation_macros(result, fits, plan_config), macros_out)
    Path(tables_out).write_text(recommendation_tables(result, fits))

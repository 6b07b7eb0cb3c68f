"""The report's time-to-accuracy section (real data): its macros and its table, from the
convergence tables (dlscale.tta), kept apart from the throughput section (synthetic data).

Every number reaches LaTeX as a generated macro (`\\dlsConv...`) or a generated table
(convergence_table.tex); the text around them is the template's.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from .lr import RULE_FORMULAS
from .method import (
    INPUT_BOUND_MARGIN,
    LOADER_METHOD,
    TIME_TO_ACCURACY_EXCLUDES,
    TIME_TO_ACCURACY_METHOD,
    VALIDATION_METHOD,
)
from .stats import CI, CI_LEVEL, GROUP, RANGE
from .tta import numbers

INFINITY = (
    "$\\infty$"  # the open end of an interval with a repetition that did not reach the target
)


def _fmt(x, digits: int = 3) -> str:
    if x is None or pd.isna(x):
        return "--"
    return f"{x:.{digits}g}" if abs(x) < 10**digits else f"{x:,.0f}"


def _join(values) -> str:
    return ", ".join(str(v) for v in values)


def convergence_macros(config: dict, cells: pd.DataFrame, tta: pd.DataFrame) -> dict[str, str]:
    """Macro name (without the dls prefix) -> value (not yet escaped)."""
    conv = config["convergence"]
    planned = "convergence" in config["workloads"]
    m = {
        "ConvPlanned": "yes" if planned else "no",
        "ConvWorkloads": " and ".join(config["workloads"]),
        "ConvDataset": conv["dataset"],
        "ConvDataFormat": conv["data_format"],
        "ConvTarget": f"{conv['target_accuracy']:.1%}".replace("%", " %"),
        "ConvMaxEpochs": conv["max_epochs"],
        "ConvLrRule": conv["lr_rule"],
        "ConvLrFormula": RULE_FORMULAS[conv["lr_rule"]],
        "ConvBaseLr": f"{conv['learning_rate']:g}",
        "ConvMomentum": f"{config['optimizer']['momentum']:g}",
        "ConvWarmupEpochs": f"{conv['warmup_epochs']:g}",
        "ConvMethod": TIME_TO_ACCURACY_METHOD,
        "ConvExcluded": TIME_TO_ACCURACY_EXCLUDES,
        "ConvValidation": VALIDATION_METHOD,
        "ConvLoaderMethod": LOADER_METHOD,
        "ConvInputBoundMargin": f"{INPUT_BOUND_MARGIN:g}",
        "ConvCellsMeasured": len(cells),
        "ConvCellsReached": int(cells["reached"].astype(bool).sum()) if len(cells) else 0,
        "ConvCellsNotReached": int((~cells["reached"].astype(bool)).sum()) if len(cells) else 0,
        "ConvCellsCompeting": int(cells["competing"].fillna(False).astype(bool).sum())
        if len(cells) and "competing" in cells
        else 0,
    }
    measured = [
        "ConvReferenceBatch",
        "ConvTrainSamples",
        "ConvValSamples",
        "ConvEffectiveLr",
        "ConvStartupMax",
        "ConvWarmupPassMax",
        "ConvValidationMax",
        "ConvRepsMin",
        "ConvRepsMax",
        "ConvFastest",
        "ConvNotReachedList",
        "ConvLoaderRatioRange",
        "ConvInputBoundCells",
        "ConvInputBoundList",
        "ConvStaging",
    ]
    m.update({k: "n/a" for k in measured})
    if len(cells):
        m["ConvReferenceBatch"] = _join(sorted(cells["reference_batch"].unique()))
        m["ConvTrainSamples"] = _join(sorted(cells["train_samples"].unique()))
        m["ConvValSamples"] = _join(sorted(cells["val_samples"].unique()))
        m["ConvEffectiveLr"] = _join(
            f"{lr:.4g} (global batch {int(b)})"
            for b, lr in sorted(
                cells.groupby("global_batch")["effective_learning_rate"].first().items()
            )
        )
        for name, column in (
            ("ConvStartupMax", "startup_seconds"),
            ("ConvWarmupPassMax", "warmup_pass_seconds"),
            ("ConvValidationMax", "validation_seconds"),
        ):
            m[name] = _fmt(pd.to_numeric(cells[column], errors="coerce").max())
        m["ConvRepsMin"], m["ConvRepsMax"] = int(tta["n"].min()), int(tta["n"].max())
        done = tta.dropna(subset=["time_to_accuracy_s_median"])
        if len(done):
            best = done.loc[done["time_to_accuracy_s_median"].idxmin()]
            m["ConvFastest"] = (
                f"{_fmt(best['time_to_accuracy_s_median'])} s ({best['framework']}, "
                f"{best['model']}, {best['policy']} scaling, {int(best['nodes'])} node(s), "
                f"global batch {int(best['global_batch'])})"
            )
        else:
            m["ConvFastest"] = "no point reached the target"
        missed = cells[~cells["reached"].astype(bool)]
        m["ConvNotReachedList"] = (
            "none"
            if missed.empty
            else _join(
                f"{r.framework}/{r.model}/{r.policy}/n{r.nodes}/r{r.rep} (best "
                f"{r.best_val_accuracy:.1%} after {r.epochs_run} epochs)".replace("%", " %")
                for r in missed.itertuples()
            )
        )
        m.update(_input_pipeline(cells))
    return m


def _input_pipeline(cells: pd.DataFrame) -> dict[str, str]:
    """The loader-only measurement and the staging over the measured cells."""
    m = {}
    ratio = numbers(cells, "loader_train_ratio")
    measured = cells[ratio.notna()]
    if measured.empty:
        m["ConvLoaderRatioRange"] = "not measured (cells from before the loader-only measurement)"
        m["ConvInputBoundCells"], m["ConvInputBoundList"] = "n/a", "n/a"
    else:
        r = ratio.dropna()
        m["ConvLoaderRatioRange"] = f"{_fmt(r.min())}--{_fmt(r.max())}"
        bound = measured[measured["input_bound"].eq(True)]
        m["ConvInputBoundCells"] = f"{len(bound)} of {len(measured)}"
        m["ConvInputBoundList"] = (
            "none"
            if bound.empty
            else _join(
                f"{r.framework}/{r.model}/{r.policy}/n{r.nodes}/r{r.rep} "
                f"({_fmt(r.loader_train_ratio)})"
                for r in bound.itertuples()
            )
        )
    staged = numbers(cells, "staged_seconds")
    if staged.dropna().empty:
        m["ConvStaging"] = "The ranks read the dataset in place (no hardware entry sets stage_dir)"
    else:
        dirs = _join(sorted(cells["stage_dir"].dropna().unique()))
        copied = numbers(cells, "staged_bytes").sum()
        m["ConvStaging"] = (
            f"{int(staged.notna().sum())} of {len(cells)} cells staged the dataset to {dirs} "
            f"before training (once per node; at most {_fmt(staged.max())} s per cell, "
            f"{copied / 1e6:.3g} MB copied in all, a copy already there reused)"
        )
    return m


def _tta_cell(r) -> str:
    """median [CI] or (range) of time-to-accuracy; "not reached" without a median."""
    if pd.isna(r.time_to_accuracy_s_median):
        return f"not reached ($\\geq${_fmt(r.training_seconds_at_cap_max)})"
    med = _fmt(r.time_to_accuracy_s_median)
    low, high = r.time_to_accuracy_s_ci_low, r.time_to_accuracy_s_ci_high
    high_text = INFINITY if np.isinf(high) else _fmt(high)
    if r.interval == RANGE:
        return f"{med} ({_fmt(low)}--{high_text})"
    if r.interval == CI:
        return f"{med} [{_fmt(low)}, {high_text}]"
    return med


def _epochs_cell(r) -> str:
    if pd.isna(r.epochs_to_accuracy_median):
        return "--"
    med = f"{r.epochs_to_accuracy_median:g}"
    if r.n > 1 and r.epochs_to_accuracy_min != r.epochs_to_accuracy_max:
        high = r.epochs_to_accuracy_max
        high_text = INFINITY if np.isinf(high) else f"{high:g}"
        return f"{med} ({r.epochs_to_accuracy_min:g}--{high_text})"
    return med


def _loader_cell(r) -> str:
    """The smallest loader / train ratio over the repetitions, IB when one was input-bound."""
    ratio = getattr(r, "loader_train_ratio_min", np.nan)
    if pd.isna(ratio):
        return "--"
    return _fmt(ratio, 2) + (" IB" if getattr(r, "input_bound_reps", 0) else "")


def write_convergence_table(tta: pd.DataFrame, out: str, escape) -> None:
    """The time-to-accuracy table: one row per group and node count, with the batch policy,
    global batch and LR rule each point came from."""
    if tta.empty:
        Path(out).write_text("No convergence cell was measured.\n")
        return
    rows = []
    for r in tta.sort_values([*GROUP, "nodes"]).itertuples(index=False):
        rows.append(
            " & ".join(
                [
                    escape(r.framework),
                    escape(r.model),
                    escape(r.policy),
                    escape(f"{r.precision} {r.mode}" if r.mode != "eager" else r.precision),
                    str(int(r.nodes)),
                    str(int(r.global_batch)),
                    f"{escape(r.lr_rule)} {_fmt(r.effective_learning_rate, 3)}",
                    f"{int(r.reached_reps)}/{int(r.n)}",
                    _tta_cell(r),
                    _fmt(r.ideal_time_to_accuracy_s),
                    _epochs_cell(r),
                    f"{r.best_val_accuracy_median:.3f}",
                    _loader_cell(r),
                ]
            )
            + r" \\"
        )
    hardware = ", ".join(sorted(tta["hardware"].unique()))
    Path(out).write_text(
        f"\\noindent Hardware: \\texttt{{{escape(hardware)}}}. Time: median over the n "
        f"repetitions in seconds, with its {CI_LEVEL:.0%} order-statistic CI in square "
        "brackets (n $\\geq$ 6), the min--max range in parentheses (2 to 5), nothing for one; "
        "a repetition that did not reach the target counts as longer than any that did. "
        "Ideal: the smallest node count's time divided by the ratio of world sizes. "
        "Epochs: median (min--max). Loader / train: the input pipeline alone against training, "
        f"the smallest over ranks and repetitions; IB: below {INPUT_BOUND_MARGIN:g}, "
        "input-bound.\n\n".replace("%", "\\,\\%")
        + "{\\footnotesize\\setlength\\tabcolsep{1.5pt}\n"
        "\\begin{longtable}{llllrrlrlrlrr}\n\\toprule\n"
        "Framework & Model & Policy & Prec. & Nodes & Global & LR rule & Reached & "
        "Time to target [s] & Ideal [s] & Epochs & Best & Loader \\\\\n"
        "& & & & & batch & (eff.\\ LR) & n/N & median [CI]/(range) & & & val.\\ acc. "
        "& / train \\\\\n\\midrule\\endhead\n"
        + "\n".join(rows)
        + "\n\\bottomrule\n\\end{longtable}}\n"
    )

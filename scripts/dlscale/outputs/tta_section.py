"""The report's time-to-accuracy section (real data): its macros and its table, from the
convergence tables (dlscale.analysis.time_to_accuracy), kept apart from the throughput section
(synthetic data).

Every number reaches LaTeX as a generated macro (`\\dlsConv...`) or a generated table
(convergence_table.tex); the text around them is the template's.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from dlscale.analysis.stats import CI, CI_LEVEL, GROUP, NONE, RANGE
from dlscale.analysis.time_to_accuracy import (
    FIXED,
    IN_BAND,
    NO_REFERENCE,
    NOT_REACHED,
    REFERENCE,
    TOO_FAST,
    TOO_SLOW,
    VALIDITY_METHOD,
    numbers,
)
from dlscale.outputs import latex_text
from dlscale.registry.frameworks import FRAMEWORKS
from dlscale.study.lr import RULE_FORMULAS
from dlscale.study.protocol import (
    INPUT_BOUND_MARGIN,
    LOADER_METHOD,
    TIME_TO_ACCURACY_EXCLUDES,
    TIME_TO_ACCURACY_METHOD,
    VALIDATION_METHOD,
)

INFINITY = (
    "$\\infty$"  # the open end of an interval with a repetition that did not reach the target
)


def _fmt(x, digits: int = 3) -> str:
    """latex_text's number for reading (never 1e+02), "--" where there is none."""
    if x is None or pd.isna(x):
        return "--"
    return latex_text._fmt(x, digits)


def _range(low, high, digits: int = 3) -> str:
    return latex_text._range(low, high, digits)


def _join(values) -> str:
    return ", ".join(str(v) for v in values)


_MEASURED_CONVERGENCE_KEYS = [
    "ConvReferenceBatch",
    "ConvTrainSamples",
    "ConvValSamples",
    "ConvEffectiveLr",
    "ConvStartupMax",
    "ConvWarmupPassMax",
    "ConvValidationMax",
    "ConvRepsMin",
    "ConvRepsMax",
    "ConvReps",
    "ConvFastest",
    "ConvNotReachedList",
    "ConvLoaderRatioRange",
    "ConvInputBoundCells",
    "ConvInputBoundList",
    "ConvStaging",
    "ConvValidityBands",
    "ConvValidityCounts",
    "ConvValidityFlagged",
    "ConvFrameworkComparison",
    "ConvFrameworkInit",
]


def _convergence_optimizer(config: dict) -> str:
    """The convergence cells' optimizer in words (config optimizer.name, `auto` resolved per
    model: dlscale.registry.optimizers): SGD with its momentum, AdamW with its settings."""
    from dlscale.models import SPECS
    from dlscale.registry.optimizers import optimizer_for
    from dlscale.study.hashes import LATER_OPTIMIZER_DEFAULTS

    # a config validated before the optimizer's later keys existed has their defaults
    settings = {**LATER_OPTIMIZER_DEFAULTS, **config.get("optimizer", {})}
    models = (config.get("convergence", {}).get("axes") or {}).get("model") or (
        config.get("axes", {}).get("model") or []
    )
    names = sorted(
        {optimizer_for(settings["name"], SPECS[m].family) for m in models if m in SPECS}
    ) or ["sgd"]
    words = []
    for name in names:
        if name == "adamw":
            beta1, beta2 = settings["betas"]
            clip = settings["grad_clip_norm"]
            words.append(
                f"AdamW (betas {beta1:g}/{beta2:g}, weight decay {settings['weight_decay']:g}"
                + (f", gradients clipped to norm {clip:g}" if clip is not None else "")
                + ")"
            )
        else:
            words.append(f"SGD with momentum {settings['momentum']:g}")
    return " and ".join(words)


def _planned_convergence_macros(config: dict, cells: pd.DataFrame) -> dict:
    """The convergence workload as configured, and how many of its cells ran and reached the
    target."""
    conv = config["convergence"]
    planned = "convergence" in config["workloads"]
    return {
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
        "ConvOptimizer": _convergence_optimizer(config),
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


def _measured_convergence_macros(cells: pd.DataFrame, tta: pd.DataFrame) -> dict:
    """The facts and numbers of the measured convergence cells (there are some)."""
    m = {}
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
    m["ConvReps"] = _range(m["ConvRepsMin"], m["ConvRepsMax"])
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
    m.update(framework_macros(tta))
    if "convergence_validity" in tta:
        m.update(validity_macros(tta))
    return m


def convergence_macros(config: dict, cells: pd.DataFrame, tta: pd.DataFrame) -> dict[str, str]:
    """Macro name (without the dls prefix) -> value (not yet escaped)."""
    m = _planned_convergence_macros(config, cells)
    m["ConvValidityMethod"] = VALIDITY_METHOD
    m.update({k: "n/a" for k in _MEASURED_CONVERGENCE_KEYS})
    if len(cells):
        m.update(_measured_convergence_macros(cells, tta))
    return m


def _plain_interval(median, low, high, kind: str, digits: int = 3) -> str:
    """A median and the interval its n allows, as plain text (a macro's value is escaped):
    [low, high] for a confidence interval, (low-high, range) for fewer repetitions."""
    text = _fmt(median, digits)
    high_text = "open" if np.isinf(high) else _fmt(high, digits)
    if kind == CI:
        return f"{text} [{_fmt(low, digits)}, {high_text}]"
    if kind == RANGE:
        return f"{text} (range {_fmt(low, digits)}-{high_text})"
    return text


def _framework_point(r) -> str:
    if pd.isna(r.time_to_accuracy_s_median):
        return f"{r.framework} not reached (n = {int(r.n)})"
    epochs = _plain_interval(
        r.epochs_to_accuracy_median,
        r.epochs_to_accuracy_min,
        r.epochs_to_accuracy_max,
        RANGE if r.n > 1 and r.epochs_to_accuracy_min != r.epochs_to_accuracy_max else NONE,
    )
    seconds = _plain_interval(
        r.time_to_accuracy_s_median,
        r.time_to_accuracy_s_ci_low,
        r.time_to_accuracy_s_ci_high,
        r.interval,
    )
    return f"{r.framework} {epochs} epochs, {seconds} s (n = {int(r.n)})"


def framework_macros(tta: pd.DataFrame) -> dict[str, str]:
    """ConvFrameworkComparison: at each global batch that more than one framework trained at
    (every other axis equal), every framework's epochs and time to accuracy, fastest
    first, with the interval its n allows; ConvFrameworkInit: the initialisation and data order
    of each framework measured."""
    names = sorted(tta["framework"].unique())
    init = "; ".join(f"{name}: {_initialisation(name)}" for name in names)
    parts = []
    # every axis but the framework held equal (those the table has), and the global batch
    keys = [a for a in [*GROUP, "nodes"] if a != "framework" and a in tta] + ["global_batch"]
    for _, group in tta.groupby(keys, sort=True):
        if group["framework"].nunique() < 2:
            continue
        first = group.iloc[0]
        model, policy, nodes, batch = (
            first[k] for k in ("model", "policy", "nodes", "global_batch")
        )
        order = group.assign(_t=group["time_to_accuracy_s_median"].fillna(np.inf)).sort_values(
            ["_t", "framework"]
        )
        rows = ", ".join(_framework_point(r) for r in order.itertuples())
        parts.append(f"global batch {int(batch)} ({model}, {policy}, {int(nodes)} node(s)): {rows}")
    return {
        "ConvFrameworkComparison": "; ".join(parts)
        if parts
        else "no global batch was trained by more than one framework",
        "ConvFrameworkInit": init,
    }


# How the report names a validity flag (dlscale.analysis.time_to_accuracy).
VALIDITY_WORDS = {
    REFERENCE: "reference",
    IN_BAND: "in band",
    TOO_FAST: "too fast",
    TOO_SLOW: "too slow",
    NOT_REACHED: "not reached",
    NO_REFERENCE: "no reference",
}


def _point(r) -> str:
    return (
        f"{r.framework}/{r.model}/{r.policy}/n{int(r.nodes)} (global batch {int(r.global_batch)})"
    )


def _band_text(r) -> str:
    """The band of a point's series and how it was derived, with the reference's n."""
    n = int(r.reference_n)
    if r.epochs_band == FIXED:
        return (
            f"{_fmt(r.epochs_band_low)}--{_fmt(r.epochs_band_high)} epochs (fixed tolerance "
            f"+/-{r.validity_tolerance * 100:g} %: the reference has n = 1, no band from "
            "repetitions)"
        )
    if r.epochs_band == NONE:
        return "none (the reference did not reach the target)"
    high = "open above" if np.isinf(r.epochs_band_high) else _fmt(r.epochs_band_high)
    kind = f"{CI_LEVEL:.0%} CI".replace("%", " %") if r.epochs_band == CI else "range"
    return f"{_fmt(r.epochs_band_low)}--{high} epochs ({kind} of the reference, n = {n})"


def validity_macros(tta: pd.DataFrame) -> dict[str, str]:
    """The convergence validity paragraph: how each series' band was derived, how many
    points fell where, and which were flagged."""
    refs = tta[tta["convergence_validity"] == REFERENCE]
    kinds = refs["epochs_band"].value_counts()
    fixed = refs.loc[refs["epochs_band"] == FIXED, "validity_tolerance"].dropna().unique()
    tolerance = " or ".join(f"+/-{x * 100:g} %" for x in sorted(fixed))
    parts = [
        f"{kinds[kind]} with {words}"
        for kind, words in (
            (CI, f"the {CI_LEVEL:.0%} CI of the reference's median (n >= 6)".replace("%", " %")),
            (RANGE, "the min-max range of the reference's repetitions (2 to 5: no CI)"),
            (
                FIXED,
                f"the fixed tolerance {tolerance} (convergence.validity_tolerance), as the "
                "reference has one repetition and so no band from repetitions",
            ),
            (NONE, "no band (the reference did not reach the target)"),
        )
        if kinds.get(kind, 0)
    ]
    compared = tta[tta["convergence_validity"] != REFERENCE]
    counts = compared["convergence_validity"].value_counts()
    flagged = compared[compared["convergence_validity"].isin([TOO_FAST, TOO_SLOW])]
    return {
        "ConvValidityBands": f"{len(refs)} series: " + "; ".join(parts),
        "ConvValidityCounts": (
            f"{len(compared)} point(s) compared with their series' reference: "
            + ", ".join(
                f"{int(counts.get(flag, 0))} {VALIDITY_WORDS[flag]}"
                for flag in (IN_BAND, TOO_FAST, TOO_SLOW, NOT_REACHED, NO_REFERENCE)
            )
        ),
        "ConvValidityFlagged": "none"
        if flagged.empty
        else "; ".join(
            f"{_point(r)}: {VALIDITY_WORDS[r.convergence_validity]}, "
            f"{_fmt(r.epochs_to_accuracy_median)} epochs (n = {int(r.n)}) against "
            f"{_band_text(r)}"
            for r in flagged.itertuples()
        ),
    }


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
        m["ConvLoaderRatioRange"] = _range(r.min(), r.max())
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
        "Reached: the repetitions that reached the target / the point's repetitions (n). "
        "Ideal: the smallest node count's time divided by the ratio of world sizes. "
        "Epochs: median (min--max). Loader / train: the input pipeline alone against training, "
        f"the smallest over ranks and repetitions; IB: below {INPUT_BOUND_MARGIN:g}, "
        "input-bound.\n\n".replace("%", "\\,\\%")
        + "{\\footnotesize\\setlength\\tabcolsep{1.5pt}\n"
        "\\begin{longtable}{llllrrlrlrlrr}\n\\toprule\n"
        "Framework & Model & Policy & Prec. & Nodes & Global & LR rule & Reached & "
        "Time to target [s] & Ideal [s] & Epochs & Best & Loader \\\\\n"
        "& & & & & batch & (eff.\\ LR) & /reps & median [CI]/(range) & & & val.\\ acc. "
        "& / train \\\\\n\\midrule\\endhead\n"
        + "\n".join(rows)
        + "\n\\bottomrule\n\\end{longtable}}\n"
        + (validity_table(tta, escape) if "convergence_validity" in tta else "")
    )


def _epochs_interval_cell(r) -> str:
    """median [CI] or (range) of a point's epochs to target; its value for one repetition."""
    if pd.isna(r.epochs_to_accuracy_median):
        return "--"
    med = f"{r.epochs_to_accuracy_median:g}"
    low, high = r.epochs_to_accuracy_ci_low, r.epochs_to_accuracy_ci_high
    high_text = INFINITY if np.isinf(high) else f"{high:g}"
    if r.interval == CI:
        return f"{med} [{low:g}, {high_text}]"
    if r.interval == RANGE:
        return f"{med} ({low:g}--{high_text})"
    return med


def _band_cell(r) -> str:
    if r.epochs_band == NONE:
        return "none"
    high = INFINITY if np.isinf(r.epochs_band_high) else _fmt(r.epochs_band_high)
    kind = {
        CI: f"{CI_LEVEL:.0%} CI".replace("%", "\\,\\%"),
        RANGE: "range",
        FIXED: f"fixed $\\pm${r.validity_tolerance * 100:g}\\,\\%",
    }[r.epochs_band]
    return f"{_fmt(r.epochs_band_low)}--{high} ({kind}, n={int(r.reference_n)})"


def validity_table(tta: pd.DataFrame, escape) -> str:
    """Convergence validity: per point its repetitions, its epochs to target with their
    interval, its series' reference point, the band and the flag
    (dlscale.analysis.time_to_accuracy)."""
    rows = []
    for r in tta.sort_values([*GROUP, "global_batch", "nodes"]).itertuples(index=False):
        flag = VALIDITY_WORDS[r.convergence_validity]
        if r.convergence_validity in (TOO_FAST, TOO_SLOW):
            flag = f"\\textbf{{{flag}}}"
        rows.append(
            " & ".join(
                [
                    escape(r.framework),
                    escape(r.model),
                    escape(r.policy),
                    escape(f"{r.precision} {r.mode}" if r.mode != "eager" else r.precision),
                    str(int(r.nodes)),
                    str(int(r.global_batch)),
                    str(int(r.n)),
                    _epochs_interval_cell(r),
                    f"n{int(r.reference_nodes)}/{int(r.reference_global_batch)}",
                    _band_cell(r),
                    _fmt(r.epochs_ratio),
                    flag,
                ]
            )
            + r" \\"
        )
    return (
        "\n\\noindent Convergence validity: epochs to target per point against its series' "
        "reference convergence point (Ref.: its node count / global batch, the smallest global "
        "batch of the series). Reps: the repetitions of the point. Epochs: median with its "
        "interval as above ([CI], (range), nothing for one repetition). Band: from the "
        "reference's repetitions (CI or range, n its repetitions) or, where the reference has "
        "one, the fixed tolerance (convergence.validity\\_tolerance). Ratio: median epochs over "
        "the reference's. Flagged too fast or too slow when the point's interval (its value "
        "for one repetition) lies wholly outside the band.\n\n"
        "{\\footnotesize\\setlength\\tabcolsep{1.5pt}\n"
        "\\begin{longtable}{llllrrrlllrl}\n\\toprule\n"
        "Framework & Model & Policy & Prec. & Nodes & Global & Reps & Epochs & Ref. & "
        "Band [epochs] & Ratio & Validity \\\\\n"
        "& & & & & batch & & median [CI]/(range) & & (kind, n of ref.) & & \\\\\n"
        "\\midrule\\endhead\n" + "\n".join(rows) + "\n\\bottomrule\n\\end{longtable}}\n"
    )


def _initialisation(framework: str) -> str:
    """How a framework's convergence cells start and order their data (its record's fact, from
    its adapter's convergence_method and dlscale.data's loaders): a comparison of epochs to
    accuracy across frameworks at equal global batch is a comparison of these as well."""
    record = FRAMEWORKS.get(framework)
    return record.initialisation_and_data_order if record else "not stated"

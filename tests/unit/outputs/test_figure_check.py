"""Every figure family checked by machine: drawn by the production plotting
functions from the demo's tables and from adversarial ones (one panel 10x the others, a single
point per series, NaN intervals, 1 and 12 panels), each saved figure is inspected from its drawn
artists (tests/helpers/figure_check.py): 0 points or error bars outside their axes, 0 axes without
tick labels, 0 overlapping labels, 0 caption elements not drawn."""

from __future__ import annotations

import matplotlib.figure
import numpy as np
import pandas as pd
import pytest

from dlscale.analysis import scaling_model as scalemodel
from dlscale.analysis.stats import GROUP, scaling_summary
from dlscale.outputs import figure_kit, plotting
from dlscale.outputs.figure_layout import FAMILIES, figure_layout, variant

from helpers.figure_check import CAPTION_ELEMENTS, figure_problems, predicted_panels
from helpers.synthetic_study import DEMO_STUDY as DEMO
from helpers.synthetic_study import cells_table

COLUMN_IN = 3.5  # the report's column width (rules/common.smk)

# every quantity a figure family draws (the adversarial tables scale these)
QUANTITIES = [
    "throughput_samples_per_s",
    "achieved_tflops_per_device",
    "mfu",
    "gpu_util_pct_mean",
    "gpu_util_pct_rank_min",
    "cpu_util_pct_mean",
    "cpu_util_pct_rank_min",
    "state_bytes_per_rank_max",
    "peak_rss_mb_max",
    "step_seconds_median",
    "compute_seconds_median",
]


def demo_cells() -> pd.DataFrame:
    """The demo's cells as a user's walk through the demo found them: the 1-node point of
    cnn_small strong far above its 2-node point in every per-device quantity (111 % CPU
    utilisation, 0.062 TFLOP/s against 0.043 and below), gpt2_tiny weak slower at 2 nodes
    (551 samples/s) than at 1 (624)."""
    cells = cells_table(DEMO)
    one = (cells["model"] == "cnn_small") & (cells["policy"] == "strong") & (cells["nodes"] == 1)
    cells.loc[one, "cpu_util_pct_mean"] = 111.0
    cells.loc[one, "cpu_util_pct_rank_min"] = 109.0
    cells.loc[one, "achieved_tflops_per_device"] = 0.062
    rest = (cells["model"] == "cnn_small") & ~one
    cells.loc[rest, "cpu_util_pct_mean"] = 66.0
    cells.loc[rest, "achieved_tflops_per_device"] = 0.043
    gpt = (cells["model"] == "gpt2_tiny") & (cells["policy"] == "weak")
    for nodes, value in ((1, [620.0, 628.0]), (2, [548.0, 554.0])):
        cells.loc[gpt & (cells["nodes"] == nodes), "throughput_samples_per_s"] = value
    return cells


def scaled_panel(axes: dict, factor: float = 10.0) -> pd.DataFrame:
    """One panel (the first model, strong) 10x the others in every quantity."""
    cells = cells_table(axes)
    one = (cells["model"] == axes["model"][0]) & (cells["policy"] == "strong")
    for q in QUANTITIES:
        cells.loc[one, q] = pd.to_numeric(cells.loc[one, q], errors="coerce") * factor
    return cells


TABLES = {
    "demo": lambda: demo_cells(),
    "ten_x_panel": lambda: scaled_panel(DEMO),
    "ten_x_panel_gpu": lambda: scaled_panel({**DEMO, "hardware": ["h100"]}),
    "single_point": lambda: cells_table({**DEMO, "nodes": [1], "rep": [1]}),
    "one_panel": lambda: cells_table({**DEMO, "model": ["cnn_small"], "policy": ["weak"]}),
    "twelve_panels": lambda: scaled_panel(
        {**DEMO, "model": [f"model{i}" for i in range(6)], "nodes": [1, 2, 4]}
    ),
    "nan_intervals": lambda: cells_table({**DEMO, "rep": [1]}),
}


def tables(name: str):
    cells = TABLES[name]()
    _, preds = scalemodel.model_tables(cells)
    if name == "nan_intervals":  # intervals unknown everywhere: nothing to shade, no error bar
        preds = preds.assign(**{c: np.nan for c in preds.columns if c.endswith(("_low", "_high"))})
    keys = [
        (*row[:4], variant(*row[4:]))
        for row in cells[GROUP].drop_duplicates().itertuples(index=False, name=None)
    ]
    return scaling_summary(cells), preds, keys


@pytest.fixture
def inspected(monkeypatch):
    """Every figure the production code saves, checked instead of saved (the check draws it
    with the canvas' renderer; writing the PDF would only cost time): {path: problems}, and the
    figures under "_figures". The caption is the one the layout gives the file, set by the
    caller as `inspected.caption`; `inspected.shaded`: whether predictions have intervals."""

    class Seen(dict):
        caption = ""
        shaded = True

    seen = Seen()

    def savefig(fig, out, *args, **kwargs):
        seen[str(out)] = figure_problems(fig, seen.caption, seen.shaded)
        seen.setdefault("_figures", []).append(fig)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", savefig)
    return seen


@pytest.mark.parametrize("name", list(TABLES))
def test_every_figure_family_passes_the_figure_check(inspected, tmp_path, name):
    scaling, preds, keys = tables(name)
    layout = figure_layout(keys, COLUMN_IN)
    assert {s["family"] for s in layout} == set(FAMILIES)
    if name == "twelve_panels":
        assert max(len(s["panels"]) for s in layout) == 12
    if name == "one_panel":
        assert {len(s["panels"]) for s in layout} == {1}
    problems = {}
    for spec in layout:
        out = tmp_path / spec["file"].replace("/", "_")
        inspected.caption = spec["caption"]
        inspected.shaded = name != "nan_intervals"
        plotting.plot_figure(scaling, spec, str(out), predictions=preds)
        if inspected[str(out)]:
            problems[spec["family"]] = inspected[str(out)]
    assert not problems, problems


def test_the_plan_figure_and_the_convergence_figures_pass_the_figure_check(inspected, tmp_path):
    """The planner's figure (one job, and three jobs on the hours of a log axis) and every
    convergence family: the same check."""
    from dlscale.decisions import planner as pl
    from dlscale.outputs import convergence_plots
    from dlscale.outputs.figure_layout import CONVERGENCE_FAMILIES, convergence_layout

    from unit.decisions.test_planner import FAST_CHEAP, HOUR, JOB, PARTS, predictions
    from unit.outputs.test_figure_honesty import convergence_tables

    inspected.caption = ""
    jobs = [{**JOB[0], "name": name} for name in ("a", "b", "c")]
    # hours within one decade and no power of ten among them (1.5 to 3.75 h): the demo's case
    close = predictions({("fast", "pt"): lambda n: 100 * n, ("cheap", "pt"): lambda n: 80 * n})
    short = [{**JOB[0], "samples": 300 * HOUR}]
    for name, preds, job in (("plan1", FAST_CHEAP, JOB), ("plan3", FAST_CHEAP, jobs)):
        pl.plot_plan(pl.make_plan(preds, job, PARTS), str(tmp_path / f"{name}.pdf"))
    pl.plot_plan(pl.make_plan(close, short, PARTS), str(tmp_path / "plan_close.pdf"))
    tta, epochs, conv = convergence_tables()
    drawn = set()
    for spec in convergence_layout([("cpu", "pytorch", "cnn_small", "weak", "fp32")], COLUMN_IN):
        inspected.caption = spec["caption"]
        out = tmp_path / spec["file"].replace("/", "_")
        convergence_plots.plot_convergence_figure(tta, epochs, conv, spec, str(out))
        drawn.add(spec["family"])
    assert drawn == set(CONVERGENCE_FAMILIES)
    problems = {out: p for out, p in inspected.items() if out != "_figures" and p}
    assert len([o for o in inspected if o != "_figures"]) == 3 + len(CONVERGENCE_FAMILIES)
    assert not problems, problems


def test_the_demo_flags_a_weak_scaling_prediction_above_every_measured_point(inspected, tmp_path):
    """gpt2_tiny weak measured 624 then 551 samples/s: a prediction above both contradicts the
    data it was fitted to. predictions.csv says so, the throughput figure crosses the point in
    red and its legend names it; the rising cnn_small weak series is not flagged."""
    scaling, preds, keys = tables("demo")
    flagged = preds[preds["contradicts_measurements"].astype(bool)]
    assert set(zip(flagged["model"], flagged["policy"])) == {("gpt2_tiny", "weak")}
    assert (flagged["throughput_samples_per_s_pred"] > 628.0).all()
    (spec,) = [s for s in figure_layout(keys, COLUMN_IN) if s["family"] == "throughput"]
    inspected.caption = spec["caption"]
    plotting.plot_figure(scaling, spec, str(tmp_path / "t.pdf"), predictions=preds)
    (fig,) = inspected["_figures"]
    crosses = {
        ax.get_title(): list(ln.get_xdata())
        for ax in fig.axes
        for ln in ax.get_lines()
        if ln.get_label() == figure_kit.CONTRADICTS_LABEL
    }
    assert crosses == {"gpt2_tiny, weak": list(flagged["nodes"])}
    assert figure_kit.CONTRADICTS_LABEL in [t.get_text() for t in fig.legends[0].get_texts()]
    assert predicted_panels(fig)
    # and the report's Recommendations say it in words (plan_macros.tex)
    from dlscale.decisions.plan_report import recommendation_macros

    fits, _ = scalemodel.model_tables(demo_cells())
    plan = {"max_extrapolation": 8, "objective": "min_time"}
    text = recommendation_macros(ValueError("no jobs"), fits, plan)["dlsModelContradicts"]
    assert text.startswith("1 series (cpu/pytorch/gpt2\\_tiny/weak/fp32") and "contradicts" in text
    rising = fits[fits["model"] == "cnn_small"]
    assert (
        "no series" in recommendation_macros(ValueError("x"), rising, plan)["dlsModelContradicts"]
    )


def test_every_caption_element_the_check_knows_is_named_by_some_caption():
    """The caption check is not vacuous: each phrase it looks for is in a caption a study has."""
    from dlscale.outputs.figure_layout import convergence_layout

    _, _, keys = tables("demo")
    captions = " ".join(
        s["caption"]
        for s in [*figure_layout(keys, COLUMN_IN), *convergence_layout(keys, COLUMN_IN)]
    )
    assert [p for p in CAPTION_ELEMENTS if p not in captions] == []

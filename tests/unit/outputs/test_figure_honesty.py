"""Figures that cannot mislead: every figure family, drawn by the
production plotting functions from a synthetic study, draws no bar on a logarithmic axis; a
predicted point is drawn apart from measured ones and no further than its series' validation
supports, and the captions say how far predictions reach."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib.figure
import numpy as np
import pandas as pd
import pytest
from matplotlib.container import BarContainer
from matplotlib.lines import Line2D
from matplotlib.patches import Rectangle

from dlscale.analysis import scaling_model as scalemodel
from dlscale.analysis.stats import GROUP, scaling_summary
from dlscale.outputs import convergence_plots, figure_kit, plotting
from dlscale.outputs import figure_layout as layout
from dlscale.outputs.figure_layout import (
    CONVERGENCE_FAMILIES,
    FAMILIES,
    convergence_layout,
    figure_layout,
    predicted_caption,
    variant,
)

from helpers.synthetic_study import DEMO, cells_table, groups

COLUMN_IN = 3.5
ROOT = Path(__file__).resolve().parents[3]

# every kind of series a figure distinguishes: two frameworks (mxnet: no compute-only step, so
# the breakdown draws its grey bars), two precisions, both policies, three node counts
MIXED = {
    "hardware": ["cpu"],
    "framework": ["pytorch", "mxnet"],
    "model": ["model0", "model1"],
    "policy": ["weak", "strong"],
    "precision": ["fp32", "bf16"],
    "mode": ["eager"],
    "nodes": [1, 2, 4],
    "rep": [1, 2],
}


def bars_on_log(fig) -> list[str]:
    """This test's own inspection (not figure_kit.bars_on_log_axes): axes with a log x or y scale
    that hold bar containers or rectangle patches."""
    bad = []
    for ax in fig.axes:
        if "log" in (ax.get_yscale(), ax.get_xscale()):
            bars = [c for c in ax.containers if isinstance(c, BarContainer)]
            rects = [p for p in ax.patches if isinstance(p, Rectangle)]
            if bars or rects:
                bad.append(f"{ax.get_title()!r}: {len(bars)} bar containers, {len(rects)} bars")
    return bad


@pytest.fixture
def saved(monkeypatch):
    """Every figure the production code saves, inspected as it is saved: {path: [axes info]}."""
    seen: dict[str, list[dict]] = {}
    original = matplotlib.figure.Figure.savefig

    def savefig(fig, out, *args, **kwargs):
        seen[str(out)] = [
            {
                "title": ax.get_title(),
                "xscale": ax.get_xscale(),
                "yscale": ax.get_yscale(),
                "bars": sum(isinstance(c, BarContainer) for c in ax.containers)
                + sum(isinstance(p, Rectangle) for p in ax.patches),
                "lines": [ln for ln in ax.get_lines() if isinstance(ln, Line2D)],
                "legend": ax.get_legend_handles_labels()[1],
                "bad": bars_on_log(fig),
            }
            for ax in fig.axes
            if ax.get_visible()
        ]
        return original(fig, out, *args, **kwargs)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", savefig)
    return seen


def scaling_study(axes: dict) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame, list]:
    """(cells, scaling, predictions, figure keys) of a synthetic study."""
    cells = cells_table(axes)
    _, preds = scalemodel.model_tables(cells)
    keys = [
        (*row[:4], variant(*row[4:]))
        for row in cells[GROUP].drop_duplicates().itertuples(index=False, name=None)
    ]
    return cells, scaling_summary(cells), preds, keys


def convergence_tables() -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """(time_to_accuracy, epochs, convergence cells) of a small convergence study: one
    framework, 1 and 2 nodes, one point not reached."""
    key = {
        "hardware": "cpu",
        "framework": "pytorch",
        "model": "cnn_small",
        "policy": "weak",
        "precision": "fp32",
        "mode": "eager",
    }
    tta = pd.DataFrame(
        [
            {
                **key,
                "nodes": 1,
                "global_batch": 64,
                "time_to_accuracy_s_median": 6.0,
                "time_to_accuracy_s_ci_low": 5.5,
                "time_to_accuracy_s_ci_high": 6.5,
                "epochs_to_accuracy_median": 4.0,
                "epochs_to_accuracy_min": 4.0,
                "epochs_to_accuracy_max": 5.0,
                "max_epochs": 10,
                "training_seconds_at_cap_max": np.nan,
                "ideal_time_to_accuracy_s": 6.0,
            },
            {
                **key,
                "nodes": 2,
                "global_batch": 128,
                "time_to_accuracy_s_median": np.nan,
                "time_to_accuracy_s_ci_low": np.nan,
                "time_to_accuracy_s_ci_high": np.inf,
                "epochs_to_accuracy_median": np.nan,
                "epochs_to_accuracy_min": 10.0,
                "epochs_to_accuracy_max": 10.0,
                "max_epochs": 10,
                "training_seconds_at_cap_max": 9.0,
                "ideal_time_to_accuracy_s": 3.0,
            },
        ]
    )
    epochs = pd.DataFrame(
        [
            {**key, "nodes": n, "rep": 1, "epoch": e, "val_accuracy": 0.5 + 0.05 * e}
            for n in (1, 2)
            for e in range(1, 6)
        ]
    )
    conv = pd.DataFrame([{**key, "nodes": n, "rep": 1, "target_accuracy": 0.7} for n in (1, 2)])
    return tta, epochs, conv


def test_no_figure_family_draws_a_bar_on_a_log_axis(saved, tmp_path):
    """Every figure family of the layout, the convergence families and the planner's figure,
    drawn by the production functions: no axis with a log scale holds a bar."""
    drawn_families = set()
    for name, axes in (("demo", DEMO), ("mixed", MIXED)):
        _, scaling, preds, keys = scaling_study(axes)
        for spec in figure_layout(keys, COLUMN_IN):
            out = tmp_path / f"{name}_{spec['file'].replace('/', '_')}"
            plotting.plot_figure(scaling, spec, str(out), predictions=preds)
            drawn_families.add(spec["family"])
    tta, epochs, conv = convergence_tables()
    for spec in convergence_layout([("cpu", "pytorch", "cnn_small", "weak", "fp32")], COLUMN_IN):
        out = tmp_path / spec["file"].replace("/", "_")
        convergence_plots.plot_convergence_figure(tta, epochs, conv, spec, str(out))
        drawn_families.add(spec["family"])
    from dlscale.decisions import planner as pl

    from unit.decisions.test_planner import FAST_CHEAP, JOB, PARTS

    pl.plot_plan(pl.make_plan(FAST_CHEAP, JOB, PARTS), str(tmp_path / "plan.pdf"))
    pl.plot_plan(pl.PlanError("infeasible"), str(tmp_path / "plan_failed.pdf"))
    assert drawn_families == {*FAMILIES, *CONVERGENCE_FAMILIES}
    assert len(saved) >= len(FAMILIES) * 2 + len(CONVERGENCE_FAMILIES) + 2
    problems = {out: ax["bad"] for out, axs in saved.items() for ax in axs if ax["bad"]}
    assert not problems, problems
    # the inspection sees bars where there are some (the breakdown's, on a linear axis) and log
    # axes where there are some (throughput, frameworks): it is not vacuous
    assert any(ax["bars"] for out, axs in saved.items() if "breakdown" in out for ax in axs)
    logs = {out for out, axs in saved.items() for ax in axs if ax["yscale"] == "log"}
    assert any("frameworks" in o for o in logs) and any("throughput" in o for o in logs)


def test_the_frameworks_figure_draws_points_on_its_log_axis(saved, tmp_path):
    _, scaling, _, keys = scaling_study(MIXED)
    (spec,) = [s for s in figure_layout(keys, COLUMN_IN) if s["family"] == "frameworks"]
    plotting.plot_figure(scaling, spec, str(tmp_path / "f.pdf"))
    (axes,) = saved.values()
    for ax in axes:
        assert ax["yscale"] == "log" and ax["bars"] == 0
        marked = [ln for ln in ax["lines"] if ln.get_marker() in figure_kit.MARKERS]  # not caps
        assert len(marked) == 4  # 2 frameworks x 2 precisions, one point per model each
        assert all(ln.get_linestyle() == "None" for ln in marked)
    assert "points on a logarithmic axis" in spec["caption"]


def test_a_bar_on_a_log_axis_is_refused_before_the_file_is_written(tmp_path):
    import matplotlib.pyplot as plt

    fig, axes = figure_kit.grid(1, 1, COLUMN_IN)
    axes[0, 0].bar([0, 1], [10.0, 1000.0])
    axes[0, 0].set_yscale("log")
    axes[0, 0].set_title("bars")
    assert bars_on_log(fig) and figure_kit.bars_on_log_axes(fig) == ["bars"]
    with pytest.raises(ValueError, match="bars on a logarithmic axis in panel"):
        figure_kit.finish(fig, axes, str(tmp_path / "bad.pdf"))
    assert not (tmp_path / "bad.pdf").exists()
    # the same bars on a linear axis are fine
    fig, axes = figure_kit.grid(1, 1, COLUMN_IN)
    axes[0, 0].bar([0, 1], [10.0, 1000.0])
    assert figure_kit.bars_on_log_axes(fig) == []
    plt.close(fig)


def _predicted_lines(axes: list[dict]) -> list[Line2D]:
    return [
        ln
        for ax in axes
        for ln in ax["lines"]
        if ln.get_markerfacecolor() == "white" and ln.get_linestyle() == "None"
    ]


@pytest.mark.parametrize("family", ["throughput", "speedup", "efficiency"])
def test_the_demo_predicts_twice_its_largest_node_count_labelled_not_validated(
    saved, tmp_path, family
):
    """The demo's shape (1 and 2 nodes: not validated): predicted points stop at 4 nodes, are
    open markers apart from the filled measured ones, and the legend says "not validated"."""
    _, scaling, preds, keys = scaling_study(DEMO)
    assert preds["nodes"].max() == 4 and not preds["validated"].any()
    (spec,) = [s for s in figure_layout(keys, COLUMN_IN) if s["family"] == family]
    plotting.plot_figure(scaling, spec, str(tmp_path / "f.pdf"), predictions=preds)
    (axes,) = saved.values()
    xs = [x for ax in axes for ln in ax["lines"] for x in ln.get_xdata()]
    assert max(xs) == 4
    open_points = _predicted_lines(axes)
    assert open_points and {x for ln in open_points for x in ln.get_xdata()} == {4}
    labels = {lab for ax in axes for lab in ax["legend"]}
    assert figure_kit.UNVALIDATED_LABEL in labels and figure_kit.PREDICTED_LABEL not in labels
    assert "2x that of an unvalidated one" in spec["caption"]


def test_a_validated_series_is_predicted_further_with_a_wider_band(saved, tmp_path):
    axes3 = {**DEMO, "model": ["cnn_small"], "policy": ["weak"], "nodes": [1, 2, 4]}
    cells, scaling, preds, keys = scaling_study(axes3)
    assert preds["validated"].all() and preds["nodes"].max() == 32
    (spec,) = [s for s in figure_layout(keys, COLUMN_IN) if s["family"] == "throughput"]
    plotting.plot_figure(scaling, spec, str(tmp_path / "f.pdf"), predictions=preds)
    (axes,) = saved.values()
    labels = {lab for ax in axes for lab in ax["legend"]}
    assert figure_kit.PREDICTED_LABEL in labels and figure_kit.UNVALIDATED_LABEL not in labels
    assert {x for ln in _predicted_lines(axes) for x in ln.get_xdata()} == {8, 16, 32}


def test_the_caption_says_when_the_configuration_lets_unvalidated_predictions_go_further():
    default = figure_layout(groups(DEMO), COLUMN_IN, plan={"max_extrapolation": 8})
    captions = {s["family"]: s["caption"] for s in default}
    for family in ("throughput", "speedup", "efficiency"):
        assert "8x the largest measured node count of a validated series" in captions[family]
        assert "2x that of an unvalidated one." in captions[family]
        assert "configuration's" not in captions[family]
    assert "predicted" not in captions["frameworks"] + captions["breakdown"]
    wider = figure_layout(
        groups(DEMO),
        COLUMN_IN,
        plan={"max_extrapolation": 8, "max_extrapolation_unvalidated": 8},
    )
    text = {s["family"]: s["caption"] for s in wider}["speedup"]
    assert "8x that of an unvalidated one" in text
    assert "plan.max_extrapolation_unvalidated = 8, beyond the default 2x" in text
    # the unvalidated factor never exceeds max_extrapolation
    assert "4x that of an unvalidated one" in predicted_caption(
        {"max_extrapolation": 4, "max_extrapolation_unvalidated": 16}
    )


def test_the_defaults_agree_across_schema_layout_and_model():
    schema = json.loads((ROOT / "config/schemas/config.schema.json").read_text())
    plan = schema["properties"]["plan"]["properties"]
    assert (
        plan["max_extrapolation"]["default"]
        == layout.DEFAULT_MAX_EXTRAPOLATION
        == scalemodel.DEFAULT_MAX_EXTRAPOLATION
    )
    assert (
        plan["max_extrapolation_unvalidated"]["default"]
        == layout.DEFAULT_MAX_EXTRAPOLATION_UNVALIDATED
        == scalemodel.DEFAULT_MAX_EXTRAPOLATION_UNVALIDATED
    )


def test_the_plan_key_is_in_no_hash():
    """The study's config hash leaves `plan` out (cells hash their own fields): raising the
    extrapolation changes no cell's identity."""
    from dlscale.study.hashes import config_hash

    base = {"axes": {"hardware": []}, "plan": {"max_extrapolation_unvalidated": 2}}
    more = {"axes": {"hardware": []}, "plan": {"max_extrapolation_unvalidated": 16}}
    assert config_hash(base, {}) == config_hash(more, {})

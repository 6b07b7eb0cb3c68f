"""The figure check fails where a reader would: figures drawn wrong on purpose, each with one
break (a measured point or an error bar's end clipped by its panel's limits, a shading, error
bars or a reference line the caption promises and no panel draws, two labels drawn over each
other, an axis without tick labels), and `figure_problems` names that break in its own words.
Each test first checks the same figure unbroken and finds no problem, so what is reported is
the break. Production figures (dlscale.outputs.plotting, drawn from the synthetic demo study)
are broken after they are drawn, as a slip in the plotting code would break them; a one-panel
figure drawn by hand shows each break alone. Everything draws on Agg canvases, without pyplot
for the hand-made figures."""

from __future__ import annotations

import matplotlib.figure
import numpy as np
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.collections import LineCollection, PolyCollection
from matplotlib.container import ErrorbarContainer
from matplotlib.ticker import NullFormatter

from dlscale.analysis import scaling_model as scalemodel
from dlscale.analysis.stats import GROUP, scaling_summary
from dlscale.outputs import plotting
from dlscale.outputs.figure_layout import figure_layout, variant

from helpers.figure_check import figure_problems, predicted_panels
from helpers.synthetic_study import DEMO_STUDY, cells_table

COLUMN_IN = 3.5  # the report's column width (rules/common.smk)
SHADED = "shaded by its interval"


# ---- figures to break -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def study():
    """The demo study's scaling table, the scaling model's predictions and the figure layout,
    by family."""
    cells = cells_table(DEMO_STUDY)
    _, preds = scalemodel.model_tables(cells)
    keys = [
        (*row[:4], variant(*row[4:]))
        for row in cells[GROUP].drop_duplicates().itertuples(index=False, name=None)
    ]
    layout = {spec["family"]: spec for spec in figure_layout(keys, COLUMN_IN)}
    return scaling_summary(cells), preds, layout


@pytest.fixture
def drawn(study, monkeypatch):
    """draw(family) -> (figure, caption): the figure the production code draws for that family,
    kept instead of saved, on an Agg canvas again (closing it left it without a renderer), and
    the caption the layout gives it."""
    scaling, preds, layout = study
    kept = []
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", lambda fig, *a, **k: kept.append(fig))

    def draw(family: str):
        spec = layout[family]
        plotting.plot_figure(scaling, spec, f"{family}.pdf", predictions=preds)
        (fig,) = kept
        kept.clear()
        FigureCanvasAgg(fig)
        return fig, spec["caption"]

    return draw


def panel(title: str = "panel"):
    """A one-panel figure drawn by hand on an Agg canvas."""
    fig = matplotlib.figure.Figure(figsize=(3.0, 2.4))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.set_title(title)
    return fig, ax


def limits(ax) -> str:
    """The panel's y limits as the check writes them."""
    lo, hi = ax.get_ylim()
    return f"[{lo:.4g}, {hi:.4g}]"


def error_bars(ax) -> tuple[np.ndarray, np.ndarray]:
    """The measured points' y values and their error bars' ends, of the panel's first series."""
    (container, *_) = [c for c in ax.containers if isinstance(c, ErrorbarContainer)]
    points = np.asarray(container.lines[0].get_ydata(), dtype=float)
    ends = np.concatenate([np.asarray(s)[:, 1] for s in container.lines[2][0].get_segments()])
    return points, ends


def bands(ax) -> list:
    """The panel's shaded bands (fill_between)."""
    return [
        c
        for c in ax.collections
        if isinstance(c, PolyCollection) and not isinstance(c, LineCollection)
    ]


# ---- a point outside its panel --------------------------------------------------------------


@pytest.mark.parametrize("drawing", ["line", "scatter"])
def test_a_measured_point_above_its_panel_is_reported(drawing):
    """Three measured points, the highest at 3; the panel's y axis cut at 2.5 hides it, and the
    check names the point, its value and the limits."""
    fig, ax = panel()
    draw = ax.plot if drawing == "line" else ax.scatter
    draw([1, 2, 4], [1.0, 2.0, 3.0], label="measured")
    assert figure_problems(fig) == []
    ax.set_ylim(0, 2.5)
    what = "line" if drawing == "line" else "markers"
    assert figure_problems(fig) == [f"panel: {what} 'measured': y [3.0] outside [0, 2.5]"]


@pytest.mark.parametrize("axis", ["y", "x"])
def test_an_error_bar_end_outside_its_panel_is_reported(axis):
    """A point at 2 with an interval reaching 3: limits that keep the point but cut the bar at
    2.5 hide the interval's end, and the check names the error bar, not the point."""
    fig, ax = panel()
    if axis == "y":
        ax.errorbar([1, 2], [1.0, 2.0], yerr=[0.1, 1.0], marker="o")
    else:
        ax.errorbar([1.0, 2.0], [1, 2], xerr=[0.1, 1.0], marker="o")
    assert figure_problems(fig) == []
    (ax.set_ylim if axis == "y" else ax.set_xlim)(0, 2.5)
    assert figure_problems(fig) == [f"panel: error bar: {axis} [3.0] outside [0, 2.5]"]


def test_a_production_panel_whose_limits_cut_off_its_largest_measured_point(drawn):
    """The throughput figure with its first panel's top lowered between its two largest
    measured medians: the check names the measured line and the median it loses (the
    predicted extension that starts there is reported too)."""
    fig, caption = drawn("throughput")
    assert figure_problems(fig, caption) == []
    ax = fig.axes[0]
    points, _ = error_bars(ax)
    second, top = np.sort(points)[-2:].tolist()
    ax.set_ylim(ax.get_ylim()[0], (second + top) / 2)
    problems = figure_problems(fig, caption)
    assert f"{ax.get_title()}: line '_nolegend_': y {[top]} outside {limits(ax)}" in problems
    assert all(p.startswith(f"{ax.get_title()}: ") for p in problems)


def test_a_production_panel_whose_limits_cut_off_an_error_bar_end(drawn):
    """The frameworks figure (points with error bars on a log axis) with its first panel's top
    lowered below the highest error bar's end but above every median: the check names the
    error bar's end, and no point."""
    fig, caption = drawn("frameworks")
    assert figure_problems(fig, caption) == []
    ax = fig.axes[0]
    points, ends = error_bars(ax)
    top = float(ends.max())
    below = max(points.max(), np.sort(ends)[-2])
    assert below < top
    ax.set_ylim(ax.get_ylim()[0], (below + top) / 2)
    problems = figure_problems(fig, caption)
    assert f"{ax.get_title()}: error bar: y {[top]} outside {limits(ax)}" in problems
    assert not [p for p in problems if any(str(v) in p for v in points)]


# ---- an element the caption promises, not drawn ------------------------------------------------


def test_a_predicted_point_without_the_shading_its_caption_promises_is_reported():
    """A panel with a prediction (an open marker on a dashed line) and its interval shaded;
    without the band, a caption saying the prediction is "shaded by its interval" is
    wrong, and the check names the panel."""
    fig, ax = panel()
    ax.errorbar([1, 2], [1.0, 2.0], yerr=0.05, marker="o")
    ax.plot([2, 4], [2.0, 3.5], linestyle="--", label="predicted")
    ax.plot([4], [3.5], linestyle="none", marker="o", markerfacecolor="white")
    (band,) = [ax.fill_between([2, 4], [1.9, 3.0], [2.1, 3.9], alpha=0.15)]
    caption = f"Predicted points {SHADED}."
    assert predicted_panels(fig) == [ax]
    assert figure_problems(fig, caption) == []
    band.remove()
    assert figure_problems(fig, caption) == [f"'panel': not {SHADED}"]


@pytest.mark.parametrize("how", ["removed", "hidden", "transparent"])
def test_a_production_prediction_whose_band_is_not_drawn_is_reported(drawn, how):
    """The speedup figure (every panel predicts) with its first panel's band removed, hidden or
    made fully transparent: the caption still says the prediction is shaded, and the check
    names that panel, and only that one."""
    fig, caption = drawn("speedup")
    assert SHADED in caption
    assert figure_problems(fig, caption) == []
    ax = fig.axes[0]
    (band,) = bands(ax)
    if how == "removed":
        band.remove()
    elif how == "hidden":
        band.set_visible(False)
    else:
        band.set_alpha(0)
    assert figure_problems(fig, caption) == [f"{ax.get_title()!r}: not {SHADED}"]


def _error_bars(ax):
    return ax.errorbar([1, 2, 4], [1.0, 2.0, 3.0], yerr=0.2, marker="o")


def _ideal(ax):
    return ax.plot([1, 2, 4], [1, 2, 4], linestyle="--", label="ideal")


def _target(ax):
    return ax.axhline(2.5, linestyle="--", label="target")


def _dotted(ax):
    return ax.plot([1, 2, 4], [0.8, 1.6, 2.4], linestyle=":")


def _hatched(ax):
    return ax.bar([1, 2, 4], [1.0, 2.0, 3.0], hatch="//", fill=False)


ELEMENTS = {
    "error bars": _error_bars,
    "dashed: ideal": _ideal,
    "dashed: the target": _target,
    "dotted": _dotted,
    "hatched": _hatched,
}


@pytest.mark.parametrize("phrase", list(ELEMENTS))
def test_a_caption_element_no_panel_draws_is_reported(phrase):
    """Each element a caption may name (error bars, the dashed ideal or target, a dotted line,
    hatching), drawn with a measured line: removed, the caption names what no panel shows, and
    the check quotes the caption's phrase."""
    fig, ax = panel()
    ax.plot([1, 2, 4], [1.0, 2.0, 3.0], marker="o", label="measured")
    element = ELEMENTS[phrase](ax)
    caption = f"Measured throughput; {phrase}."
    assert figure_problems(fig, caption) == []
    for artist in element if isinstance(element, list) else [element]:
        artist.remove()
    assert figure_problems(fig, caption) == [f"caption says {phrase!r}, no panel draws it"]


@pytest.mark.parametrize("drawing", ["errorbar without an interval", "plain line"])
def test_error_bars_the_caption_promises_and_no_point_carries_are_reported(drawing):
    """Points drawn by an errorbar call without an interval (as a family without intervals
    draws them) or by a plain line carry no error bar, whatever the caption says."""
    fig, ax = panel()
    _error_bars(ax)
    caption = "Median over repetitions, error bars its interval."
    assert figure_problems(fig, caption) == []
    fig, ax = panel()
    if drawing == "plain line":
        ax.plot([1, 2, 4], [1.0, 2.0, 3.0], marker="o")
    else:
        ax.errorbar([1, 2, 4], [1.0, 2.0, 3.0], marker="o")
    assert figure_problems(fig, caption) == ["caption says 'error bars', no panel draws it"]


@pytest.mark.parametrize("how", ["removed", "hidden"])
def test_production_error_bars_not_drawn_are_reported(drawn, how):
    """The frameworks figure, whose caption says "error bars its interval", with every error
    bar removed or hidden: the points remain, the intervals do not, and the check says so."""
    fig, caption = drawn("frameworks")
    assert "error bars" in caption
    assert figure_problems(fig, caption) == []
    for ax in fig.axes:
        for bars in [c for c in ax.collections if isinstance(c, LineCollection)]:
            if how == "removed":
                bars.remove()
            else:
                bars.set_visible(False)
    assert figure_problems(fig, caption) == ["caption says 'error bars', no panel draws it"]


@pytest.mark.parametrize("how", ["removed", "hidden", "solid"])
def test_a_production_ideal_line_not_drawn_dashed_is_reported(drawn, how):
    """The speedup figure, whose caption says "dashed: ideal", with every panel's ideal line
    removed, hidden or drawn solid: the check says no panel draws it."""
    fig, caption = drawn("speedup")
    assert "dashed: ideal" in caption
    assert figure_problems(fig, caption) == []
    for ax in fig.axes:
        for line in [ln for ln in ax.get_lines() if ln.get_label() == "ideal"]:
            if how == "removed":
                line.remove()
            elif how == "hidden":
                line.set_visible(False)
            else:
                line.set_linestyle("-")
    assert figure_problems(fig, caption) == ["caption says 'dashed: ideal', no panel draws it"]


# ---- labels over each other ---------------------------------------------------------------------


def test_two_labels_drawn_at_the_same_spot_are_reported():
    """Two panel texts at one data point: the check names both."""
    fig, ax = panel()
    ax.plot([1, 2], [1.0, 2.0])
    ax.text(1.5, 1.5, "measured")
    assert figure_problems(fig) == []
    ax.text(1.5, 1.5, "predicted")
    assert figure_problems(fig) == ["'measured' overlaps 'predicted'"]


def test_a_title_forced_over_the_tick_labels_is_reported():
    """A panel title placed below the panel, on its x tick labels: the check names the title
    and the tick labels it covers."""
    fig, ax = panel()
    ax.plot([1, 2], [1.0, 2.0])
    assert figure_problems(fig) == []
    ax.set_title("a long panel title", y=-0.12)
    problems = figure_problems(fig)
    ticks = [t.get_text() for t in ax.get_xticklabels()]
    assert problems
    assert set(problems) <= {f"'a long panel title' overlaps {t!r}" for t in ticks}


def test_a_note_over_a_production_panel_title_is_reported(drawn):
    """The speedup figure with a note written just above its first panel's frame, where the
    title is: the check names the title and the note."""
    fig, caption = drawn("speedup")
    assert figure_problems(fig, caption) == []
    ax = fig.axes[0]
    ax.text(0.5, 1.0, "note over title", transform=ax.transAxes, ha="center", va="bottom")
    assert figure_problems(fig, caption) == [f"{ax.get_title()!r} overlaps 'note over title'"]


def test_a_production_legend_moved_onto_the_panel_titles_is_reported(drawn):
    """The throughput figure's legend, anchored inside the figure instead of above the
    panels, lies on the top row's titles (and tick labels): the check names each legend entry
    with the label under it, a panel title among them."""
    fig, caption = drawn("throughput")
    assert figure_problems(fig, caption) == []
    (legend,) = fig.legends
    legend.set_bbox_to_anchor((0.5, 0.9), transform=fig.transFigure)
    problems = figure_problems(fig, caption)
    titles = [ax.get_title() for ax in fig.axes]
    entries = [t.get_text() for t in legend.get_texts()]
    assert all(any(p.endswith(f" overlaps {e!r}") for e in entries) for p in problems)
    assert any(p.startswith(f"{t!r} overlaps ") for p in problems for t in titles)


# ---- an axis without tick labels --------------------------------------------------------------


BLANKINGS = {
    "ticks removed": ("x", lambda ax: ax.set_xticks([])),
    "labels switched off": ("y", lambda ax: ax.tick_params(labelleft=False)),
    "labels blanked": ("y", lambda ax: ax.yaxis.set_major_formatter(NullFormatter())),
    "axis hidden": ("y", lambda ax: ax.yaxis.set_visible(False)),
    "axes off": ("xy", lambda ax: ax.set_axis_off()),
}


@pytest.mark.parametrize("how", list(BLANKINGS))
def test_an_axis_without_tick_labels_is_reported(how):
    """A measured line whose panel's axis shows no tick label (ticks removed, labels switched
    off or blanked, the axis hidden, or the panel's axes switched off): its values cannot be
    read, and the check names the axis."""
    fig, ax = panel()
    ax.plot([1, 2, 4], [1.0, 2.0, 3.0], marker="o")
    assert figure_problems(fig) == []
    axes, blank = BLANKINGS[how]
    blank(ax)
    assert figure_problems(fig) == [f"panel: no {which} tick label" for which in axes]


@pytest.mark.parametrize("how", ["ticks removed", "labels switched off", "axis hidden"])
def test_a_production_panel_without_y_tick_labels_is_reported(drawn, how):
    """The throughput figure (a log y axis, minor ticks too) with its first panel's y tick
    labels gone: the check names that panel's y axis, and nothing else."""
    fig, caption = drawn("throughput")
    assert figure_problems(fig, caption) == []
    ax = fig.axes[0]
    if how == "ticks removed":
        ax.set_yticks([])
        ax.set_yticks([], minor=True)
    elif how == "labels switched off":
        ax.tick_params(axis="y", which="both", labelleft=False)
    else:
        ax.yaxis.set_visible(False)
    assert figure_problems(fig, caption) == [f"{ax.get_title()}: no y tick label"]


def test_a_panel_that_only_says_in_words_that_there_is_no_plan_needs_no_tick_labels():
    """Control: a panel with its axes off that draws no data, only a sentence (the planner's
    figure when there is no plan), has no axis to read; the check finds nothing."""
    fig, ax = panel("")
    ax.axis("off")
    ax.text(0.5, 0.5, "no plan: no job fits", ha="center", va="center")
    assert figure_problems(fig) == []

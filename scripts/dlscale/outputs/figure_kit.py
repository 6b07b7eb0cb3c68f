"""The drawing kit every figure of dlscale.outputs shares (scaling families: plotting; the
convergence families: convergence_plots; the planner's: plan_figure; the history's trend:
history_figure): the paper style and the lock that draws one figure at a time, the panel grid,
colour and marker per series (Hue), error bars from intervals, the node and logarithmic axes,
the legend's labels, and saving, which refuses a bar on a logarithmic axis (`bars_on_log_axes`).

Sizes come from the paper's column width: grids of up to 2 panel columns are one column wide,
wider grids (up to figure_layout.MAX_COLS panel columns) span the text width, taken as 2 column
widths. The style is data (styles/paper.mplstyle).
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from importlib import resources
from typing import NamedTuple

import matplotlib
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.container import BarContainer
from matplotlib.lines import Line2D
from matplotlib.patches import Rectangle

# The legend's labels of what is no series (reference lines, predictions, open points): a
# panel's series are counted without them (finish).
PREDICTED_LABEL, UNVALIDATED_LABEL = "predicted", "predicted, not validated"
# a prediction above every measured point of a weak-scaling series whose throughput fell
# (dlscale.analysis.scaling_model.contradicts_measurements): a red cross over its open marker
CONTRADICTS_LABEL = "predicted above all measured: contradicts the data"
# a series' cells over world size that its line does not run through (plotting's _series): the
# same world size on more nodes than the line's cell, open markers of the series' colour, not
# connected
APART_LABEL = "same world size on more nodes (open)"
REFERENCE_LABELS = {
    "ideal",
    PREDICTED_LABEL,
    UNVALIDATED_LABEL,
    CONTRADICTS_LABEL,
    APART_LABEL,
    "target",
    "not reached",
}
MARKERS = ["o", "s", "^", "D", "v", "P", "X", "*"]
LINESTYLES = ["-", "--", ":", "-."]


def _style():
    return str(resources.files("dlscale").joinpath("styles/paper.mplstyle"))


# pyplot's backend, current figure and the style's rcParams are global to a process, and the
# workflow draws its figures in Snakemake's own process, on its job threads (`run:` jobs,
# profiles `force-use-threads`): one figure is drawn at a time, and the backend is chosen under
# the same lock (`matplotlib.use` at import time would race another thread's pyplot import:
# "partially initialized module 'matplotlib.pyplot'").
_PYPLOT = threading.RLock()


@contextmanager
def paper_style():
    """Draw to files (Agg) under the paper style, one figure at a time in this process."""
    with _PYPLOT:
        matplotlib.use("Agg")  # files only, never a display
        with plt.style.context(_style()):
            yield


def grid(n_panels: int, ncols: int, width: float, aspect: float = 0.8):
    """A grid of panels `width` wide; a panel is `aspect` times as high as wide (at most
    2.75 in wide for the height, so one-column grids of wide figures stay short). Every panel
    has its own y range: a shared one hides the points of a panel whose values lie far from
    the others', or squeezes them flat."""
    ncols = max(1, min(ncols, n_panels))
    nrows = max(1, -(-n_panels // ncols))
    panel_w = width / ncols
    panel_h = aspect * min(panel_w, 2.75)
    fig, axes = plt.subplots(nrows, ncols, figsize=(width, panel_h * nrows + 0.45), squeeze=False)
    for ax in axes.flat[max(n_panels, 1) :]:
        ax.set_visible(False)
    return fig, axes


def ci_err(values: pd.Series, low: pd.Series, high: pd.Series) -> np.ndarray:
    """Error-bar extents from an interval; zero where there is none (n = 1)."""
    lower = (values - low).fillna(0).clip(lower=0)
    upper = (high - values).fillna(0).clip(lower=0)
    return np.vstack([lower.to_numpy(), upper.to_numpy()])


class Look(NamedTuple):
    """How one series is drawn (Hue.look): its colour, marker, line style and legend label."""

    colour: tuple
    marker: str
    linestyle: str
    label: str


class Hue:
    """Colour = framework, marker and line style = variant (precision, and the mode where it is
    not eager: layout.variant), over the whole study."""

    def __init__(self, spec: dict):
        self.colour = dict(
            zip(
                spec["frameworks"], sns.color_palette("colorblind", max(1, len(spec["frameworks"])))
            )
        )
        self.precision = {p: i for i, p in enumerate(spec["precisions"])}
        self.show_precision = len(spec["precisions"]) > 1

    def label(self, framework: str, precision: str) -> str:
        return f"{framework} {precision}" if self.show_precision else framework

    def marker(self, precision: str) -> str:
        return MARKERS[self.precision.get(precision, 0) % len(MARKERS)]

    def linestyle(self, precision: str) -> str:
        return LINESTYLES[self.precision.get(precision, 0) % len(LINESTYLES)]

    def look(self, framework: str, precision: str) -> Look:
        return Look(
            self.colour[framework],
            self.marker(precision),
            self.linestyle(precision),
            self.label(framework, precision),
        )


def no_data(ax) -> None:
    ax.text(
        0.5, 0.5, "no measured cells", transform=ax.transAxes, ha="center", va="center", color="0.5"
    )


def nodes_axis(ax, nodes: list) -> None:
    """Node counts (or world sizes) on a log-2 x axis, a tick at each one (no minor ticks on x;
    the y axis keeps its own)."""
    ax.set_xscale("log", base=2)
    ax.set_xticks(nodes)
    ax.get_xaxis().set_major_formatter(matplotlib.ticker.ScalarFormatter())
    ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())


# tick values on a logarithmic y axis: 1-2-5 per decade where the data span at most this many
# decades, powers of ten beyond (more labels would crowd a short panel)
LOG_125_DECADES = 2.0


def _nice_125(value: float, up: bool) -> float:
    """The nearest 1-2-5 number (1, 2, 5 x 10^k) at or below (`up` False) or above `value`."""
    k = np.floor(np.log10(value))
    steps = [m * 10.0**e for e in (k - 1, k, k + 1) for m in (1.0, 2.0, 5.0)]
    return max(v for v in steps if v <= value) if not up else min(v for v in steps if v >= value)


def _tick_text(value: float, _pos=None) -> str:
    """A tick label for reading: 200, 1,000, 0.05 (never 2e+02)."""
    if value >= 1000:
        return f"{value:,.0f}"
    return np.format_float_positional(value, precision=3, fractional=False, trim="-")


def log_y(ax) -> None:
    """A logarithmic y axis with labelled ticks inside its limits, however short the span:
    the limits widened to the nearest 1-2-5 numbers around the data (so at least two labels),
    labels at 1-2-5 per decade (powers of ten over more than LOG_125_DECADES decades), plain
    numbers, unlabelled minor ticks."""
    ax.set_yscale("log")
    lo, hi = ax.get_ylim()
    if not (np.isfinite(lo) and np.isfinite(hi)) or lo <= 0 or hi <= lo:
        return
    lo, hi = _nice_125(lo, up=False), _nice_125(hi, up=True)
    ax.set_ylim(lo, hi)
    wide = np.log10(hi / lo) > LOG_125_DECADES
    ticker = matplotlib.ticker
    ax.yaxis.set_major_locator(ticker.LogLocator(subs=(1.0,) if wide else (1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(ticker.FuncFormatter(_tick_text))
    ax.yaxis.set_minor_formatter(ticker.NullFormatter())


def bars_on_log_axes(fig) -> list[str]:
    """The panels of `fig` that draw bars (bar containers or rectangle patches) on a
    logarithmic axis, by title: a bar's length there depends on where the axis starts."""
    found = []
    for ax in fig.axes:
        if "log" not in (ax.get_yscale(), ax.get_xscale()):
            continue
        bars = any(isinstance(c, BarContainer) for c in ax.containers) or any(
            isinstance(p, Rectangle) for p in ax.patches
        )
        if bars:
            found.append(ax.get_title() or "untitled panel")
    return found


def save(fig, out: str) -> None:
    """Save a figure that draws no bar on a log axis (else ValueError, nothing written)."""
    bad = bars_on_log_axes(fig)
    if bad:
        plt.close(fig)
        raise ValueError(f"{out}: bars on a logarithmic axis in panel(s) {', '.join(bad)}")
    fig.savefig(out)


def finish(fig, axes, out: str, extra: list | None = None) -> dict:
    """Figure legend above the panels, save, and what was drawn: panels and series per panel
    (distinct labels of the panel's artists, reference lines not counted)."""
    handles, labels, per_panel = [], [], []
    for ax in axes.flat:
        if not ax.get_visible():
            continue
        hs, ls = ax.get_legend_handles_labels()
        per_panel.append(len({lab for lab in ls if lab not in REFERENCE_LABELS}))
        for h, lab in zip(hs, ls):
            if lab not in labels:
                handles.append(_apart_handle() if lab == APART_LABEL else h)
                labels.append(lab)
    for h in extra or []:
        handles.append(h)
        labels.append(h.get_label())
    if handles:
        wide = fig.get_figwidth() > 4.5
        fig.legend(
            handles,
            labels,
            loc="lower center",
            ncols=min(8 if wide else 4, len(labels)),
            bbox_to_anchor=(0.5, 1.0),
            frameon=False,
        )
    fig.tight_layout()
    save(fig, out)
    plt.close(fig)
    return {"panels": len(per_panel), "series_max": max(per_panel, default=0)}


def label_outer(axes, n_panels: int, ylabel: str, xlabel: str | None) -> None:
    """The y label once per figure (beside the first column's panels; a grid of several rows
    gets it once for all rows, as the figure's y label: repeated per row, long labels overlap),
    the x label under the lowest panel of each column."""
    nrows, ncols = axes.shape
    used_rows = -(-n_panels // ncols)
    if used_rows > 1:
        axes.flat[0].figure.supylabel(ylabel, fontsize=plt.rcParams["axes.labelsize"])
    for i, ax in enumerate(axes.flat[:n_panels]):
        row, col = divmod(i, ncols)
        if col == 0 and used_rows == 1:
            ax.set_ylabel(ylabel)
        # the lowest visible panel of each column carries the x label
        if xlabel and (row == nrows - 1 or i + ncols >= n_panels):
            ax.set_xlabel(xlabel)


def _apart_handle() -> Line2D:
    """The legend's one entry for every series' apart points (their colours are the series');
    made when the legend is, under the figure's style."""
    style = dict(marker="o", markerfacecolor="none", linestyle="none")
    return Line2D([], [], color="0.3", label=APART_LABEL, **style)

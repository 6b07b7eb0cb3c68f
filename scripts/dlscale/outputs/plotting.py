"""Where a figure is drawn: a bounded set of figure files per hardware, from scaling.csv.

Layout (which files exist, which panels and series each holds, the bound on both):
dlscale.outputs.figure_layout, computed from the planned cells at parse time.

Points are medians over repetitions, error bars their intervals (dlscale.analysis.stats: the 95 %
order-statistic CI where n >= 6, else the min-max range; none where n = 1; the report's captions
say which and give n), dashed lines ideal scaling. Predicted points
(dlscale.analysis.scaling_model) are
open markers on a thinner dashed line in the series' colour, apart from the filled measured ones.
Over world size (x_axis: several ranks per node) a line runs through each world size's cell on
the fewest nodes, and the same world size on more nodes is an unconnected open marker (_series).
Bars encode length, so no figure draws a bar on a logarithmic axis (`bars_on_log_axes`, checked
before every file is saved). Sizes come from the paper's column
width: grids of up to 2 panel columns are one column wide, wider grids (up to MAX_COLS panel
columns) span the text width, taken as 2 column widths. The style is data (styles/paper.mplstyle).

The convergence workload's figures: `convergence_plots`; the planner's: `plan_figure`.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from importlib import resources

import matplotlib
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.container import BarContainer
from matplotlib.lines import Line2D
from matplotlib.patches import Patch, Rectangle

from dlscale.outputs.figure_layout import FAMILIES, PREDICTED_FAMILIES, SCALING, with_variant

PREDICTED_LABEL, UNVALIDATED_LABEL = "predicted", "predicted, not validated"
# a prediction above every measured point of a weak-scaling series whose throughput fell
# (dlscale.analysis.scaling_model.contradicts_measurements): a red cross over its open marker
CONTRADICTS_LABEL = "predicted above all measured: contradicts the data"
# a series' cells over world size that its line does not run through (_series): the same world
# size on more nodes than the line's cell, open markers of the series' colour, not connected
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


# ---- drawing ---------------------------------------------------------------------------------


def _grid(n_panels: int, ncols: int, width: float, aspect: float = 0.8):
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


def _ci_err(values: pd.Series, low: pd.Series, high: pd.Series) -> np.ndarray:
    """Error-bar extents from an interval; zero where there is none (n = 1)."""
    lower = (values - low).fillna(0).clip(lower=0)
    upper = (high - values).fillna(0).clip(lower=0)
    return np.vstack([lower.to_numpy(), upper.to_numpy()])


class _Hue:
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


def _select(scaling: pd.DataFrame, spec: dict, panel: list) -> pd.DataFrame:
    if scaling.empty:
        return scaling
    keep = (scaling["hardware"] == spec["hardware"]) & scaling["model"].isin(spec["models"])
    if len(panel) == 2:
        keep &= (scaling["model"] == panel[0]) & (scaling["policy"] == panel[1])
    else:
        keep &= scaling["policy"] == panel[0]
    part = scaling[keep]
    series = {tuple(s) for s in spec["series"]}
    return part[[(f, v) in series for f, v in zip(part["framework"], part["variant"])]]


def _no_data(ax) -> None:
    ax.text(
        0.5, 0.5, "no measured cells", transform=ax.transAxes, ha="center", va="center", color="0.5"
    )


def _panels(scaling: pd.DataFrame, spec: dict, axes, title: str = "{0}, {1}"):
    """(ax, panel, rows) for every panel of `spec` that has rows in `scaling`; every panel gets
    its title (`title` formatted with the panel's keys), a panel without rows says so."""
    for ax, panel in zip(axes.flat, spec["panels"]):
        part = _select(scaling, spec, panel)
        ax.set_title(title.format(*panel))
        if part.empty:
            _no_data(ax)
            continue
        yield ax, panel, part


def scales_within_nodes(scaling: pd.DataFrame, spec: dict) -> bool:
    """Whether a figure's series run over ranks per node (config axes.ranks_per_node: 1, 2, 4
    GPUs of one node), not over nodes alone: its x axis is then the world size, not the node
    count. A table of one ranks per node per hardware (every study without the axis, and
    tables written before it) keeps its node axis."""
    if "ranks_per_node" not in scaling:
        return False
    rows = scaling[scaling["hardware"] == spec["hardware"]]
    return rows["ranks_per_node"].nunique() > 1


def x_axis(scaling: pd.DataFrame, spec: dict) -> tuple[str, str]:
    """(column, label) of a figure's x axis: node counts, or world sizes (GPUs on GPU hardware,
    ranks on CPU) where its series scale within nodes (scales_within_nodes)."""
    if not scales_within_nodes(scaling, spec):
        return "nodes", "Nodes"
    return "world_size", "World size (GPUs)" if spec.get(
        "device"
    ) == "cuda" else "World size (ranks)"


def _nodes_axis(ax, nodes: list) -> None:
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


def _log_y(ax) -> None:
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


def _save(fig, out: str) -> None:
    """Save a figure that draws no bar on a log axis (else ValueError, nothing written)."""
    bad = bars_on_log_axes(fig)
    if bad:
        plt.close(fig)
        raise ValueError(f"{out}: bars on a logarithmic axis in panel(s) {', '.join(bad)}")
    fig.savefig(out)


def _finish(fig, axes, out: str, extra: list | None = None) -> dict:
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
    _save(fig, out)
    plt.close(fig)
    return {"panels": len(per_panel), "series_max": max(per_panel, default=0)}


def _label_outer(axes, n_panels: int, ylabel: str, xlabel: str | None) -> None:
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


def _predicted(
    ax, line: pd.DataFrame, preds: pd.DataFrame, column: str, colour, x: str = "nodes"
) -> list:
    """The series' predicted extension (dlscale.analysis.scaling_model): open markers on a dashed
    line from its largest measured node count, the interval shaded from that point's own
    interval to the predictions' (the repetitions' noise widened by the model's leave-one-out
    error where validated; labelled "not validated" where it is not: the model error is
    unknown; a band over one predicted node count alone would have no width), a prediction that
    contradicts the series' measurements crossed in red (CONTRADICTS_LABEL); returns the x values
    drawn (`x`: nodes, or world_size: a predicted node count times the ranks per node of the
    series' largest measured point, the whole nodes the model is fitted to)."""
    if preds is None or preds.empty:
        return []
    keep = np.ones(len(preds), dtype=bool)
    for c in ("hardware", "framework", "model", "policy", "variant"):
        keep &= (preds[c] == line[c].iloc[0]).to_numpy()
    ext = preds[keep & preds["extrapolated"].astype(bool).to_numpy()].sort_values("nodes")
    if ext.empty:
        return []
    validated = "validated" in ext and ext["validated"].astype(bool).all()
    last = line.iloc[-1]
    at = ext["nodes"] * (last["ranks_per_node"] if x == "world_size" else 1)
    ax.plot(
        [last[x], *at],
        [last[f"{column}_median"], *ext[f"{column}_pred"]],
        linestyle=(0, (4, 2)),
        color=colour,
        linewidth=0.9,
        label=PREDICTED_LABEL if validated else UNVALIDATED_LABEL,
    )
    ax.plot(
        at,
        ext[f"{column}_pred"],
        linestyle="none",
        marker="o",
        markersize=3.5,
        markerfacecolor="white",
        markeredgecolor=colour,
        color=colour,
    )
    if "contradicts_measurements" in ext:
        bad = ext[ext["contradicts_measurements"].astype(bool)]
        if not bad.empty:
            ax.plot(
                at[bad.index],
                bad[f"{column}_pred"],
                linestyle="none",
                marker="x",
                markersize=5,
                color="tab:red",
                label=CONTRADICTS_LABEL,
            )
    start_low, start_high = last[f"{column}_ci_low"], last[f"{column}_ci_high"]
    start_low = last[f"{column}_median"] if pd.isna(start_low) else start_low
    start_high = last[f"{column}_median"] if pd.isna(start_high) else start_high
    low = np.array([start_low, *ext[f"{column}_low"]], dtype=float)
    high = np.array([start_high, *ext[f"{column}_high"]], dtype=float)
    if np.isinf(high).any():  # a model error of 100 % or more: no upper bound, shade to the top
        top = ax.get_ylim()[1]
        high = np.where(np.isinf(high), max(top, np.nanmax(ext[f"{column}_pred"])), high)
    if np.isfinite(low[1:]).any() and np.isfinite(high[1:]).any():  # no interval: no band
        ax.fill_between([last[x], *at], low, high, color=colour, alpha=0.15, linewidth=0)
    return list(at)


def _series(part: pd.DataFrame, spec: dict, x: str = "nodes"):
    """(framework, precision, line, apart) for every series of `spec` with rows in `part` (a
    panel's rows): `line` the rows its line runs through, sorted by `x`, `apart` the others.
    Over nodes every row is on the line. Over world size (x_axis) the line runs through the
    series' packed cells, each world size's cell on the fewest nodes (a node filled before the
    next is added: 1x1, 1x2, 1x4, 2x4, 4x4), and its predicted extension continues from the last
    of them; the same world size on more nodes (2x1, 2x2) is `apart`, drawn as unconnected open
    points (_apart): a line through both would step vertically at one world size, which reads
    as a jump in the measurement and hides which point is which cell."""
    for framework, precision in spec["series"]:
        rows = part[(part["framework"] == framework) & (part["variant"] == precision)]
        if rows.empty:
            continue
        if x == "nodes":
            yield framework, precision, rows.sort_values("nodes"), rows.iloc[:0]
            continue
        rows = rows.sort_values([x, "nodes"])
        packed = ~rows[x].duplicated()
        yield framework, precision, rows[packed], rows[~packed]


def _apart_handle() -> Line2D:
    """The legend's one entry for every series' apart points (their colours are the series');
    made when the legend is, under the figure's style."""
    style = dict(marker="o", markerfacecolor="none", linestyle="none")
    return Line2D([], [], color="0.3", label=APART_LABEL, **style)


def _apart(ax, x, y, colour, marker: str, yerr=None, small: bool = False) -> None:
    """A series' cells apart from its line (_series): open markers of the series' colour and
    marker, not connected, with their error bars (`yerr`); hollow and larger than the line's
    markers, so a line or point behind one stays visible and one on a line's point of the same
    value rings it. `small`: a line's second quantity (its dotted line: lowest rank, peak
    memory). Nothing where there are none (every figure over nodes)."""
    if len(x) == 0:
        return
    size = plt.rcParams["lines.markersize"] * (0.8 if small else 1.5)
    style = dict(linestyle="none", marker=marker, markersize=size, markerfacecolor="none")
    if yerr is None:
        ax.plot(x, y, color=colour, label=APART_LABEL, **style)
    else:
        ax.errorbar(x, y, yerr=yerr, color=colour, label=APART_LABEL, **style)


def plot_scaling(
    scaling: pd.DataFrame, spec: dict, out: str, predictions: pd.DataFrame | None = None
) -> dict:
    family = spec["family"]
    column, ylabel = SCALING[family]
    ylabel = spec.get("ylabel", ylabel)  # a script's unit (dlscale.study.script_workload)
    if family not in PREDICTED_FAMILIES:  # the scaling model predicts these families' columns only
        predictions = None
    panels = spec["panels"]
    x, xlabel = x_axis(scaling, spec)
    fig, axes = _grid(len(panels), spec["ncols"], spec["width_in"])
    hue = _Hue(spec)

    def yerr(rows: pd.DataFrame):
        """A family whose points carry no interval (not in WITH_CI): no error bars."""
        if not spec["ci"]:
            return None
        med = rows[f"{column}_median"]
        return _ci_err(med, rows[f"{column}_ci_low"], rows[f"{column}_ci_high"])

    for ax, _, part in _panels(scaling, spec, axes):
        predicted: list = []
        for framework, precision, line, apart in _series(part, spec, x):
            colour, marker = hue.colour[framework], hue.marker(precision)
            ax.errorbar(
                line[x],
                line[f"{column}_median"],
                yerr=yerr(line),
                marker=marker,
                linestyle=hue.linestyle(precision),
                color=colour,
                label=hue.label(framework, precision),
            )
            _apart(ax, apart[x], apart[f"{column}_median"], colour, marker, yerr(apart))
            predicted += _predicted(ax, line, predictions, column, colour, x)
        ticks = sorted({*part[x].unique(), *predicted})
        if family in ("speedup", "efficiency"):
            base = part["baseline_world_size" if x == "world_size" else "baseline_nodes"].min()
            ideal = [n / base if family == "speedup" else 1.0 for n in ticks]
            ax.plot(ticks, ideal, linestyle="--", color="0.4", linewidth=0.8, label="ideal")
        _nodes_axis(ax, ticks)
        if family == "throughput":
            _log_y(ax)
        if family == "efficiency":  # from 0, and ideal (1) always in view
            ax.set_ylim(0, max(1.1, ax.get_ylim()[1]))
    _label_outer(axes, len(panels), ylabel, xlabel)
    return _finish(fig, axes, out)


def _bar_groups(part: pd.DataFrame, series: list, index: str, groups: list):
    """Grouped bars (or points): for each (framework, precision) series with rows in `part`,
    its rows indexed by `groups` (one group each) and the bars' (points') x positions and
    width."""
    width = 0.8 / max(1, len(series))
    for i, (framework, precision) in enumerate(series):
        rows = part[(part["framework"] == framework) & (part["variant"] == precision)]
        if rows.empty:
            continue
        x = np.arange(len(groups)) + (i - (len(series) - 1) / 2) * width
        yield framework, precision, rows.set_index(index).reindex(groups), x, width


def plot_frameworks(scaling: pd.DataFrame, spec: dict, out: str) -> dict:
    """Frameworks side by side at equal hardware: throughput per model at the largest node
    count measured on that hardware/policy, as points (median, error bars its interval) on a
    logarithmic axis: the models' throughputs span decades, and a point's position, unlike a
    bar's length, does not depend on where a log axis starts."""
    panels = spec["panels"]
    fig, axes = _grid(len(panels), 1, spec["width_in"], aspect=0.55)
    hue = _Hue(spec)
    models, series = spec["models"], spec["series"]
    for ax, panel, part in _panels(scaling, spec, axes, title="{0} scaling"):
        # the largest world size, on its fewest nodes where two cells have it (1x4 and 4x1):
        # the packed cell a line over world size ends at (_series)
        part = part[part["world_size"] == part["world_size"].max()]
        part = part[part["nodes"] == part["nodes"].min()]
        top_nodes = int(part["nodes"].max())
        for framework, precision, rows, x, _ in _bar_groups(part, series, "model", models):
            med = rows["throughput_samples_per_s_median"]
            ax.errorbar(
                x,
                med,
                yerr=_ci_err(
                    med,
                    rows["throughput_samples_per_s_ci_low"],
                    rows["throughput_samples_per_s_ci_high"],
                ),
                marker=hue.marker(precision),
                linestyle="none",
                color=hue.colour[framework],
                label=hue.label(framework, precision),
            )
        for edge in np.arange(len(models) - 1) + 0.5:  # model groups apart
            ax.axvline(edge, color="0.85", linewidth=0.6)
        ax.set_xlim(-0.5, len(models) - 0.5)
        ax.set_xticks(
            np.arange(len(models)),
            models,
            rotation=20 if len(models) > 1 else 0,
            ha="right" if len(models) > 1 else "center",
        )
        _log_y(ax)
        ax.set_title(f"{panel[0]} scaling, {top_nodes} node(s)")
    _label_outer(axes, len(panels), spec.get("ylabel", "Throughput (samples/s)"), None)
    return _finish(fig, axes, out)


def plot_breakdown(scaling: pd.DataFrame, spec: dict, out: str) -> dict:
    """Median step time split into compute (the same step without gradient allreduce; solid)
    and communication (the rest; hatched), per node count (groups) and series (bars)."""
    panels = spec["panels"]
    fig, axes = _grid(len(panels), spec["ncols"], spec["width_in"])
    hue = _Hue(spec)
    series = spec["series"]
    within, xlabel = scales_within_nodes(scaling, spec), "Nodes"
    if within:  # one bar group per nodes x ranks per node (1x2 and 2x1: one world size, two)
        scaling = scaling.assign(
            place=[f"{n}x{r}" for n, r in zip(scaling["nodes"], scaling["ranks_per_node"])]
        ).sort_values(["world_size", "nodes"])
        xlabel = (
            "Nodes x GPUs per node" if spec.get("device") == "cuda" else "Nodes x ranks per node"
        )
    along = "place" if within else "nodes"
    any_unknown = False
    for ax, _, part in _panels(scaling, spec, axes):
        nodes = list(dict.fromkeys(part[along])) if within else sorted(part[along].unique())
        for framework, precision, rows, x, width_bar in _bar_groups(part, series, along, nodes):
            step = rows["step_seconds_median_median"].to_numpy(dtype=float) * 1e3
            compute = rows["compute_seconds_median_median"].to_numpy(dtype=float) * 1e3
            known = ~np.isnan(compute)
            compute = np.where(known, np.minimum(compute, step), 0)
            colour = hue.colour[framework]
            ax.bar(x, compute, width_bar, color=colour, label=hue.label(framework, precision))
            ax.bar(
                x,
                np.where(known, step - compute, 0),
                width_bar,
                bottom=compute,
                color="white",
                edgecolor=colour,
                hatch="////",
                linewidth=0.4,
            )
            if (~known).any():
                any_unknown = True
                ax.bar(x[~known], step[~known], width_bar, color="0.75")
        ax.set_xticks(np.arange(len(nodes)), [str(n) for n in nodes])
        ax.grid(axis="x", visible=False)
    _label_outer(axes, len(panels), "Step time (ms, median)", xlabel)
    extra = [
        Patch(facecolor="0.3", label="compute"),
        Patch(facecolor="white", edgecolor="0.3", hatch="////", label="communication"),
    ]
    if any_unknown:
        extra.append(Patch(facecolor="0.75", label="not separable"))
    return _finish(fig, axes, out, extra)


# the telemetry family's quantity: GPU utilisation where the hardware's cells sampled it, else
# the rank process's CPU utilisation (dlscale.rank.telemetry)
TELEMETRY_AXES = {
    "gpu_util_pct": "GPU utilisation (%, NVML)",
    "cpu_util_pct": "CPU utilisation (% of one core)",
}


def _numeric(rows: pd.DataFrame, column: str) -> pd.Series:
    """A column as numbers, NaN where absent (tables written before the column existed)."""
    if column not in rows:
        return pd.Series(np.nan, index=rows.index)
    return pd.to_numeric(rows[column], errors="coerce")


def plot_telemetry(scaling: pd.DataFrame, spec: dict, out: str) -> dict:
    """Device utilisation during the timed window against nodes: per series the mean over a
    cell's ranks (solid) and its lowest rank (dotted), medians over repetitions."""
    hw = scaling[scaling["hardware"] == spec["hardware"]]
    gpu = _numeric(hw, "gpu_util_pct_mean_median").notna().any()
    quantity = "gpu_util_pct" if gpu else "cpu_util_pct"
    panels = spec["panels"]
    x, xlabel = x_axis(scaling, spec)
    fig, axes = _grid(len(panels), spec["ncols"], spec["width_in"])
    hue = _Hue(spec)
    for ax, _, part in _panels(scaling, spec, axes):
        for framework, precision, line, apart in _series(part, spec, x):
            mean = _numeric(line, f"{quantity}_mean_median")
            if mean.isna().all():
                continue
            colour, marker = hue.colour[framework], hue.marker(precision)
            ax.plot(
                line[x],
                mean,
                marker=marker,
                color=colour,
                label=hue.label(framework, precision),
            )
            lowest = _numeric(line, f"{quantity}_rank_min_median")
            ax.plot(line[x], lowest, linestyle=":", color=colour, linewidth=0.9)
            _apart(ax, apart[x], _numeric(apart, f"{quantity}_mean_median"), colour, marker)
            lowest = _numeric(apart, f"{quantity}_rank_min_median")
            _apart(ax, apart[x], lowest, colour, marker, small=True)
        _nodes_axis(ax, sorted(part[x].unique()))
        ax.set_ylim(bottom=0)
    _label_outer(axes, len(panels), TELEMETRY_AXES[quantity], xlabel)
    extra = [Line2D([], [], color="0.3", linestyle=":", label="lowest rank")]
    return _finish(fig, axes, out, extra)


# the MFU family's quantity: MFU where the hardware has a dense peak, else achieved TFLOP/s
MFU_AXES = {
    "mfu": "MFU (% of dense peak)",
    "achieved_tflops_per_device": "TFLOP/s per device (unknown peak)",
}


def plot_mfu(scaling: pd.DataFrame, spec: dict, out: str) -> dict:
    """Model FLOPs utilisation against nodes (medians over repetitions), or the achieved model
    TFLOP/s per device where the hardware entry has no dense peak ('unknown peak')."""
    hw = scaling[scaling["hardware"] == spec["hardware"]]
    known = _numeric(hw, "mfu_median").notna().any()
    quantity = "mfu" if known else "achieved_tflops_per_device"
    scale = 100.0 if known else 1.0
    panels = spec["panels"]
    x, xlabel = x_axis(scaling, spec)
    fig, axes = _grid(len(panels), spec["ncols"], spec["width_in"])
    hue = _Hue(spec)
    for ax, _, part in _panels(scaling, spec, axes):
        for framework, precision, line, apart in _series(part, spec, x):
            values = _numeric(line, f"{quantity}_median") * scale
            if values.isna().all():
                continue
            colour, marker = hue.colour[framework], hue.marker(precision)
            ax.plot(
                line[x],
                values,
                marker=marker,
                linestyle=hue.linestyle(precision),
                color=colour,
                label=hue.label(framework, precision),
            )
            _apart(ax, apart[x], _numeric(apart, f"{quantity}_median") * scale, colour, marker)
        _nodes_axis(ax, sorted(part[x].unique()))
        ax.set_ylim(bottom=0)
    _label_outer(axes, len(panels), MFU_AXES[quantity], xlabel)
    return _finish(fig, axes, out)


def plot_memory(scaling: pd.DataFrame, spec: dict, out: str) -> dict:
    """Memory per rank against nodes (medians over repetitions): the parameter, gradient and
    optimizer-state bytes of the largest rank (solid) and its peak memory (dotted: allocated
    device memory on GPUs, the resident set on CPUs), in MiB."""
    hw = scaling[scaling["hardware"] == spec["hardware"]]
    on_device = _numeric(hw, "peak_allocated_mb_max_median").notna().any()
    peak = "peak_allocated_mb_max_median" if on_device else "peak_rss_mb_max_median"
    panels = spec["panels"]
    x, xlabel = x_axis(scaling, spec)
    fig, axes = _grid(len(panels), spec["ncols"], spec["width_in"])
    hue = _Hue(spec)
    for ax, _, part in _panels(scaling, spec, axes):
        for framework, precision, line, apart in _series(part, spec, x):
            state = _numeric(line, "state_bytes_per_rank_max_median") / 2**20
            if state.isna().all():
                continue
            colour, marker = hue.colour[framework], hue.marker(precision)
            ax.plot(
                line[x],
                state,
                marker=marker,
                linestyle=hue.linestyle(precision),
                color=colour,
                label=hue.label(framework, precision),
            )
            ax.plot(line[x], _numeric(line, peak), linestyle=":", color=colour, lw=0.9)
            state = _numeric(apart, "state_bytes_per_rank_max_median") / 2**20
            _apart(ax, apart[x], state, colour, marker)
            _apart(ax, apart[x], _numeric(apart, peak), colour, marker, small=True)
        _nodes_axis(ax, sorted(part[x].unique()))
        # log: a process's peak (on a CPU its whole resident set, the runtime included) and a
        # small model's state differ by orders of magnitude; lines only, no bars
        _log_y(ax)
    _label_outer(axes, len(panels), "MiB per rank (log)", xlabel)
    extra = [
        Line2D([], [], color="0.3", label="params + grads + optimizer state"),
        Line2D(
            [], [], color="0.3", linestyle=":", label="peak allocated" if on_device else "peak RSS"
        ),
    ]
    return _finish(fig, axes, out, extra)


def plot_figure(
    scaling: pd.DataFrame, spec: dict, out: str, predictions: pd.DataFrame | None = None
) -> dict:
    """Draw one figure file of the layout; returns {"panels", "series_max"} as drawn.
    `predictions` (dlscale.analysis.scaling_model): scaling families get dashed predicted
    extensions."""
    scaling = with_variant(scaling)
    if predictions is not None and not predictions.empty:
        predictions = with_variant(predictions)
    with paper_style():
        family = spec["family"]
        if family in SCALING:
            return plot_scaling(scaling, spec, out, predictions)
        if family == "frameworks":
            return plot_frameworks(scaling, spec, out)
        if family == "breakdown":
            return plot_breakdown(scaling, spec, out)
        if family == "telemetry":
            return plot_telemetry(scaling, spec, out)
        if family == "mfu":
            return plot_mfu(scaling, spec, out)
        if family == "memory":
            return plot_memory(scaling, spec, out)
        raise ValueError(f"unknown figure family {family!r}; allowed: {', '.join(FAMILIES)}")

"""Where a figure of scaling.csv is drawn: a bounded set of figure files per hardware.

Layout (which files exist, which panels and series each holds, the bound on both):
dlscale.outputs.figure_layout, computed from the planned cells at parse time. Every family
draws through one panel x series loop (_draw_panels): the grid of the file's panels, each
panel's rows, each series of a panel in its colour, marker and line style; a family says only
how it draws one series (`draw`) and finishes one panel (`panel_end`). The drawing kit (style,
grid, axes, legend, saving): dlscale.outputs.figure_kit.

Points are medians over repetitions, error bars their intervals (dlscale.analysis.stats: the 95 %
order-statistic CI where n >= 6, else the min-max range; none where n = 1; the report's captions
say which and give n), dashed lines ideal scaling. Predicted points (dlscale.analysis.scaling_model)
are open markers on a thinner dashed line in the series' colour, apart from the filled measured
ones.
Over world size (x_axis: several ranks per node) a line runs through each world size's cell on
the fewest nodes, and the same world size on more nodes is an unconnected open marker (_series).
Bars encode length, so no figure draws a bar on a logarithmic axis (`bars_on_log_axes`, checked
before every file is saved).

The convergence workload's figures: `convergence_plots`; the planner's: `plan_figure`.
"""

from __future__ import annotations

from collections.abc import Callable

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from dlscale.outputs.figure_kit import (
    APART_LABEL,
    CONTRADICTS_LABEL,
    PREDICTED_LABEL,
    UNVALIDATED_LABEL,
    Hue,
    Look,
    ci_err,
    finish,
    grid,
    label_outer,
    log_y,
    no_data,
    nodes_axis,
    paper_style,
)
from dlscale.outputs.figure_layout import FAMILIES, PREDICTED_FAMILIES, SCALING, with_variant


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


def _panels(scaling: pd.DataFrame, spec: dict, axes, title: str = "{0}, {1}"):
    """(ax, panel, rows) for every panel of `spec` that has rows in `scaling`; every panel gets
    its title (`title` formatted with the panel's keys), a panel without rows says so."""
    for ax, panel in zip(axes.flat, spec["panels"]):
        part = _select(scaling, spec, panel)
        ax.set_title(title.format(*panel))
        if part.empty:
            no_data(ax)
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


def _draw_panels(
    scaling: pd.DataFrame,
    spec: dict,
    out: str,
    series,
    draw,
    *,
    ylabel: str,
    xlabel: str | None,
    panel_end=None,
    extra=None,
    ncols: int | None = None,
    aspect: float = 0.8,
    title: str = "{0}, {1}",
) -> dict:
    """The panel x series loop every family shares: a grid of the file's panels (`ncols`, else
    the layout's), and in each panel with rows (_panels) every series `series(part)` yields as
    (framework, precision, *rows), drawn by `draw(ax, look, *rows)` in its look (Hue.look); then
    `panel_end(ax, panel, part, drawn)` finishes the panel with what the draws returned. The y
    label once, the x label under each column (label_outer); the legend, with the entries
    `extra()` returns after the last panel, and the file (finish)."""
    panels = spec["panels"]
    fig, axes = grid(len(panels), ncols or spec["ncols"], spec["width_in"], aspect)
    hue = Hue(spec)
    for ax, panel, part in _panels(scaling, spec, axes, title):
        drawn = [draw(ax, hue.look(f, p), *rows) for f, p, *rows in series(part)]
        if panel_end is not None:
            panel_end(ax, panel, part, drawn)
    label_outer(axes, len(panels), ylabel, xlabel)
    return finish(fig, axes, out, None if extra is None else extra())


def _draw_lines(scaling: pd.DataFrame, spec: dict, out: str, x: str, draw, **kw) -> dict:
    """_draw_panels for the line families: each panel's series over `x` (_series), each panel
    finished on that axis (_over_x) unless `panel_end` says otherwise."""
    kw.setdefault("panel_end", _over_x(x))
    return _draw_panels(scaling, spec, out, lambda part: _series(part, spec, x), draw, **kw)


def _over_x(x: str, log: bool = False) -> Callable:
    """A line family's panel end: the panel's node counts (or world sizes) on the x axis, the
    y axis from zero, or logarithmic (`log`)."""

    def panel_end(ax, _panel, part: pd.DataFrame, _drawn) -> None:
        nodes_axis(ax, sorted(part[x].unique()))
        if log:
            log_y(ax)
        else:
            ax.set_ylim(bottom=0)

    return panel_end


def plot_scaling(
    scaling: pd.DataFrame, spec: dict, out: str, predictions: pd.DataFrame | None = None
) -> dict:
    family = spec["family"]
    column, ylabel = SCALING[family]
    ylabel = spec.get("ylabel", ylabel)  # a script's unit (dlscale.study.script_workload)
    if family not in PREDICTED_FAMILIES:  # the scaling model predicts these families' columns only
        predictions = None
    x, xlabel = x_axis(scaling, spec)

    def yerr(rows: pd.DataFrame):
        """A family whose points carry no interval (not in WITH_CI): no error bars."""
        if not spec["ci"]:
            return None
        med = rows[f"{column}_median"]
        return ci_err(med, rows[f"{column}_ci_low"], rows[f"{column}_ci_high"])

    def draw(ax, look: Look, line: pd.DataFrame, apart: pd.DataFrame) -> list:
        ax.errorbar(
            line[x],
            line[f"{column}_median"],
            yerr=yerr(line),
            marker=look.marker,
            linestyle=look.linestyle,
            color=look.colour,
            label=look.label,
        )
        _apart(ax, apart[x], apart[f"{column}_median"], look.colour, look.marker, yerr(apart))
        return _predicted(ax, line, predictions, column, look.colour, x)

    def panel_end(ax, _panel, part: pd.DataFrame, predicted: list) -> None:
        ticks = sorted({*part[x].unique(), *(at for drawn in predicted for at in drawn)})
        if family in ("speedup", "efficiency"):
            base = part["baseline_world_size" if x == "world_size" else "baseline_nodes"].min()
            ideal = [n / base if family == "speedup" else 1.0 for n in ticks]
            ax.plot(ticks, ideal, linestyle="--", color="0.4", linewidth=0.8, label="ideal")
        nodes_axis(ax, ticks)
        if family == "throughput":
            log_y(ax)
        if family == "efficiency":  # from 0, and ideal (1) always in view
            ax.set_ylim(0, max(1.1, ax.get_ylim()[1]))

    return _draw_lines(
        scaling, spec, out, x, draw, ylabel=ylabel, xlabel=xlabel, panel_end=panel_end
    )


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


def _largest(part: pd.DataFrame) -> pd.DataFrame:
    """A panel's cells at its largest world size, on its fewest nodes where two cells have it
    (1x4 and 4x1): the packed cell a line over world size ends at (_series)."""
    part = part[part["world_size"] == part["world_size"].max()]
    return part[part["nodes"] == part["nodes"].min()]


def plot_frameworks(scaling: pd.DataFrame, spec: dict, out: str) -> dict:
    """Frameworks side by side at equal hardware: throughput per model at the largest node
    count measured on that hardware/policy, as points (median, error bars its interval) on a
    logarithmic axis: the models' throughputs span decades, and a point's position, unlike a
    bar's length, does not depend on where a log axis starts."""
    models = spec["models"]

    def draw(ax, look: Look, rows: pd.DataFrame, x, _width) -> None:
        med = rows["throughput_samples_per_s_median"]
        ax.errorbar(
            x,
            med,
            yerr=ci_err(
                med,
                rows["throughput_samples_per_s_ci_low"],
                rows["throughput_samples_per_s_ci_high"],
            ),
            marker=look.marker,
            linestyle="none",
            color=look.colour,
            label=look.label,
        )

    def panel_end(ax, panel, part: pd.DataFrame, _drawn) -> None:
        top_nodes = int(_largest(part)["nodes"].max())
        for edge in np.arange(len(models) - 1) + 0.5:  # model groups apart
            ax.axvline(edge, color="0.85", linewidth=0.6)
        ax.set_xlim(-0.5, len(models) - 0.5)
        ax.set_xticks(
            np.arange(len(models)),
            models,
            rotation=20 if len(models) > 1 else 0,
            ha="right" if len(models) > 1 else "center",
        )
        log_y(ax)
        ax.set_title(f"{panel[0]} scaling, {top_nodes} node(s)")

    return _draw_panels(
        scaling,
        spec,
        out,
        lambda part: _bar_groups(_largest(part), spec["series"], "model", models),
        draw,
        ylabel=spec.get("ylabel", "Throughput (samples/s)"),
        xlabel=None,
        panel_end=panel_end,
        ncols=1,
        aspect=0.55,
        title="{0} scaling",
    )


def plot_breakdown(scaling: pd.DataFrame, spec: dict, out: str) -> dict:
    """Median step time split into compute (the same step without gradient allreduce; solid)
    and communication (the rest; hatched), per node count (groups) and series (bars)."""
    within, xlabel = scales_within_nodes(scaling, spec), "Nodes"
    if within:  # one bar group per nodes x ranks per node (1x2 and 2x1: one world size, two)
        scaling = scaling.assign(
            place=[f"{n}x{r}" for n, r in zip(scaling["nodes"], scaling["ranks_per_node"])]
        ).sort_values(["world_size", "nodes"])
        xlabel = (
            "Nodes x GPUs per node" if spec.get("device") == "cuda" else "Nodes x ranks per node"
        )
    along = "place" if within else "nodes"

    def groups(part: pd.DataFrame) -> list:
        return list(dict.fromkeys(part[along])) if within else sorted(part[along].unique())

    def draw(ax, look: Look, rows: pd.DataFrame, x, width_bar) -> bool:
        """The series' bars; whether a step of it has no compute time (not separable)."""
        step = rows["step_seconds_median_median"].to_numpy(dtype=float) * 1e3
        compute = rows["compute_seconds_median_median"].to_numpy(dtype=float) * 1e3
        known = ~np.isnan(compute)
        compute = np.where(known, np.minimum(compute, step), 0)
        ax.bar(x, compute, width_bar, color=look.colour, label=look.label)
        ax.bar(
            x,
            np.where(known, step - compute, 0),
            width_bar,
            bottom=compute,
            color="white",
            edgecolor=look.colour,
            hatch="////",
            linewidth=0.4,
        )
        if (~known).any():
            ax.bar(x[~known], step[~known], width_bar, color="0.75")
            return True
        return False

    unknown: list[bool] = []

    def panel_end(ax, _panel, part: pd.DataFrame, drawn: list) -> None:
        unknown.extend(drawn)
        nodes = groups(part)
        ax.set_xticks(np.arange(len(nodes)), [str(n) for n in nodes])
        ax.grid(axis="x", visible=False)

    def extra() -> list:
        patches = [
            Patch(facecolor="0.3", label="compute"),
            Patch(facecolor="white", edgecolor="0.3", hatch="////", label="communication"),
        ]
        if any(unknown):
            patches.append(Patch(facecolor="0.75", label="not separable"))
        return patches

    return _draw_panels(
        scaling,
        spec,
        out,
        lambda part: _bar_groups(part, spec["series"], along, groups(part)),
        draw,
        ylabel="Step time (ms, median)",
        xlabel=xlabel,
        panel_end=panel_end,
        extra=extra,
    )


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
    x, xlabel = x_axis(scaling, spec)

    def draw(ax, look: Look, line: pd.DataFrame, apart: pd.DataFrame) -> None:
        mean = _numeric(line, f"{quantity}_mean_median")
        if mean.isna().all():
            return
        ax.plot(line[x], mean, marker=look.marker, color=look.colour, label=look.label)
        lowest = _numeric(line, f"{quantity}_rank_min_median")
        ax.plot(line[x], lowest, linestyle=":", color=look.colour, linewidth=0.9)
        mean = _numeric(apart, f"{quantity}_mean_median")
        _apart(ax, apart[x], mean, look.colour, look.marker)
        lowest = _numeric(apart, f"{quantity}_rank_min_median")
        _apart(ax, apart[x], lowest, look.colour, look.marker, small=True)

    return _draw_lines(
        scaling,
        spec,
        out,
        x,
        draw,
        ylabel=TELEMETRY_AXES[quantity],
        xlabel=xlabel,
        extra=lambda: [Line2D([], [], color="0.3", linestyle=":", label="lowest rank")],
    )


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
    x, xlabel = x_axis(scaling, spec)

    def draw(ax, look: Look, line: pd.DataFrame, apart: pd.DataFrame) -> None:
        values = _numeric(line, f"{quantity}_median") * scale
        if values.isna().all():
            return
        ax.plot(
            line[x],
            values,
            marker=look.marker,
            linestyle=look.linestyle,
            color=look.colour,
            label=look.label,
        )
        values = _numeric(apart, f"{quantity}_median") * scale
        _apart(ax, apart[x], values, look.colour, look.marker)

    return _draw_lines(scaling, spec, out, x, draw, ylabel=MFU_AXES[quantity], xlabel=xlabel)


def plot_memory(scaling: pd.DataFrame, spec: dict, out: str) -> dict:
    """Memory per rank against nodes (medians over repetitions): the parameter, gradient and
    optimizer-state bytes of the largest rank (solid) and its peak memory (dotted: allocated
    device memory on GPUs, the resident set on CPUs), in MiB."""
    hw = scaling[scaling["hardware"] == spec["hardware"]]
    on_device = _numeric(hw, "peak_allocated_mb_max_median").notna().any()
    peak = "peak_allocated_mb_max_median" if on_device else "peak_rss_mb_max_median"
    x, xlabel = x_axis(scaling, spec)

    def draw(ax, look: Look, line: pd.DataFrame, apart: pd.DataFrame) -> None:
        state = _numeric(line, "state_bytes_per_rank_max_median") / 2**20
        if state.isna().all():
            return
        ax.plot(
            line[x],
            state,
            marker=look.marker,
            linestyle=look.linestyle,
            color=look.colour,
            label=look.label,
        )
        ax.plot(line[x], _numeric(line, peak), linestyle=":", color=look.colour, lw=0.9)
        state = _numeric(apart, "state_bytes_per_rank_max_median") / 2**20
        _apart(ax, apart[x], state, look.colour, look.marker)
        _apart(ax, apart[x], _numeric(apart, peak), look.colour, look.marker, small=True)

    peak_label = "peak allocated" if on_device else "peak RSS"
    return _draw_lines(
        scaling,
        spec,
        out,
        x,
        draw,
        ylabel="MiB per rank (log)",
        xlabel=xlabel,
        # log: a process's peak (on a CPU its whole resident set, the runtime included) and a
        # small model's state differ by orders of magnitude; lines only, no bars
        panel_end=_over_x(x, log=True),
        extra=lambda: [
            Line2D([], [], color="0.3", label="params + grads + optimizer state"),
            Line2D([], [], color="0.3", linestyle=":", label=peak_label),
        ],
    )


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

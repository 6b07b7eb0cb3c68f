"""The convergence workload's figures (dlscale.analysis.time_to_accuracy tables; layout:
dlscale.outputs.figure_layout.convergence_layout): time- and epochs-to-accuracy against nodes or
global batch, with not-reached points open, and the validation accuracy curves per epoch. The
drawing helpers and style are dlscale.outputs.figure_kit's."""

from __future__ import annotations

import matplotlib
import numpy as np
import pandas as pd
import seaborn as sns

from dlscale.outputs.figure_kit import (
    Hue,
    ci_err,
    finish,
    grid,
    label_outer,
    no_data,
    nodes_axis,
    paper_style,
)
from dlscale.outputs.figure_layout import with_variant


def _conv_select(table: pd.DataFrame, spec: dict, panel: list) -> pd.DataFrame:
    if table.empty:
        return table
    keep = (
        (table["hardware"] == spec["hardware"])
        & (table["model"] == panel[0])
        & (table["policy"] == panel[1])
    )
    if len(panel) == 4:
        keep &= (table["framework"] == panel[2]) & (table["variant"] == panel[3])
    return table[keep]


def _not_reached(ax, x, y, colour, label="not reached") -> None:
    """A point whose target was not reached: an open marker at the value reached at the epoch
    cap (a lower bound) with an upward arrow."""
    ax.plot(x, y, marker="o", markerfacecolor="white", color=colour, linestyle="none", label=label)
    for xi, yi in zip(x, y):
        ax.annotate(
            "",
            xy=(xi, yi * 1.35),
            xytext=(xi, yi * 1.04),
            arrowprops=dict(arrowstyle="->", color=colour, linewidth=0.8),
        )


def plot_time_to_accuracy(tta: pd.DataFrame, spec: dict, out: str, epochs_axis: bool = False):
    """Time-to-accuracy against node count (or epochs-to-accuracy against global batch):
    medians over repetitions, error bars their interval (time: stats.median_interval; epochs:
    the min-max over repetitions), dashed ideal (time only), not-reached points open."""
    panels = spec["panels"]
    fig, axes = grid(len(panels), spec["ncols"], spec["width_in"])
    hue = Hue(spec)
    for ax, panel in zip(axes.flat, panels):
        part = _conv_select(tta, spec, panel)
        ax.set_title(f"{panel[0]}, {panel[1]}")
        if part.empty:
            no_data(ax)
            continue
        xcol = "global_batch" if epochs_axis else "nodes"
        for framework, variant_ in spec["series"]:
            line = part[(part["framework"] == framework) & (part["variant"] == variant_)]
            if line.empty:
                continue
            line = line.sort_values(xcol)
            colour = hue.colour[framework]
            if epochs_axis:
                med = line["epochs_to_accuracy_median"]
                low, high = line["epochs_to_accuracy_min"], line["epochs_to_accuracy_max"]
                cap = line["max_epochs"].astype(float)
            else:
                med = line["time_to_accuracy_s_median"]
                low, high = line["time_to_accuracy_s_ci_low"], line["time_to_accuracy_s_ci_high"]
                cap = line["training_seconds_at_cap_max"].astype(float)
            high = high.replace(np.inf, np.nan)
            ok = med.notna()
            ax.errorbar(
                line.loc[ok, xcol],
                med[ok],
                yerr=ci_err(med[ok], low[ok], high[ok]),
                marker=hue.marker(variant_),
                # against the global batch, node counts with one global batch (strong scaling)
                # share an x: points, each labelled with its node count, not a line
                linestyle="none" if epochs_axis else hue.linestyle(variant_),
                color=colour,
                label=hue.label(framework, variant_),
            )
            if (~ok).any():
                _not_reached(ax, list(line.loc[~ok, xcol]), list(cap[~ok]), colour)
            if epochs_axis:
                for x, y, n in zip(line[xcol], med.fillna(cap), line["nodes"]):
                    ax.annotate(
                        f"{int(n)} node{'s' if n > 1 else ''}",
                        (x, y),
                        xytext=(4, 2),
                        textcoords="offset points",
                        fontsize="x-small",
                        color=colour,
                    )
        if not epochs_axis:
            ideal = part.dropna(subset=["ideal_time_to_accuracy_s"]).groupby("nodes")[
                "ideal_time_to_accuracy_s"
            ]
            ideal = ideal.min()
            if len(ideal) > 1:
                ax.plot(
                    ideal.index,
                    ideal.to_numpy(),
                    linestyle="--",
                    color="0.4",
                    linewidth=0.8,
                    label="ideal",
                )
        nodes_axis(ax, sorted(part[xcol].unique()))
        if epochs_axis:
            ax.set_ylim(bottom=0)
            ax.yaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
        else:
            _seconds_axis(ax)
    ylabel = "Epochs to target (median)" if epochs_axis else "Time to target (s, median)"
    label_outer(axes, len(panels), ylabel, "Global batch" if epochs_axis else "Nodes")
    return finish(fig, axes, out)


def _seconds_axis(ax) -> None:
    """A log axis of seconds labelled at 1, 2 and 5 of each decade (a span of less than a
    decade still has labels)."""
    ax.set_yscale("log")
    ax.yaxis.set_major_locator(matplotlib.ticker.LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
    ax.yaxis.set_minor_locator(matplotlib.ticker.NullLocator())


def plot_accuracy_curves(epochs: pd.DataFrame, cells: pd.DataFrame, spec: dict, out: str):
    """Validation accuracy after each epoch: one line per node count and repetition (colour:
    node count), the target dashed."""
    panels = spec["panels"]
    fig, axes = grid(len(panels), spec["ncols"], spec["width_in"])
    nodes = sorted(epochs["nodes"].unique()) if not epochs.empty else []
    colours = dict(zip(nodes, sns.color_palette("viridis", max(1, len(nodes)))))
    for ax, panel in zip(axes.flat, panels):
        part = _conv_select(epochs, spec, panel)
        ax.set_title(
            f"{panel[0]}, {panel[1]}, {panel[2]}"
            + (f" {panel[3]}" if len(spec["precisions"]) > 1 or panel[3] != "fp32" else "")
        )
        if part.empty:
            no_data(ax)
            continue
        for (n, rep), curve in part.groupby(["nodes", "rep"], sort=True):
            curve = curve.sort_values("epoch")
            ax.plot(
                curve["epoch"],
                curve["val_accuracy"],
                color=colours[n],
                marker=".",
                linewidth=0.9,
                label=f"{n} node{'s' if n > 1 else ''}",
            )
        targets = _conv_select(cells, spec, panel)["target_accuracy"].dropna().unique()
        for target in targets:
            ax.axhline(target, linestyle="--", color="0.4", linewidth=0.8, label="target")
        last = int(part["epoch"].max())
        ax.set_xlim(0.5, last + 0.5)
        ax.set_xticks(range(1, last + 1, max(1, -(-last // 8))))
    label_outer(axes, len(panels), "Validation accuracy", "Epoch")
    return finish(fig, axes, out)


def plot_convergence_figure(
    tta: pd.DataFrame, epochs: pd.DataFrame, cells: pd.DataFrame, spec: dict, out: str
) -> dict:
    """Draw one convergence figure file (dlscale.outputs.figure_layout.convergence_layout)."""
    tta, epochs, cells = (
        with_variant(t) if not t.empty else t.assign(variant=[]) for t in (tta, epochs, cells)
    )
    with paper_style():
        family = spec["family"]
        if family == "time_to_accuracy":
            return plot_time_to_accuracy(tta, spec, out)
        if family == "epochs_to_accuracy":
            return plot_time_to_accuracy(tta, spec, out, epochs_axis=True)
        if family == "accuracy_curves":
            return plot_accuracy_curves(epochs, cells, spec, out)
        raise ValueError(f"unknown convergence figure family {family!r}")


def plot_convergence_tables(
    time_to_accuracy: str, epochs: str, convergence: str, spec: dict, out: str
) -> dict:
    """plot_convergence_figure from the three tables' CSV files (the `convergence_figure` job)."""
    tables = (pd.read_csv(f) for f in (time_to_accuracy, epochs, convergence))
    return plot_convergence_figure(*tables, spec=spec, out=out)

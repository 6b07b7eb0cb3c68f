"""The trend figure of a history table (dlscale.decisions.history): one panel per series, its
points (runs) in time order, each the median throughput of its repetitions with the median's
interval as error bars and its n written above it; the marker's colour is the point's verdict
against the series' last good point (FAIL red, UNCERTAIN orange, PASS and the first point
blue). Points are labelled by time, commit or a software version (`by`).

At most MAX_PANELS series per file (the first, in the table's order); the caption says how many
more the table holds. Reads a table, never the database. matplotlib is imported where a figure
is drawn: the labels (`point_label`) serve `dlscale history`'s table, which draws nothing
unless asked.
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from dlscale.outputs.figure_layout import MAX_PANELS

COLOURS = {"FAIL": "tab:red", "UNCERTAIN": "tab:orange", "PASS": "tab:blue", "first": "tab:blue"}
CAPTION = (
    "Median throughput of each run (point) of a configuration, oldest first; error bars: the "
    "interval of the median over the run's repetitions (order-statistic 95 % CI where n >= 6, "
    "min-max range below, none for one), n above each point; colour: the run's verdict "
    "against the series' last good run (red FAIL, orange UNCERTAIN, blue PASS or the first)."
)


def day(ts) -> str:
    return pd.Timestamp(ts).strftime("%Y-%m-%d %H:%M")


def point_label(row: dict, by: str) -> str:
    """A point's label by time (its first measurement), commit, or a software version (its
    `software_all`: "name version; ...")."""
    if by == "time":
        return day(row["first_measured"])
    if by == "commit":
        return (row.get("commit") or "?")[:12]
    software = dict(
        part.split(" ", 1) for part in (row.get("software_all") or "").split("; ") if " " in part
    )
    return software.get(by, "?")


def history_axes(table: pd.DataFrame, by: str = "time", width_in: float = 6.8):
    """The figure (matplotlib) of `table`, not saved: one panel per series, at most
    MAX_PANELS. Returns (figure, series drawn, series in the table)."""
    import matplotlib.pyplot as plt  # here: the table's labels above need no matplotlib

    groups = list(table.groupby("series", sort=False))
    shown = groups[:MAX_PANELS]
    ncols = 1 if len(shown) == 1 else 2
    nrows = max(1, math.ceil(len(shown) / ncols))
    fig, axes = plt.subplots(
        nrows, ncols, figsize=(width_in, 2.4 * nrows + 0.5), squeeze=False, layout="constrained"
    )
    for ax in axes.flat[len(shown) :]:
        ax.set_visible(False)
    for ax, (series, rows) in zip(axes.flat, shown):
        rows = rows.sort_values("point")
        x = list(range(len(rows)))
        medians = rows["median"].astype(float).tolist()
        low = rows["interval_low"].astype(float)
        high = rows["interval_high"].astype(float)
        for i, r in enumerate(rows.to_dict("records")):
            has = not (pd.isna(r["interval_low"]) or pd.isna(r["interval_high"]))
            ax.errorbar(
                [i],
                [r["median"]],
                yerr=[
                    [max(r["median"] - r["interval_low"], 0)],
                    [max(r["interval_high"] - r["median"], 0)],
                ]
                if has
                else None,  # fmt: skip
                fmt="o",
                color=COLOURS.get(r["verdict"], "tab:gray"),
                markersize=4,
                capsize=2 if has else 0,
            )
        ax.plot(x, medians, color="0.6", linewidth=0.8, zorder=0)
        top = max([*high.dropna().tolist(), *medians])
        bottom = min([*low.dropna().tolist(), *medians])
        span = max(top - bottom, 0.05 * abs(top) or 1.0)
        ax.set_ylim(bottom - 0.15 * span, top + 0.3 * span)
        ax.set_xlim(-0.5, len(rows) - 0.5)
        for i, r in enumerate(rows.to_dict("records")):
            above = r["interval_high"] if not pd.isna(r["interval_high"]) else r["median"]
            ax.annotate(
                f"n={r['n']}",
                (i, above),
                xytext=(0, 3),
                textcoords="offset points",
                ha="center",
                va="bottom",
                fontsize=6,
            )
        labels = [point_label(r, by) for r in rows.to_dict("records")]
        step = max(1, math.ceil(len(labels) / 6))  # at most 6 tick labels: no overlap
        ax.set_xticks(x[::step], labels[::step], rotation=20, ha="right", fontsize=6)
        ax.set_title(series, fontsize=7)
        ax.set_ylabel("samples/s", fontsize=7)
        ax.tick_params(axis="y", labelsize=6)
    return fig, len(shown), len(groups)


def draw_history(table: pd.DataFrame, out: str | Path, by: str = "time") -> str:
    """Draw and save the trend figure; returns its caption (with how many series it leaves
    to the table)."""
    import matplotlib.pyplot as plt

    from dlscale.outputs.figure_kit import paper_style

    caption = CAPTION
    with paper_style():
        fig, shown, total = history_axes(table, by)
        if total == 0:
            fig.axes[0].set_visible(True)
            fig.axes[0].text(0.5, 0.5, "no series", ha="center", transform=fig.axes[0].transAxes)
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(out)
        plt.close(fig)
    if total > shown:
        caption += f" The first {shown} of {total} series; every series is in the table."
    return caption

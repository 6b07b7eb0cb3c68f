"""The planner's figure (dlscale.decisions.planner): per job, predicted time-to-train against
nodes for each framework x partition option, the chosen option starred; a failed plan draws its
message. The drawing helpers and style are dlscale.outputs.figure_kit's."""

from __future__ import annotations

import seaborn as sns

from dlscale.outputs.figure_kit import (
    finish,
    grid,
    label_outer,
    log_y,
    nodes_axis,
    paper_style,
    plt,
    save,
)


def plot_plan_options(result, out: str, width_in: float = 3.5) -> None:
    """The planner's figure (dlscale.decisions.planner): per job, predicted time-to-train against
    nodes for
    each framework x partition option (dashed beyond the measured node counts), the chosen
    option starred; a failed plan draws its message."""
    with paper_style():
        if isinstance(result, Exception):
            fig, ax = plt.subplots(figsize=(width_in, 1.2))
            ax.axis("off")
            ax.text(
                0.5,
                0.5,
                "no plan:\n" + str(result)[:160],
                ha="center",
                va="center",
                wrap=True,
                fontsize=6,
            )
            save(fig, out)
            plt.close(fig)
            return
        opts, plan = result.options, result.plan
        jobs = list(plan["job"])
        fig, axes = grid(len(jobs), grid_columns_for(len(jobs)), width_in)
        colours = dict(
            zip(
                sorted(opts["hardware"].unique()),
                sns.color_palette("colorblind", opts["hardware"].nunique()),
            )
        )
        for ax, (_, chosen) in zip(axes.flat, plan.iterrows()):
            mine = opts[opts["job"] == chosen["job"]]
            for (hw, fw), grp in mine.groupby(["hardware", "framework"], sort=True):
                grp = grp.sort_values("nodes")
                meas = grp[~grp["extrapolated"].astype(bool)]
                ax.plot(meas["nodes"], meas["hours"], color=colours[hw], label=f"{hw} {fw}")
                ax.plot(
                    grp["nodes"],
                    grp["hours"],
                    color=colours[hw],
                    linestyle=(0, (4, 2)),
                    linewidth=0.8,
                    label="predicted",
                )
            ax.plot(
                [chosen["nodes"]],
                [chosen["hours"]],
                marker="*",
                markersize=9,
                color="black",
                linestyle="none",
                label="chosen",
            )
            log_y(ax)  # labelled however short the span of hours
            nodes = sorted(int(n) for n in mine["nodes"].unique())
            nodes_axis(ax, [n for n in nodes if n & (n - 1) == 0])  # powers of two
            ax.set_title(str(chosen["job"]))
        label_outer(axes, len(jobs), "Predicted time (h)", "Nodes")
        finish(fig, axes, out)


def grid_columns_for(n_panels: int) -> int:
    return 1 if n_panels <= 1 else 2

"""Where a figure is drawn: one function per figure family, from results/tables/scaling.csv.

Every panel is one (hardware, policy) pair, so the batch policy is on every figure; each line
is one framework x model; points are medians over repetitions, bars span min..max (n in the
caption). Sizes come from the paper's column width; the style is data (styles/paper.mplstyle).
"""
from __future__ import annotations

from importlib import resources

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402

FAMILIES = {
    "throughput": ("throughput_samples_per_s", "Throughput (samples/s, sum over ranks)"),
    "speedup": ("speedup", "Speedup vs. baseline nodes"),
    "efficiency": ("scaling_efficiency", "Scaling efficiency"),
}


def _style():
    return resources.files("dlscale").joinpath("styles/paper.mplstyle")


def plot_family(scaling: pd.DataFrame, family: str, out: str, column_width_in: float) -> None:
    column, ylabel = FAMILIES[family]
    with plt.style.context(str(_style())):
        panels = (scaling[["hardware", "policy"]].drop_duplicates()
                  .sort_values(["hardware", "policy"]).itertuples(index=False))
        panels = list(panels) or [("none", "none")]
        ncols = min(len(panels), 2)
        nrows = -(-len(panels) // ncols)
        width = column_width_in
        fig, axes = plt.subplots(nrows, ncols, figsize=(width, 0.8 * width / ncols * nrows + 0.45),
                                 squeeze=False, sharey=family != "throughput")
        series = scaling[["framework", "model"]].drop_duplicates().sort_values(["framework", "model"])
        palette = dict(zip(map(tuple, series.values), sns.color_palette("colorblind", len(series))))
        for ax, (hardware, policy) in zip(axes.flat, panels):
            part = scaling[(scaling["hardware"] == hardware) & (scaling["policy"] == policy)]
            for (framework, model), line in part.groupby(["framework", "model"]):
                line = line.sort_values("nodes")
                med = line[f"{column}_median"]
                err = [med - line[f"{column}_min"], line[f"{column}_max"] - med]
                ax.errorbar(line["nodes"], med, yerr=err, marker="o",
                            color=palette[(framework, model)], label=f"{framework}/{model}")
            if family in ("speedup", "efficiency") and not part.empty:
                nodes = sorted(part["nodes"].unique())
                base = part["baseline_nodes"].min()
                ideal = [n / base if family == "speedup" else 1.0 for n in nodes]
                ax.plot(nodes, ideal, linestyle="--", color="0.4", linewidth=0.8, label="ideal")
            ax.set_title(f"{hardware}, {policy} scaling")
            ax.set_xscale("log", base=2)
            ax.set_xticks(sorted(part["nodes"].unique()) if not part.empty else [1])
            ax.get_xaxis().set_major_formatter(matplotlib.ticker.ScalarFormatter())
            ax.minorticks_off()
            ax.set_xlabel("Nodes")
            if family == "throughput":
                ax.set_yscale("log")
            if family == "efficiency":
                ax.set_ylim(0, max(1.1, float(part[f"{column}_max"].max() or 0) * 1.05)
                            if not part.empty else 1.1)
        for ax in axes.flat[len(panels):]:
            ax.set_visible(False)
        for ax in axes[:, 0]:
            ax.set_ylabel(ylabel)
        handles, labels = axes.flat[0].get_legend_handles_labels()
        if handles:
            fig.legend(handles, labels, loc="lower center", ncols=min(3, len(labels)),
                       bbox_to_anchor=(0.5, 1.0), frameon=False)
        fig.tight_layout()
        fig.savefig(out)
        plt.close(fig)

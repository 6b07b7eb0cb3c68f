"""Where a figure is drawn: one function per figure family, from results/tables/scaling.csv.

Every panel is one (hardware, policy) pair, so the batch policy is on every figure. Scaling
families: one line per framework x model, points are medians over repetitions, bars are 95 %
bootstrap confidence intervals (dlscale.stats; none where n = 1), dashed lines are ideal.
Sizes come from the paper's column width; the style is data (styles/paper.mplstyle).
"""
from __future__ import annotations

from importlib import resources

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402

SCALING = {
    "throughput": ("throughput_samples_per_s", "Throughput (samples/s, sum over ranks)"),
    "speedup": ("speedup", "Speedup vs. baseline nodes"),
    "efficiency": ("scaling_efficiency", "Scaling efficiency"),
}
FAMILIES = [*SCALING, "frameworks", "breakdown"]
MARKERS = ["o", "s", "^", "D", "v", "P", "X", "*"]
LINESTYLES = ["-", "--", ":", "-."]


def _style():
    return str(resources.files("dlscale").joinpath("styles/paper.mplstyle"))


def _panels(scaling: pd.DataFrame) -> list[tuple[str, str]]:
    panels = scaling[["hardware", "policy"]].drop_duplicates().sort_values(["hardware", "policy"])
    return list(panels.itertuples(index=False, name=None)) or [("none", "none")]


def _figure(n_panels: int, width: float, sharey: bool = False):
    ncols = min(n_panels, 2)
    nrows = -(-n_panels // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(width, 0.8 * width / ncols * nrows + 0.45),
                             squeeze=False, sharey=sharey)
    for ax in axes.flat[n_panels:]:
        ax.set_visible(False)
    return fig, axes


def _ci_err(values: pd.Series, low: pd.Series, high: pd.Series) -> np.ndarray:
    """Error-bar extents from an interval; zero where there is none (n = 1)."""
    lower = (values - low).fillna(0).clip(lower=0)
    upper = (high - values).fillna(0).clip(lower=0)
    return np.vstack([lower.to_numpy(), upper.to_numpy()])


def _finish(fig, axes, out: str) -> None:
    handles, labels = [], []
    for ax in axes.flat:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            if lab not in labels:
                handles.append(h)
                labels.append(lab)
    if handles:
        fig.legend(handles, labels, loc="lower center", ncols=min(3, len(labels)),
                   bbox_to_anchor=(0.5, 1.0), frameon=False)
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)


def plot_scaling(scaling: pd.DataFrame, family: str, out: str, width: float) -> None:
    column, ylabel = SCALING[family]
    panels = _panels(scaling)
    fig, axes = _figure(len(panels), width, sharey=family != "throughput")
    # colour = framework, marker and line style = model: one legend entry per combination
    frameworks = sorted(scaling["framework"].unique()) if not scaling.empty else []
    models = sorted(scaling["model"].unique()) if not scaling.empty else []
    colour = dict(zip(frameworks, sns.color_palette("colorblind", max(1, len(frameworks)))))
    style = {m: (MARKERS[i % len(MARKERS)], LINESTYLES[i % len(LINESTYLES)])
             for i, m in enumerate(models)}
    for ax, (hardware, policy) in zip(axes.flat, panels):
        part = scaling[(scaling["hardware"] == hardware) & (scaling["policy"] == policy)]
        for (framework, model), line in part.groupby(["framework", "model"]):
            line = line.sort_values("nodes")
            med = line[f"{column}_median"]
            ax.errorbar(line["nodes"], med,
                        yerr=_ci_err(med, line[f"{column}_ci_low"], line[f"{column}_ci_high"]),
                        marker=style[model][0], linestyle=style[model][1],
                        color=colour[framework], label=f"{framework}/{model}")
        nodes = sorted(part["nodes"].unique()) if not part.empty else [1]
        if family in ("speedup", "efficiency") and not part.empty:
            base = part["baseline_nodes"].min()
            ideal = [n / base if family == "speedup" else 1.0 for n in nodes]
            ax.plot(nodes, ideal, linestyle="--", color="0.4", linewidth=0.8, label="ideal")
        ax.set_title(f"{hardware}, {policy} scaling")
        ax.set_xscale("log", base=2)
        ax.set_xticks(nodes)
        ax.get_xaxis().set_major_formatter(matplotlib.ticker.ScalarFormatter())
        ax.minorticks_off()
        ax.set_xlabel("Nodes")
        if family == "throughput":
            ax.set_yscale("log")
        if family == "efficiency":
            top = part[f"{column}_ci_high"].max() if not part.empty else np.nan
            top = part[f"{column}_median"].max() if np.isnan(top) else top
            ax.set_ylim(0, max(1.1, float(top if not np.isnan(top) else 0) * 1.05))
    for ax in axes[:, 0]:
        ax.set_ylabel(ylabel)
    _finish(fig, axes, out)


def plot_frameworks(scaling: pd.DataFrame, out: str, width: float) -> None:
    """Frameworks side by side at equal hardware: throughput per model at the largest node
    count measured on that hardware/policy (median, 95 % CI)."""
    panels = _panels(scaling)
    fig, axes = _figure(len(panels), width)
    frameworks = sorted(scaling["framework"].unique()) if not scaling.empty else []
    palette = dict(zip(frameworks, sns.color_palette("colorblind", max(1, len(frameworks)))))
    for ax, (hardware, policy) in zip(axes.flat, panels):
        part = scaling[(scaling["hardware"] == hardware) & (scaling["policy"] == policy)]
        if part.empty:
            continue
        top_nodes = part["nodes"].max()
        part = part[part["nodes"] == top_nodes]
        models = sorted(part["model"].unique())
        width_bar = 0.8 / max(1, len(frameworks))
        for i, framework in enumerate(frameworks):
            rows = part[part["framework"] == framework].set_index("model").reindex(models)
            x = np.arange(len(models)) + (i - (len(frameworks) - 1) / 2) * width_bar
            med = rows["throughput_samples_per_s_median"]
            ax.bar(x, med, width_bar, color=palette[framework], label=framework,
                   yerr=_ci_err(med, rows["throughput_samples_per_s_ci_low"],
                                rows["throughput_samples_per_s_ci_high"]))
        ax.set_xticks(np.arange(len(models)), models, rotation=20, ha="right")
        ax.set_yscale("log")
        ax.set_title(f"{hardware}, {policy}, {top_nodes} node(s)")
    for ax in axes[:, 0]:
        ax.set_ylabel("Throughput (samples/s)")
    _finish(fig, axes, out)


def plot_breakdown(scaling: pd.DataFrame, out: str, width: float) -> None:
    """Median step time split into compute (the same step without gradient allreduce) and
    communication (the rest), per framework/model and node count."""
    panels = _panels(scaling)
    fig, axes = _figure(len(panels), width)
    for ax, (hardware, policy) in zip(axes.flat, panels):
        part = scaling[(scaling["hardware"] == hardware) & (scaling["policy"] == policy)]
        part = part.sort_values(["framework", "model", "nodes"])
        labels = [f"{r.framework}/{r.model}\nn={r.nodes}" for r in part.itertuples()]
        step = part["step_seconds_median_median"].to_numpy(dtype=float) * 1e3
        compute = part["compute_seconds_median_median"].to_numpy(dtype=float) * 1e3
        known = ~np.isnan(compute)
        compute = np.where(known, np.minimum(compute, step), np.nan)
        x = np.arange(len(part))
        ax.bar(x, np.where(known, compute, 0), color="#4c72b0", label="compute")
        ax.bar(x, np.where(known, step - compute, 0), bottom=np.where(known, compute, 0),
               color="#dd8452", label="communication")
        if (~known).any():
            ax.bar(x[~known], step[~known], color="0.75", label="not separable")
        ax.set_xticks(x, labels, rotation=60, ha="right", fontsize=5)
        ax.set_title(f"{hardware}, {policy} scaling")
    for ax in axes[:, 0]:
        ax.set_ylabel("Step time (ms, median)")
    _finish(fig, axes, out)


def plot_family(scaling: pd.DataFrame, family: str, out: str, column_width_in: float) -> None:
    with plt.style.context(_style()):
        if family in SCALING:
            plot_scaling(scaling, family, out, column_width_in)
        elif family == "frameworks":
            plot_frameworks(scaling, out, column_width_in)
        elif family == "breakdown":
            plot_breakdown(scaling, out, column_width_in)
        else:
            raise ValueError(f"unknown figure family {family!r}; allowed: {', '.join(FAMILIES)}")

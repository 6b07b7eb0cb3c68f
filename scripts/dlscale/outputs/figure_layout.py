"""The figure layout: which figure files a study has and what each holds, computed from the
planned cells at parse time (FIGURE_LAYOUT in rules/common.smk), so Snakemake knows every file
before any cell runs, without importing matplotlib or pandas.

Layout (`figure_layout`):

- one figure *family* (FAMILIES: throughput, speedup, efficiency, frameworks, breakdown,
  telemetry, mfu, memory) is drawn per hardware key into ``{hardware}/{family}.pdf``;
- scaling families (throughput, speedup, efficiency), the breakdown and telemetry have one panel per
  model x batch policy, and one series per framework x precision (colour = framework, marker
  and line style = precision); the frameworks family has one panel per batch policy with the
  page's models on the x axis and one bar per series;
- a file holds at most MAX_PANELS panels and MAX_SERIES series per panel. A hardware key with
  more models splits its models into ceil(models / floor(MAX_PANELS / policies)) chunks of
  (nearly) equal size, and more series into ceil(series / MAX_SERIES) chunks; every model chunk
  x series chunk is one page, written to ``{hardware}/{family}-{k}.pdf`` (k = 1, 2, ...,
  model-chunk-major) when there is more than one page and to ``{hardware}/{family}.pdf`` when
  there is one. So a study has at most

      sum over hardware h of
          len(FAMILIES) x ceil(M_h / floor(MAX_PANELS / K_h)) x ceil(S_h / MAX_SERIES)

  files (M_h models, K_h batch policies, S_h framework x precision series planned on h;
  `figure_file_bound`), exactly that many without exclusions (a page whose panels would all be
  excluded is dropped).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from dlscale.study.cell import DEFAULT_PARALLELISM

SCALING = {
    "throughput": ("throughput_samples_per_s", "Throughput (samples/s)"),
    "speedup": ("speedup", "Speedup"),
    "efficiency": ("scaling_efficiency", "Scaling efficiency"),
}
FAMILIES = [*SCALING, "frameworks", "breakdown", "telemetry", "mfu", "memory"]
# The scaling model's extensions (dlscale.analysis.scaling_model), drawn in the series' colour; how
# far they
# reach follows plan.max_extrapolation and plan.max_extrapolation_unvalidated (predicted_caption).
# (the defaults are dlscale.analysis.scaling_model's, repeated here: this module imports neither
# numpy nor
# pandas, and tests/unit/outputs/test_plotting.py checks that the two agree)
DEFAULT_MAX_EXTRAPOLATION, DEFAULT_MAX_EXTRAPOLATION_UNVALIDATED = 8, 2


def _factor(x: float) -> str:
    return f"{float(x):g}"


def predicted_caption(plan: dict | None = None) -> str:
    """What the scaling figures' predicted extensions are and how far they may reach, from the
    study's `plan` settings (max_extrapolation, max_extrapolation_unvalidated); a factor for
    unvalidated series above the default is said to be the configuration's."""
    plan = plan or {}
    validated = plan.get("max_extrapolation", DEFAULT_MAX_EXTRAPOLATION)
    asked = plan.get("max_extrapolation_unvalidated", DEFAULT_MAX_EXTRAPOLATION_UNVALIDATED)
    unvalidated = min(validated, asked)
    text = (
        " Coloured dashes with open markers beyond the last measured node count: predicted by "
        "the scaling model (Recommendations), shaded by its interval: the repetitions' noise "
        "widened by the series' leave-one-node-count-out error where the series is validated; "
        "the noise only where it is not (3 or more node counts needed), labelled "
        "'not validated' (model error unknown). Predictions reach at most "
        f"{_factor(validated)}x the largest measured node count of a validated series and "
        f"{_factor(unvalidated)}x that of an unvalidated one"
    )
    contradicts = (
        " A red cross marks a prediction above every throughput measured in its weak-scaling "
        "series although the measured throughput fell at the series' largest node count: there "
        "the model contradicts the data it was fitted to."
    )
    if unvalidated > DEFAULT_MAX_EXTRAPOLATION_UNVALIDATED:
        text += (
            f" (the configuration's plan.max_extrapolation_unvalidated = {_factor(asked)}, "
            f"beyond the default {_factor(DEFAULT_MAX_EXTRAPOLATION_UNVALIDATED)}x: these "
            "predictions go further than any check of the model)"
        )
    return text + "." + contradicts


PREDICTED_FAMILIES = {"throughput", "speedup", "efficiency"}
# The telemetry family's caption for a hardware entry whose device is known (figure_layout's
# `devices`): only what that device's figure shows, no rule for the other kind.
TELEMETRY_CAPTIONS = {
    "cuda": "Device utilisation during the timed window against node count (dlscale.telemetry): "
    "GPU utilisation (NVML, the rank's own board); solid: mean over the cell's ranks, dotted: its "
    "lowest rank (a straggler shows here); median over repetitions; one panel per model and "
    "batch policy.",
    "cpu": "Device utilisation during the timed window against node count (dlscale.telemetry): "
    "the rank process's CPU utilisation (% of one core); solid: mean over the cell's ranks, "
    "dotted: its lowest rank (a straggler shows here); median over repetitions; one panel per "
    "model and batch policy.",
}
FAMILY_CAPTIONS = {
    "throughput": "Training throughput (samples/s summed over all ranks) against node count; "
    "one panel per model and batch policy.",
    "speedup": "Speedup against the smallest node count of each group; dashed: ideal; one panel "
    "per model and batch policy.",
    "efficiency": "Scaling efficiency (speedup over the ratio of world sizes); dashed: ideal; one "
    "panel per model and batch policy.",
    "frameworks": "Frameworks at equal hardware: throughput per model at the largest node count, "
    "points on a logarithmic axis (median over repetitions, error bars its interval); "
    "one panel per batch policy.",
    "breakdown": "Median step time split into compute (solid: the same step without gradient "
    "allreduce) and communication (hatched: the rest) per node count; grey: the framework "
    "exposes no compute-only step; one panel per model and batch policy.",
    "telemetry": "Device utilisation during the timed window against node count (dlscale."
    "telemetry): GPU utilisation (NVML, the rank's own board) on GPU hardware, else the rank "
    "process's CPU utilisation (% of one core); solid: mean over the cell's ranks, dotted: its "
    "lowest rank (a straggler shows here); median over repetitions; one panel per model and "
    "batch policy.",
    "mfu": "Model FLOPs utilisation against node count (dlscale.analysis.mfu): model FLOPs "
    "per sample "
    "(forward + backward, counted once per model by PyTorch's FLOP counter) x samples/s / world "
    "size, over the dense peak of the hardware entry at the cell's precision (hardware file "
    "peak_tflops, sparse peaks refused); where the hardware has no peak (unknown peak) the "
    "achieved TFLOP/s per device instead; median over repetitions; frameworks that count no "
    "FLOPs are absent; one panel per model and batch policy.",
    "memory": "Memory per rank against node count, per parallelism (docs/pages/parallelism.md): "
    "solid: the bytes of parameters, gradients and optimizer state the largest rank holds (a "
    "shard's under fsdp, hsdp and tensor parallel); dotted: its peak memory (peak allocated "
    "device memory on GPUs, the peak resident set on CPUs); MiB on a log axis, median over "
    "repetitions; a "
    "series per framework, precision and parallelism; one panel per model and batch policy.",
}
WITH_CI = {"throughput", "speedup", "efficiency", "frameworks"}
# A figure file's name in its hardware folder, without .pdf: {family} or {family}-{part}
# (figure_layout); the `figure` wildcard of the one figure rule (rules/figures.smk).
FIGURE_NAME_PATTERN = "(" + "|".join(map(re.escape, FAMILIES)) + ")(-[0-9]+)?"

MAX_PANELS = 12  # panels per figure file
MAX_SERIES = 8  # lines (or bars per group) per panel; reference lines (ideal) not counted
MAX_COLS = 4  # panel columns; more than 2 make a figure text-wide
TEXT_COLUMNS = 2  # text width = this many column widths

# hardware, framework, model, policy, variant: a series is a framework x variant, the variant
# the precision and, for compiled cells, the mode ("fp32", "bf16 compiled"; variant()).
GroupKey = tuple[str, str, str, str, str]


def variant(precision: str, mode: str, parallelism: str = DEFAULT_PARALLELISM) -> str:
    """The figure series' second part: the precision, with the mode where it is not eager and
    the parallelism where it is not ddp (so an eager ddp study's labels are its precisions)."""
    label = precision if mode == "eager" else f"{precision} {mode}"
    return label if parallelism in (DEFAULT_PARALLELISM, None) else f"{label} {parallelism}"


def with_variant(scaling):
    """The scaling table with its `variant` column (a pandas DataFrame; see variant())."""
    out = scaling.copy()
    strategies = out["parallelism"] if "parallelism" in out else [DEFAULT_PARALLELISM] * len(out)
    out["variant"] = [
        variant(p, m, s) for p, m, s in zip(out["precision"], out["mode"], strategies)
    ]
    return out


def _unique(values: Iterable) -> list:
    return list(dict.fromkeys(values))


def _chunks(items: list, size: int) -> list[list]:
    """Contiguous chunks of at most `size` items, as equal in length as possible."""
    if not items:
        return []
    n = -(-len(items) // size)
    q, r = divmod(len(items), n)
    out, start = [], 0
    for k in range(n):
        stop = start + q + (k < r)
        out.append(items[start:stop])
        start = stop
    return out


def models_per_page(n_policies: int) -> int:
    return max(1, MAX_PANELS // max(1, n_policies))


def grid_columns(n_panels: int) -> int:
    """1 panel: 1 column; 2-4 panels: 2 columns; more: MAX_COLS columns (at most 3 rows)."""
    return 1 if n_panels <= 1 else 2 if n_panels <= 4 else MAX_COLS


def figure_file_bound(groups: Iterable[GroupKey]) -> int:
    """The number of figure files `figure_layout` may write for these planned groups (exact
    without exclusions): sum over hardware of
    len(FAMILIES) x ceil(models / floor(MAX_PANELS / policies)) x ceil(series / MAX_SERIES)."""
    groups = _unique(tuple(g) for g in groups)
    total = 0
    for hw in _unique(g[0] for g in groups):
        part = [g for g in groups if g[0] == hw]
        models = len(_unique(g[2] for g in part))
        policies = len(_unique(g[3] for g in part))
        series = len(_unique((g[1], g[4]) for g in part))
        total += len(FAMILIES) * -(-models // models_per_page(policies)) * -(-series // MAX_SERIES)
    return total


def figure_layout(
    groups: Iterable[GroupKey],
    column_width_in: float,
    plan: dict | None = None,
    devices: dict[str, str] | None = None,
) -> list[dict]:
    """Every figure file of a study, from its planned (hardware, framework, model, policy,
    precision) groups, in the order they first appear (the configuration's axis order).

    Each entry is plain data (a Snakemake param and the report's figure list): file (relative to
    the figures folder), family, hardware, part/parts, models, policies, panels ([model, policy]
    or [policy]), series ([framework, precision]), hue order (frameworks, precisions of the whole
    study, so a framework has one colour in every file), ncols, width_in, caption. `plan`: the
    study's plan settings, for the scaling families' captions (predicted_caption); `devices`:
    each hardware key's device (cpu, cuda), for the captions that differ by device."""
    groups = _unique(tuple(g) for g in groups)
    predicted = predicted_caption(plan)
    frameworks = _unique(g[1] for g in groups)
    precisions = _unique(g[4] for g in groups)
    specs = []
    for hw in _unique(g[0] for g in groups):
        part = [g for g in groups if g[0] == hw]
        policies = _unique(g[3] for g in part)
        pages = []
        for models in _chunks(_unique(g[2] for g in part), models_per_page(len(policies))):
            for series in _chunks(_unique((g[1], g[4]) for g in part), MAX_SERIES):
                on_page = [g for g in part if g[2] in models and (g[1], g[4]) in series]
                if on_page:
                    pages.append((models, series, on_page))
        for family in FAMILIES:
            for k, (models, series, on_page) in enumerate(pages, 1):
                present = {(g[2], g[3]) for g in on_page}
                if family == "frameworks":
                    panels = [[p] for p in policies if any(g[3] == p for g in on_page)]
                    ncols = 1
                    wide = len(models) * len(series) > 12
                else:
                    panels = [[m, p] for m in models for p in policies if (m, p) in present]
                    ncols = grid_columns(len(panels))
                    wide = ncols > 2
                name = family if len(pages) == 1 else f"{family}-{k}"
                page_frameworks = _unique(s[0] for s in series)
                caption = (
                    _family_caption(family, (devices or {}).get(hw))
                    + (predicted if family in PREDICTED_FAMILIES else "")
                    + f" Hardware {hw}; "
                    f"models: {', '.join(models)}; frameworks: {', '.join(page_frameworks)}"
                    + (f" (part {k} of {len(pages)})" if len(pages) > 1 else "")
                    + "."
                )
                specs.append(
                    {
                        "file": f"{hw}/{name}.pdf",
                        "family": family,
                        "hardware": hw,
                        "part": k,
                        "parts": len(pages),
                        "models": list(models),
                        "policies": [p for p in policies if any(g[3] == p for g in on_page)],
                        "panels": panels,
                        "series": [list(s) for s in series],
                        "frameworks": frameworks,
                        "precisions": precisions,
                        "ncols": ncols,
                        "width_in": column_width_in * (TEXT_COLUMNS if wide else 1),
                        "caption": caption,
                        "ci": family in WITH_CI,
                        # the hardware's device (cpu, cuda; None: not given): the x label of a
                        # figure over world sizes (GPUs or ranks; dlscale.outputs.plotting)
                        "device": (devices or {}).get(hw),
                    }
                )
    return specs


def _family_caption(family: str, device: str | None) -> str:
    if family == "telemetry" and device in TELEMETRY_CAPTIONS:
        return TELEMETRY_CAPTIONS[device]
    return FAMILY_CAPTIONS[family]


# ---- the convergence workload's figures ------------------------------------------------------
# Per hardware key, in `{hardware}/convergence/`: time-to-accuracy against node count (dashed:
# ideal), epochs-to-accuracy against global batch, and validation-accuracy curves per node
# count; one panel per model x batch policy (curves: x series too), at most MAX_PANELS panels
# per file (more: numbered parts, as the throughput families).
CONVERGENCE_FAMILIES = ["time_to_accuracy", "epochs_to_accuracy", "accuracy_curves"]
CONVERGENCE_DIR = "convergence"
NOT_REACHED = (
    " Open markers with an arrow: the target was not reached within the epoch cap (drawn at "
    "the time or epochs run, a lower bound)."
)
CONVERGENCE_CAPTIONS = {
    "time_to_accuracy": "Time to the target validation accuracy (training time only; start-up, "
    "compilation and validation excluded) against node count; dashed: ideal (the smallest "
    "node count's time divided by the ratio of world sizes); one panel per model and batch "
    "policy." + NOT_REACHED,
    "epochs_to_accuracy": "Epochs to the target validation accuracy against the global batch, "
    "each point labelled with its node count (under strong scaling the node counts share one "
    "global batch); one panel per model and batch policy." + NOT_REACHED,
    "accuracy_curves": "Validation accuracy after each epoch, one line per node count and "
    "repetition; dashed: the target; one panel per model, batch policy and framework.",
}
CONVERGENCE_FIGURE_NAME_PATTERN = (
    "(" + "|".join(map(re.escape, CONVERGENCE_FAMILIES)) + ")(-[0-9]+)?"
)


def convergence_layout(groups: Iterable[GroupKey], column_width_in: float) -> list[dict]:
    """Every convergence figure file of a study from its planned convergence groups (hardware,
    framework, model, policy, variant): the same entry shape as figure_layout's, `file`
    relative to the figures folder (`{hardware}/convergence/{family}.pdf`). Panels are
    [model, policy] (curves: [model, policy, framework, variant]); series [framework,
    variant]."""
    groups = _unique(tuple(g) for g in groups)
    frameworks = _unique(g[1] for g in groups)
    precisions = _unique(g[4] for g in groups)
    specs = []
    for hw in _unique(g[0] for g in groups):
        part = [g for g in groups if g[0] == hw]
        series = [list(s) for s in _unique((g[1], g[4]) for g in part)]
        pairs = _unique((g[2], g[3]) for g in part)
        for family in CONVERGENCE_FAMILIES:
            if family == "accuracy_curves":
                panels = [[g[2], g[3], g[1], g[4]] for g in part]
            else:
                panels = [list(p) for p in pairs]
            pages = [panels[i : i + MAX_PANELS] for i in range(0, len(panels), MAX_PANELS)]
            for k, page in enumerate(pages, 1):
                name = family if len(pages) == 1 else f"{family}-{k}"
                ncols = grid_columns(len(page))
                models = _unique(p[0] for p in page)
                caption = (
                    f"{CONVERGENCE_CAPTIONS[family]} Hardware {hw}; models: "
                    f"{', '.join(models)}; frameworks: {', '.join(_unique(s[0] for s in series))}"
                    + (f" (part {k} of {len(pages)})" if len(pages) > 1 else "")
                    + "."
                )
                specs.append(
                    {
                        "file": f"{hw}/{CONVERGENCE_DIR}/{name}.pdf",
                        "family": family,
                        "hardware": hw,
                        "part": k,
                        "parts": len(pages),
                        "models": models,
                        "policies": _unique(p[1] for p in page),
                        "panels": page,
                        "series": series,
                        "frameworks": frameworks,
                        "precisions": precisions,
                        "ncols": ncols,
                        "width_in": column_width_in * (TEXT_COLUMNS if ncols > 2 else 1),
                        "caption": caption,
                        "ci": family == "time_to_accuracy",
                    }
                )
    return specs

"""A scaling model per series, fitted from the measured cells; predictions with intervals for
unmeasured node counts; leave-one-node-count-out validation.

A series is a scaling group (dlscale.analysis.stats.GROUP: hardware, framework, model, policy,
precision, mode, parallelism): one series per parallelism strategy (ddp, fsdp, hsdp, tp, fsdp+tp,
pp), never one fitted across strategies; a cells table written before the axis is all `ddp`
(dlscale.analysis.stats.with_axes), so a ddp-only study gives the same series as before. p is its
world size (nodes x ranks_per_node), b(p) its per-rank batch. The measured
effective step time is tau(p) = p * b(p) / throughput(p) (the cell's summed throughput).

Communication-aware model (kind "communication"), from what a cell measures:

    tau(p) = t_compute(b, p) + alpha * log2(p) + beta * G * (p - 1) / p

t_compute = c0 + c1 * b + c2 * log2(p) is fitted (non-negative least squares) to the compute-only
step times of the breakdown (`compute_seconds_median`; c1 only where the series has several
per-rank batches, i.e. strong scaling; c2, the ranks' contention for a shared host such as the
local profile's simulated nodes, only where the node counts leave a degree of freedom); G is
the gradient size in bytes (the model's parameter count x 4: float32 gradients); alpha (latency
per tree level) and beta (seconds per byte of ring traffic)
are fitted, non-negative, to the communication times tau - t_compute at p > 1. With a single
p > 1 they are not both identifiable from the step times: beta is then taken from the allreduce
probe's bus bandwidth (ring allreduce of G bytes takes G * 2(p-1)/p / busbw, so beta = 2 / busbw)
and alpha from the rest. At p = 1 both terms vanish (the plain program has no allreduce).

Where that is not identifiable (no compute-only step, or no bandwidth with one p > 1), an
empirical law of throughput: the Universal Scalability Law X(p) = lam p / (1 + sigma (p-1) +
kappa p (p-1)) with 3 or more node counts, Amdahl's law (kappa = 0) with 2 (parameters >= 0;
non-negative least squares on the law's linear inverse, relative residuals; _fit_empirical).
One node count fits nothing.

Uncertainty: the repetitions of each node count are resampled on their own and the model refitted
(dlscale.analysis.stats.bootstrap_interval: a percentile CI where every node count has n >= 6, the
min-max
over resamples for fewer, none for one repetition). These intervals carry the measurement noise
through the model, not the model's own error: that is what the leave-one-out error measures.

Validation (`leave_one_out`): each measured node count in turn is left out, the model (kind chosen
by the same rules) refitted to the others and the left-out median throughput predicted; the
relative errors' median and maximum are reported per series. A series needs at least
MIN_NODE_COUNTS_LOO node counts to be validated; shorter series are reported as too short.

What a prediction may claim (`model_tables`, `predict`):

- the interval of every predicted value is the bootstrap interval widened by the series' largest
  leave-one-out error e (the model's own error, measured where the series is validated): with
  |predicted / measured - 1| <= e, the measured value lies in [pred / (1 + e), pred / (1 - e)],
  so the bounds become low / (1 + e) and high / (1 - e) (no upper bound for e >= 1); where the
  repetitions give no interval (n = 1) the band is the model error's alone. A series that is
  not validated keeps the repetitions' noise only, and its rows say so (`interval_spans`);
- predictions reach at most `max_extrapolation` (plan.max_extrapolation, default 8) times a
  validated series' largest measured node count, and at most `max_extrapolation_unvalidated`
  (plan.max_extrapolation_unvalidated, default 2) times an unvalidated one's: a model that
  cannot be checked is not drawn or planned far beyond its data unless the configuration says
  so (and the figures' captions then say that it did:
  dlscale.outputs.figure_layout.predicted_caption).

Memory per rank (`memory_per_rank`, the planner's fit check): where a node count was measured,
the median over its repetitions of the cell's peak memory per rank (MEMORY_MEASURES: reserved,
else allocated device memory, else the process's peak RSS on a CPU). Elsewhere it is predicted
from the nearest measured node count m (in log2 nodes; ties: the smaller): the state bytes
(parameters, gradients, optimizer state: state_bytes_per_rank_max) scale as 1 / d with d the
strategy's sharding degree (dp_shard x pp stages of dlscale.registry.parallel_dims.ParallelDims:
world size for fsdp and fsdp+tp, ranks per node for hsdp, 1 for ddp and tp, the stages for pp),
and the rest of the peak (activations, buffers, allocator slack) is held at m's, scaled up by
the per-rank batch where that grows (strong scaling towards fewer ranks), never down:

    memory(n) = (peak(m) - state(m)) * max(1, b(n) / b(m)) + state(m) * d(m) / d(n)

A series without state bytes holds its whole peak constant that way. The predictions say which
rows were measured and which predicted (`memory_from`). The series and their memory per rank are
built in dlscale.analysis.scaling_series.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from scipy.optimize import OptimizeWarning, curve_fit, nnls

from dlscale.analysis.scaling_series import SERIES_MEASURES, Series, memory_per_rank, series_of
from dlscale.analysis.stats import GROUP, NONE, RANGE, bootstrap_interval

COMMUNICATION, USL, AMDAHL = "communication", "usl", "amdahl"
# Bootstrap resamples per series (each refits the model): enough for a 95 % percentile interval
# (its bounds are the ~5th and ~195th of 199 sorted refits) at a few ms per refit.
MODEL_RESAMPLES = 199
MIN_NODE_COUNTS_LOO = 3  # leaving one out must leave two: enough for Amdahl or alpha + beta
# Node counts predicted beyond the largest measured one: at most this factor (plan and figures)
# for a series validated by leave-one-node-count-out, and at most the second for one that is not
# (plan.max_extrapolation, plan.max_extrapolation_unvalidated; docs/pages/configuration.md).
DEFAULT_MAX_EXTRAPOLATION = 8
DEFAULT_MAX_EXTRAPOLATION_UNVALIDATED = 2
VALIDATED = "validated"

MODEL_METHOD = (
    "per series, step time tau(p) = t_compute + alpha log2 p + beta G (p-1)/p with t_compute = "
    "c0 + c1 b + c2 log2 p (b: per-rank batch, c2: contention for a shared host), fitted to the "
    "compute-only step, gradient bytes G and allreduce bandwidth where measured; else the "
    "Universal Scalability Law (3+ node counts) or Amdahl's law (2); intervals: bootstrap over "
    "repetitions (measurement noise), widened by the series' largest leave-one-out error where "
    "the series is validated (noise only where it is not)"
)


@dataclass(frozen=True)
class ScalingModel:
    """A fitted model of one series: kind and parameters; `throughput(p, b)` at world size p
    and per-rank batch b (samples/s summed over ranks)."""

    kind: str
    params: dict = field(default_factory=dict)

    def throughput(self, p, b):
        p = np.asarray(p, dtype=float)
        b = np.asarray(b, dtype=float)
        k = self.params
        if self.kind == COMMUNICATION:
            tau = (
                k["c0"]
                + k["c1"] * b
                + k.get("c2", 0.0) * np.log2(p)
                + k["alpha"] * np.log2(p)
                + k["beta"] * k["gradient_bytes"] * (p - 1) / p
            )
            return p * b / tau
        return k["lam"] * p / (1 + k["sigma"] * (p - 1) + k.get("kappa", 0.0) * p * (p - 1))

    def describe(self) -> str:
        k = self.params
        if self.kind == COMMUNICATION:
            return (
                f"c0={k['c0']:.3g}s c1={k['c1']:.3g}s/sample c2={k.get('c2', 0.0):.3g}s "
                f"alpha={k['alpha']:.3g}s "
                f"beta={k['beta']:.3g}s/B ({k['beta_from']})"
            )
        extra = f" kappa={k['kappa']:.3g}" if self.kind == USL else ""
        return f"lam={k['lam']:.4g}/s sigma={k['sigma']:.3g}{extra}"


class NotIdentifiable(ValueError):
    pass


def _usl(p, lam, sigma, kappa):
    return lam * p / (1 + sigma * (p - 1) + kappa * p * (p - 1))


def _amdahl(p, lam, sigma):
    return lam * p / (1 + sigma * (p - 1))


def _fit_empirical(pts: dict, start: ScalingModel | None = None) -> ScalingModel:
    """USL (3+ node counts) or Amdahl (2). The USL is linear in its inverse: p / X(p) =
    a + b (p - 1) + c p (p - 1) with lam = 1/a, sigma = b/a, kappa = c/a, so it is fitted by
    non-negative least squares on the relative residuals (rows divided by p / X): exact, fast
    enough for the bootstrap's refits, and weighted like the relative errors it is judged by.
    scipy's curve_fit is the fallback where the intercept a comes out 0."""
    p, x = pts["p"], pts["throughput"]
    if len(p) < 2:
        raise NotIdentifiable("one node count: nothing to fit")
    y = p / x
    columns = [np.ones_like(p), p - 1] + ([p * (p - 1)] if len(p) >= 3 else [])
    coef, _ = nnls(np.column_stack(columns) / y[:, None], np.ones_like(y))
    kind = USL if len(p) >= 3 else AMDAHL
    if coef[0] > 0:
        a, b = coef[0], coef[1]
        c = coef[2] if len(coef) == 3 else 0.0
        return ScalingModel(kind, {"lam": 1 / a, "sigma": b / a, "kappa": c / a})
    return _curve_fit_empirical(p, x, start)


def _curve_fit_empirical(p, x, start: ScalingModel | None) -> ScalingModel:
    lam0 = float(x[np.argmin(p)] / p.min())
    k0 = start.params if start is not None and start.kind in (USL, AMDAHL) else {}
    # a start from the full data's fit (bootstrap resamples) converges in fewer steps
    lam0, sigma0, kappa0 = k0.get("lam", lam0), k0.get("sigma", 0.01), k0.get("kappa", 1e-4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", OptimizeWarning)
        if len(p) >= 3:
            (lam, sigma, kappa), _ = curve_fit(
                _usl,
                p,
                x,
                p0=(lam0, sigma0, max(kappa0, 1e-9)),
                bounds=(0, np.inf),
                maxfev=5000,
            )
            return ScalingModel(USL, {"lam": lam, "sigma": sigma, "kappa": kappa})
        (lam, sigma), _ = curve_fit(_amdahl, p, x, p0=(lam0, sigma0), bounds=(0, np.inf))
    return ScalingModel(AMDAHL, {"lam": lam, "sigma": sigma, "kappa": 0.0})


def _fit_communication(pts: dict, grad_bytes: float) -> ScalingModel:
    p, b, compute = pts["p"], pts["b"], pts["compute"]
    if np.isnan(compute).any() or not np.isfinite(grad_bytes):
        raise NotIdentifiable("no compute-only step time")
    tau = p * b / pts["throughput"]
    # t_compute = c0 + c1 b + c2 log2 p: a column only where the points identify it (b varies
    # under strong scaling; log2 p is the ranks' contention for a shared host, e.g. the local
    # profile's simulated nodes, and fits to ~0 where ranks do not share)
    columns = {"c0": np.ones_like(b)}
    if len(np.unique(b)) > 1:
        columns["c1"] = b
    if len(np.unique(p)) > len(columns):
        columns["c2"] = np.log2(p)
    coef, _ = nnls(np.column_stack(list(columns.values())), compute)
    c = {"c0": 0.0, "c1": 0.0, "c2": 0.0, **dict(zip(columns, map(float, coef)))}
    multi = p > 1
    comm = tau[multi] - compute[multi]
    if len(np.unique(p[multi])) >= 2:
        a = np.column_stack([np.log2(p[multi]), grad_bytes * (p[multi] - 1) / p[multi]])
        (alpha, beta), _ = nnls(a, comm)
        beta_from = "fitted"
    elif multi.any():
        busbw = pts["busbw"][multi] * 1e9
        if not np.isfinite(busbw).all() or (busbw <= 0).any():
            raise NotIdentifiable("one node count above 1 and no allreduce bandwidth")
        beta = float(2 / np.median(busbw))
        ring = beta * grad_bytes * (p[multi] - 1) / p[multi]
        alpha = max(0.0, float(np.mean((comm - ring) / np.log2(p[multi]))))
        beta_from = "allreduce probe"
    else:
        raise NotIdentifiable("no node count above 1")
    return ScalingModel(
        COMMUNICATION,
        {
            **c,
            "alpha": float(alpha),
            "beta": float(beta),
            "gradient_bytes": grad_bytes,
            "beta_from": beta_from,
        },
    )


def fit(pts: dict, grad_bytes: float, start: ScalingModel | None = None) -> ScalingModel:
    """The model of one series from its per-node-count points (arrays p, b, throughput,
    compute, busbw: medians over repetitions): communication-aware where identifiable, else
    USL or Amdahl."""
    try:
        return _fit_communication(pts, grad_bytes)
    except NotIdentifiable:
        return _fit_empirical(pts, start)


# ---- validation and prediction of a series (dlscale.analysis.scaling_series) -----------------


def leave_one_out(series: Series) -> dict:
    """Leave-one-node-count-out prediction errors of a series: status ("validated" or why not),
    folds, the median and maximum relative error |predicted / measured - 1| of the left-out
    node counts' median throughput, and the kinds the folds fitted."""
    k = len(series.nodes)
    if k < MIN_NODE_COUNTS_LOO:
        return {
            "loo_status": f"too short to validate ({k} node count{'s' if k != 1 else ''}; "
            f"{MIN_NODE_COUNTS_LOO} needed)",
            "loo_folds": 0,
            "loo_median_error": np.nan,
            "loo_max_error": np.nan,
            "loo_errors": "",
        }
    pts = series.points()
    errors = []
    for i in range(k):
        model = fit(series.points(drop=i), series.grad_bytes)
        pred = float(model.throughput(pts["p"][i], pts["b"][i]))
        errors.append(pred / pts["throughput"][i] - 1)
    abs_err = np.abs(errors)
    return {
        "loo_status": VALIDATED,
        "loo_folds": k,
        "loo_median_error": float(np.median(abs_err)),
        "loo_max_error": float(abs_err.max()),
        "loo_errors": " ".join(f"n{n}:{e:+.3f}" for n, e in zip(series.nodes, errors)),
    }


def default_predict_nodes(measured_max: int, max_extrapolation: float) -> list[int]:
    """Doublings of the largest measured node count up to max_extrapolation times it."""
    out, n = [], measured_max * 2
    while n <= measured_max * max_extrapolation:
        out.append(n)
        n *= 2
    return out


def is_validated(loo: dict | None) -> bool:
    """Whether a leave_one_out result validates its series (a finite error over its folds)."""
    return bool(
        loo and loo.get("loo_status") == VALIDATED and np.isfinite(loo.get("loo_max_error", np.nan))
    )


def extrapolation_cap(
    loo: dict | None,
    max_extrapolation: float = DEFAULT_MAX_EXTRAPOLATION,
    max_extrapolation_unvalidated: float = DEFAULT_MAX_EXTRAPOLATION_UNVALIDATED,
) -> float:
    """The factor beyond its largest measured node count a series may be predicted at:
    max_extrapolation where validated, else the smaller of the two."""
    if is_validated(loo):
        return float(max_extrapolation)
    return float(min(max_extrapolation, max_extrapolation_unvalidated))


def widen(low, high, error: float):
    """A bootstrap interval (low, high) widened by a relative model error e (leave-one-out:
    |predicted / measured - 1| <= e): low / (1 + e), high / (1 - e), no upper bound for e >= 1.
    NaN error: unchanged."""
    low, high = np.asarray(low, dtype=float), np.asarray(high, dtype=float)
    if not np.isfinite(error):
        return low, high
    upper = high / (1 - error) if error < 1 else np.full_like(high, np.inf)
    return low / (1 + error), upper


def interval_spans(kind: str, loo: dict | None) -> str:
    """What a prediction's interval spans, in words (the predictions table's interval_spans)."""
    noise = {
        NONE: "no repetition noise (n = 1)",
        RANGE: "repetition noise (min-max of refits)",
    }.get(kind, "repetition noise (95 % bootstrap CI)")
    if is_validated(loo):
        return f"{noise} + model error (leave-one-out max {loo['loo_max_error']:.1%})"
    why = (loo or {}).get("loo_status") or "no leave-one-out result"
    return f"{noise} only; not validated: {why}; model error unknown"


def predict(
    series: Series, nodes, model: ScalingModel | None = None, loo: dict | None = None
) -> pd.DataFrame:
    """Predicted throughput, speedup and efficiency at `nodes` with their bootstrap intervals
    (over the repetitions; kind as dlscale.analysis.stats.bootstrap_interval), widened by the
    series'
    largest leave-one-out error where `loo` (leave_one_out's result) validates the series
    (where the repetitions give no interval, the model error's band alone)."""
    nodes = np.asarray(sorted(set(int(n) for n in nodes)), dtype=float)
    model = model or fit(series.points(), series.grad_bytes)
    p, b = nodes * series.ranks_per_node, series.batch(nodes)
    base = series.reps[0][:, list(SERIES_MEASURES).index("throughput")]
    base_p = series.nodes[0] * series.ranks_per_node

    def statistic(*idx):
        pts = series.points(list(idx))
        try:
            m = fit(pts, series.grad_bytes, start=model)
        except (NotIdentifiable, RuntimeError, ValueError):
            return np.full(2 * len(nodes), np.nan)
        x = m.throughput(p, b)
        return np.concatenate([x, x / pts["throughput"][0]])

    x = model.throughput(p, b)
    memory, memory_from = memory_per_rank(series, nodes)
    low, high, kind = bootstrap_interval(
        [np.arange(len(r)) for r in series.reps], statistic, n_resamples=MODEL_RESAMPLES
    )
    half = len(nodes)
    speedup = x / np.median(base)
    scale = p / base_p
    measured_max = max(series.nodes)
    validated = is_validated(loo)
    error = float(loo["loo_max_error"]) if validated else np.nan
    if validated:
        # no noise interval (n = 1): the model error's band around the prediction alone
        est = np.concatenate([x, speedup])
        low = np.where(np.isfinite(low), low, est)
        high = np.where(np.isfinite(high), high, est)
        low, high = widen(low, high, error)
    return pd.DataFrame(
        {
            **dict(zip(GROUP, series.key)),
            "nodes": nodes.astype(int),
            "world_size": p.astype(int),
            "per_rank_batch": b,
            "model_kind": model.kind,
            "measured": np.isin(nodes, series.nodes),
            "extrapolated": nodes > measured_max,
            "measured_max_nodes": measured_max,
            "throughput_samples_per_s_pred": x,
            "throughput_samples_per_s_low": low[:half],
            "throughput_samples_per_s_high": high[:half],
            "speedup_pred": speedup,
            "speedup_low": low[half:],
            "speedup_high": high[half:],
            "scaling_efficiency_pred": speedup / scale,
            "scaling_efficiency_low": low[half:] / scale,
            "scaling_efficiency_high": high[half:] / scale,
            "interval": kind,
            "n_min": min(len(r) for r in series.reps),
            "validated": validated,
            "model_error": error,
            "interval_spans": interval_spans(kind, loo),
            "seq_len": series.seq_len,
            "memory_per_rank_mb": memory,
            "memory_measure": series.memory_measure,
            "memory_from": memory_from,
            "contradicts_measurements": contradicts_measurements(series, nodes, x),
        }
    )


CONTRADICTS = (
    "predicted above every throughput measured in its weak-scaling series although the measured "
    "throughput fell at the series' largest node count: the model contradicts the data it was "
    "fitted to"
)


def contradicts_measurements(series: Series, nodes: np.ndarray, predicted: np.ndarray):
    """Per node count, whether a prediction beyond the measured ones contradicts the series'
    own measurements (CONTRADICTS): under weak scaling the throughput at the largest measured
    node count is below the series' best measured median, yet the model predicts more than
    every measured median. (A weak-scaling series whose throughput still rises is expected to
    be predicted above its measurements: that is no contradiction.)"""
    medians = series.points()["throughput"]
    falling = series.policy == "weak" and len(medians) >= 2 and medians[-1] < np.max(medians)
    return (nodes > max(series.nodes)) & falling & (predicted > np.max(medians))


PREDICTION_COLUMNS = [
    *GROUP,
    "nodes",
    "world_size",
    "per_rank_batch",
    "model_kind",
    "measured",
    "extrapolated",
    "measured_max_nodes",
    *[
        f"{m}_{s}"
        for m in ("throughput_samples_per_s", "speedup", "scaling_efficiency")
        for s in ("pred", "low", "high")
    ],
    "interval",
    "n_min",
    "validated",
    "model_error",
    "interval_spans",
    "seq_len",
    "memory_per_rank_mb",
    "memory_measure",
    "memory_from",
    "contradicts_measurements",
    "max_extrapolation",
]


def model_tables(
    cells: pd.DataFrame,
    predict_nodes: list[int] | None = None,
    max_extrapolation: float = DEFAULT_MAX_EXTRAPOLATION,
    plan_nodes: dict[str, int] | None = None,
    max_extrapolation_unvalidated: float = DEFAULT_MAX_EXTRAPOLATION_UNVALIDATED,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(fits, predictions) for every series of the cells table.

    fits: one row per series: model kind and parameters, node counts, LOO validation, the
    extrapolation factor its predictions were capped at.
    predictions: per series the measured node counts, `predict_nodes` (null: doublings of the
    largest measured count up to the cap) and, for the planner, 1..plan_nodes of the series'
    hardware, every one at most cap x the largest measured count; the cap is max_extrapolation
    for a validated series and min(max_extrapolation, max_extrapolation_unvalidated) for one
    that is not (extrapolation_cap)."""
    fits, preds = [], []
    for s in series_of(cells):
        hw = s.key[GROUP.index("hardware")]
        top = max(s.nodes)
        row = {**dict(zip(GROUP, s.key)), "node_counts": " ".join(map(str, s.nodes))}
        row["reps_min"] = min(len(r) for r in s.reps)
        try:
            model = fit(s.points(), s.grad_bytes)
        except (NotIdentifiable, RuntimeError, ValueError) as exc:
            fits.append({**row, "model_kind": NONE, "params": f"not fitted: {exc}"})
            continue
        try:
            loo = leave_one_out(s)
        except (NotIdentifiable, RuntimeError, ValueError) as exc:
            loo = {"loo_status": f"not validated: a fold could not be fitted ({exc})"}
        factor = extrapolation_cap(loo, max_extrapolation, max_extrapolation_unvalidated)
        cap = int(np.floor(top * factor))
        extra = default_predict_nodes(top, factor) if predict_nodes is None else []
        extra += [n for n in predict_nodes or [] if n <= cap]
        extra += list(range(1, min(cap, (plan_nodes or {}).get(hw, 0)) + 1))
        fits.append(
            {
                **row,
                "model_kind": model.kind,
                "params": model.describe(),
                **{f"param_{k}": v for k, v in model.params.items() if k != "beta_from"},
                **loo,
                "max_extrapolation": factor,
            }
        )
        preds.append(predict(s, [*s.nodes, *extra], model, loo).assign(max_extrapolation=factor))
        fits[-1]["contradicts_measurements"] = bool(preds[-1]["contradicts_measurements"].any())
    fit_cols = [*GROUP, "node_counts", "reps_min", "model_kind", "params"]
    fits_df = pd.DataFrame(fits)
    for c in (
        "loo_status",
        "loo_folds",
        "loo_median_error",
        "loo_max_error",
        "loo_errors",
        "max_extrapolation",
        "contradicts_measurements",
    ):
        if c not in fits_df:
            fits_df[c] = pd.Series(dtype=object)
    fits_df = fits_df.reindex(columns=list(dict.fromkeys([*fit_cols, *fits_df.columns])))
    pred_df = (
        pd.concat(preds, ignore_index=True) if preds else pd.DataFrame(columns=PREDICTION_COLUMNS)
    )
    return fits_df, pred_df


def write_model_tables(
    cells_csv: str,
    fits_csv: str,
    predictions_csv: str,
    predict_nodes: list[int] | None = None,
    max_extrapolation: float = DEFAULT_MAX_EXTRAPOLATION,
    plan_nodes: dict[str, int] | None = None,
    max_extrapolation_unvalidated: float = DEFAULT_MAX_EXTRAPOLATION_UNVALIDATED,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    from pathlib import Path

    fits, preds = model_tables(
        pd.read_csv(cells_csv),
        predict_nodes,
        max_extrapolation,
        plan_nodes,
        max_extrapolation_unvalidated,
    )
    for df, out in ((fits, fits_csv), (preds, predictions_csv)):
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        df.to_csv(out, index=False)
    return fits, preds

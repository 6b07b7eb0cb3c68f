"""A scaling series from the cells table: one (study, hardware, framework, model, policy, precision,
mode, parallelism) group's repetitions per node count, its gradient bytes, and its memory per rank
(measured, or predicted from the nearest measured node count by the strategy's sharding degree;
dlscale.analysis.scaling_model's docstring gives the rule). The scaling model fits and predicts
these series. A series runs over node counts at whole nodes: where a group also measured fewer
ranks per node (config axes.ranks_per_node: 1, 2 GPUs of a node), only its cells of the most ranks
per node are the series (the model predicts node counts, and a partial node is no planning
option); the figures still draw every cell."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from dlscale.analysis.stats import GROUP, with_axes
from dlscale.registry.parallel_dims import ParallelDims, cell_pp_degree
from dlscale.study.cell import DEFAULT_PARALLELISM

GRADIENT_BYTES_PER_PARAM = 4  # float32 gradients (mixed precision keeps float32 parameters)


def gradient_bytes(model: str) -> float:
    """Bytes of one gradient allreduce: the registry's parameter count x 4 (float32)."""
    from dlscale.models import SPECS

    spec = SPECS.get(model)
    return float(spec.param_count * GRADIENT_BYTES_PER_PARAM) if spec else np.nan


SERIES_MEASURES = {
    "b": "per_rank_batch",
    "throughput": "throughput_samples_per_s",
    "compute": "compute_seconds_median",
    "busbw": "allreduce_busbw_gb_per_s",
}


# The peak memory per rank a series is held against a partition's memory, first present first
# (dlscale.analysis.collect.cell_memory: the largest over a cell's ranks, MiB): what the device
# allocator reserved, what tensors took, the older single device figure, the process's RSS (CPU)
MEMORY_MEASURES = (
    "peak_reserved_mb_max",
    "peak_allocated_mb_max",
    "peak_device_memory_mb_max",
    "peak_rss_mb_max",
)


MEASURED = "measured"
# The source of a series' memory per rank where none was measured: its model's state alone
LOWER_BOUND = "lower bound"


@dataclass
class Series:
    """One series' repetitions per node count (`reps[k]`: an array of the repetitions of node
    count nodes[k], one column per SERIES_MEASURES entry); its memory per rank per measured node
    count (`memory[n]`: medians of the peak, MEMORY_MEASURES, and of the state bytes, MiB;
    NaN where not recorded) and its sequence length (NaN for models without one)."""

    key: tuple
    ranks_per_node: int
    policy: str
    global_batch: float
    per_rank_batch: float
    grad_bytes: float
    nodes: list[int]
    reps: list[np.ndarray]
    parallelism: str = DEFAULT_PARALLELISM
    tp_degree: int = 1
    pp_degree: int | None = None
    memory_measure: str | None = None
    memory: dict = field(default_factory=dict)
    seq_len: float = np.nan
    # what its cells train with (cells.csv `optimizer`; absent: SGD, every cell before the
    # choice): the state per parameter where no state bytes were measured (state_mib)
    optimizer: str = "sgd"

    def batch(self, nodes) -> np.ndarray:
        """Per-rank batch at these node counts: fixed under weak, global / p under strong."""
        p = np.asarray(nodes, dtype=float) * self.ranks_per_node
        if self.policy == "strong":
            return self.global_batch / p
        return np.full_like(p, self.per_rank_batch)

    def points(self, idx: list[np.ndarray] | None = None, drop: int | None = None) -> dict:
        """Medians per node count (of the rows `idx[k]` of each node count: a resample), as
        arrays p, b, throughput, compute, busbw; `drop`: leave that node count out."""
        med = np.array(
            [
                np.median(r if idx is None else r[np.asarray(idx[k], dtype=int)], axis=0)
                for k, r in enumerate(self.reps)
            ]
        )
        nodes = np.asarray(self.nodes, dtype=float)
        if drop is not None:
            med, nodes = np.delete(med, drop, axis=0), np.delete(nodes, drop)
        out = {m: med[:, i] for i, m in enumerate(SERIES_MEASURES)}
        out["p"] = nodes * self.ranks_per_node
        return out


def series_of(cells: pd.DataFrame) -> list[Series]:
    """Every series of the cells table (one row per measured cell and repetition)."""
    if cells.empty:
        return []
    data = with_axes(cells).copy()
    for c in SERIES_MEASURES.values():
        data[c] = pd.to_numeric(data[c], errors="coerce") if c in data else np.nan
    for c in (*MEMORY_MEASURES, "state_bytes_per_rank_max", "seq_len"):
        data[c] = pd.to_numeric(data[c], errors="coerce") if c in data else np.nan
    out = []
    for key, part in data.groupby(GROUP, sort=True):
        part = part[part["ranks_per_node"] == part["ranks_per_node"].max()]
        nodes = sorted(int(n) for n in part["nodes"].unique())
        cols = list(SERIES_MEASURES.values())
        reps = [part.loc[part["nodes"] == n, cols].to_numpy(dtype=float) for n in nodes]
        measure = next((m for m in MEMORY_MEASURES if part[m].notna().any()), None)
        memory = {}
        if measure is not None:
            for n in nodes:
                at = part[part["nodes"] == n]
                memory[n] = (
                    _median(at[measure]),
                    _median(at["state_bytes_per_rank_max"]) / 2**20,
                )
        pp = _median(part["pp_degree"]) if "pp_degree" in part else np.nan
        out.append(
            Series(
                key=tuple(key),
                ranks_per_node=int(part["ranks_per_node"].iloc[0]),
                policy=str(key[GROUP.index("policy")]),
                global_batch=float(part["global_batch"].iloc[0]),
                per_rank_batch=float(part["per_rank_batch"].iloc[0]),
                grad_bytes=gradient_bytes(str(key[GROUP.index("model")])),
                nodes=nodes,
                reps=reps,
                parallelism=str(key[GROUP.index("parallelism")]),
                tp_degree=int(_median(part["tp_degree"])) if _has(part, "tp_degree") else 1,
                pp_degree=int(pp) if np.isfinite(pp) else None,
                memory_measure=measure,
                memory=memory,
                seq_len=_median(part["seq_len"]),
                optimizer=_optimizer(part),
            )
        )
    return out


def _optimizer(part: pd.DataFrame) -> str:
    if "optimizer" not in part:
        return "sgd"
    names = part["optimizer"].dropna()
    return str(names.iloc[0]) if len(names) else "sgd"


def state_mib(series: Series, nodes: int) -> float:
    """A series' model state per rank at a node count, MiB: every parameter (the registry's
    count at the series' sequence length) in float32, its float32 gradient, and the optimizer's
    float32 state (dlscale.registry.optimizers: SGD's momentum 4 bytes, AdamW's two moments 8),
    divided by the strategy's sharding degree; NaN for a model the registry does not know."""
    from dlscale.models import DECODER, SPECS, spec_for
    from dlscale.registry.optimizers import OPTIMIZERS

    model = str(series.key[GROUP.index("model")])
    spec = SPECS.get(model)
    if spec is None or series.optimizer not in OPTIMIZERS:
        return np.nan
    seq_len = (
        int(series.seq_len) if spec.family == DECODER and np.isfinite(series.seq_len) else None
    )
    params = spec_for(model, seq_len).param_count
    per_param = 2 * GRADIENT_BYTES_PER_PARAM + OPTIMIZERS[series.optimizer].state_bytes_per_param
    return params * per_param / _series_shard(series, nodes) / 2**20


def _has(part: pd.DataFrame, column: str) -> bool:
    return column in part and pd.to_numeric(part[column], errors="coerce").notna().any()


def _median(values) -> float:
    x = pd.to_numeric(pd.Series(values), errors="coerce").dropna()
    return float(x.median()) if len(x) else np.nan


def shard_degree(
    parallelism: str,
    nodes: int,
    ranks_per_node: int,
    tp_degree: int = 1,
    pp_degree: int | None = None,
) -> float:
    """How many ways a rank's state (parameters, gradients, optimizer state) is split at this
    node count: dp_shard x pp of the strategy's ParallelDims (tensor parallel's degree is fixed
    along a series, so it cancels in the ratios memory_per_rank takes; pp_degree None: all
    ranks); NaN where the strategy's degrees do not fit the node count."""
    world = int(nodes) * int(ranks_per_node)
    try:
        dims = ParallelDims.of(
            parallelism,
            int(nodes),
            int(ranks_per_node),
            int(tp_degree),
            cell_pp_degree(parallelism, world, pp_degree, int(tp_degree)),
        )
    except ValueError:
        return np.nan
    return float(dims.dp_shard * dims.pp)


def _series_shard(series: Series, nodes: int) -> float:
    return shard_degree(
        series.parallelism, nodes, series.ranks_per_node, series.tp_degree, series.pp_degree
    )


def memory_per_rank(series: Series, nodes) -> tuple[np.ndarray, list[str]]:
    """Peak memory per rank (MiB) at these node counts and where each value comes from:
    "measured" (median over the repetitions), "predicted from n=<m>" (the module's rule: its
    state, measured or else the model's with its optimizer, state_mib, scaled by the sharding
    degree), a lower bound (LOWER_BOUND: no memory measured, the model's state alone), or why
    it is unknown."""
    known = {n: v for n, v in series.memory.items() if np.isfinite(v[0])}
    values, sources = [], []
    for n in (int(n) for n in nodes):
        if n in known:
            values.append(known[n][0])
            sources.append(MEASURED)
            continue
        if not known:
            bound = state_mib(series, n)
            values.append(bound)
            sources.append(
                f"{LOWER_BOUND}: the model's state with {series.optimizer} / "
                f"{_series_shard(series, n):g}, no memory measured"
                if np.isfinite(bound)
                else "unknown: no memory per rank measured"
            )
            continue
        ref = min(known, key=lambda m: (abs(np.log2(m) - np.log2(n)), m))
        peak, state = known[ref]
        # no state bytes recorded (files before they were): the model's, with its optimizer
        state = state if np.isfinite(state) else state_mib(series, ref)
        state = state if np.isfinite(state) else 0.0
        d_ref, d_n = _series_shard(series, ref), _series_shard(series, n)
        if not (np.isfinite(d_ref) and np.isfinite(d_n)):
            values.append(np.nan)
            sources.append(f"unknown: no {series.parallelism} degrees at {n} nodes")
            continue
        grow = max(1.0, float(series.batch([n])[0] / series.batch([ref])[0]))
        values.append(max(peak - state, 0.0) * grow + state * d_ref / d_n)
        sources.append(f"predicted from n={ref}")
    return np.asarray(values, dtype=float), sources

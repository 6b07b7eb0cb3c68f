"""A synthetic scaling study of any size, as the collect step would tabulate it (cells.csv,
scaling.csv, status.csv rows), for the plotting and report tests: no metrics files needed."""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd

from dlscale.analysis.stats import GROUP, add_speedup, scaling_summary
from dlscale.models import SPECS, seq_len_of
from dlscale.outputs.figure_layout import variant
from dlscale.registry import frameworks

# 4 hardware x 5 frameworks x 10 models x 2 policies x 8 node counts x 3 repetitions = 9,600 cells
LARGE = {
    "hardware": ["cpu", "v100", "a100", "h100"],
    "framework": frameworks.names(),
    "model": [f"model{i}" for i in range(10)],
    "policy": ["weak", "strong"],
    "precision": ["fp32"],
    "mode": ["eager"],
    "nodes": [1, 2, 4, 8, 16, 32, 64, 128],
    "rep": [1, 2, 3],
}
# the demo study's shape (config/config.yaml) when these tables were first written: its second
# model was then transformer_small (the tests built on it keep it)
DEMO = {
    "hardware": ["cpu"],
    "framework": ["pytorch"],
    "model": ["cnn_small", "transformer_small"],
    "policy": ["weak", "strong"],
    "precision": ["fp32"],
    "mode": ["eager"],
    "nodes": [1, 2],
    "rep": [1, 2],
}
# the shipped demo study's throughput shape now (config/config.yaml: cnn_small and gpt2_tiny)
DEMO_STUDY = {**DEMO, "model": ["cnn_small", "gpt2_tiny"]}


def cells_table(axes: dict, seed: int = 0) -> pd.DataFrame:
    """One row per cell with the cells.csv columns the statistics and figures read."""
    rng = np.random.default_rng(seed)
    rows = []
    for hw, fw, model, policy, prec, mode, parallelism, nodes, rep in itertools.product(
        *(axes.get(k, ["ddp"]) for k in [*GROUP, "nodes", "rep"])
    ):
        base = 100.0 * (1 + axes["model"].index(model)) * (1 + 0.3 * axes["framework"].index(fw))
        efficiency = 0.95 ** np.log2(nodes) * (0.9 if policy == "strong" else 1.0)
        throughput = base * nodes * efficiency * rng.normal(1.0, 0.03)
        step = 16 / (throughput / nodes)
        rows.append(
            {
                "study": "synthetic",
                "hardware": hw,
                "framework": fw,
                "model": model,
                "policy": policy,
                "precision": prec,
                "mode": mode,
                "parallelism": parallelism,
                "nodes": nodes,
                "rep": rep,
                "world_size": nodes,
                "ranks_per_node": 1,
                "per_rank_batch": 16,
                "global_batch": 16 * nodes,
                "throughput_samples_per_s": throughput,
                "step_seconds_median": step,
                "compute_seconds_median": (
                    None if fw == "mxnet" else step * (0.9 - 0.05 * np.log2(nodes))
                ),
                "comm_fraction": 0.1,
                "allreduce_busbw_gb_per_s": 1.0,
                "joules_per_sample": None,
                "peak_rss_mb_max": 100.0,
                # memory per rank (the memory figure): a shard of the state under fsdp
                "state_bytes_per_rank_max": 3 * 4e6 / (nodes if parallelism == "fsdp" else 1),
                "peak_allocated_mb_max": None if hw == "cpu" else 900.0,
                # telemetry (dlscale.rank.telemetry): GPU utilisation on GPU hardware, else CPU
                "gpu_util_pct_mean": None if hw == "cpu" else 95.0 * efficiency,
                "gpu_util_pct_rank_min": None if hw == "cpu" else 90.0 * efficiency,
                "cpu_util_pct_mean": 98.0,
                "cpu_util_pct_rank_min": 96.0,
                # model FLOPs (dlscale.analysis.mfu): 1 GFLOP per sample; a dense peak on GPUs only
                "achieved_tflops_per_device": 1e-3 * throughput / nodes,
                "mfu": None if hw == "cpu" else 0.4 * efficiency,
                # tokens (dlscale.analysis.mfu.cell_columns): the registry's sequence length
                "seq_len": seq_len_of(SPECS[model]) if model in SPECS else None,
                "competing": False,
                "straggler": False,
            }
        )
    return add_speedup(pd.DataFrame(rows))


def with_memory(
    cells: pd.DataFrame, rest_mib: float, state_mib: float, speed: dict | None = None
) -> pd.DataFrame:
    """The cells with a peak memory per rank of rest + state / d MiB (peak_reserved_mb_max and
    peak_allocated_mb_max) and state bytes of state / d (d: the world size under fsdp, else 1:
    one rank per node), and their throughput times speed[parallelism] (default 1)."""
    shard = np.where(cells["parallelism"] == "fsdp", cells["world_size"], 1).astype(float)
    factor = cells["parallelism"].map(lambda s: (speed or {}).get(s, 1.0)).astype(float)
    return cells.assign(
        state_bytes_per_rank_max=state_mib * 2**20 / shard,
        peak_allocated_mb_max=rest_mib + state_mib / shard,
        peak_reserved_mb_max=rest_mib + state_mib / shard,
        throughput_samples_per_s=cells["throughput_samples_per_s"] * factor,
    )


def study_tables(axes: dict) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """(cells, scaling, status): every planned cell measured (status ok)."""
    cells = cells_table(axes)
    status = cells[[*GROUP, "nodes", "rep"]].assign(status="ok")
    return cells, scaling_summary(cells), status


def groups(axes: dict) -> list[tuple]:
    """The figure layout's groups (dlscale.outputs.figure_layout.GroupKey) of a study with these
    axes."""
    return [
        (hw, fw, model, policy, variant(prec, mode, parallelism))
        for hw, fw, model, policy, prec, mode, parallelism in itertools.product(
            *(axes.get(k, ["ddp"]) for k in GROUP)
        )
    ]

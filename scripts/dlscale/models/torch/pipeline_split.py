"""Balanced pipeline stages of a decoder- or encoder-shaped model: its pieces in order (the
embedding, each layer, the head), each weighed by its forward FLOPs per token, cut into
contiguous stages whose heaviest is as light as it can be.

The weights follow the MFU convention (docs/pages/measurement.md; torchtitan's count): a
matrix multiply costs 2 FLOPs per parameter per token, attention adds 4·d·S per layer (the
scores and the weighted values, forward), and an embedding is a lookup (0). The head (final
norm and output projection: 2·d·V) is counted at its cost, so the last stage of a decoder with a
large vocabulary holds fewer layers, or none: llama3_debug's head (d 64, V 2048) weighs 2.3
layers, and Llama 3 8B's (d 4096, V 128256) 2.4. torchtitan counts the embedding and the head as
one layer each by default (pipeline_parallel_first/last_stage_less_layers); counting by FLOPs
balances the step's time, which the pipeline's slowest stage sets. Memory is not balanced by
this: the first stage holds the embedding's table as well (each stage's parameters are in the
rank's record).

Pure arithmetic over torch modules; every stage of every rank computes the same split.
"""

from __future__ import annotations

from torch import nn


def forward_flops(module: nn.Module | None, attention: float = 0.0) -> float:
    """Forward FLOPs per token of `module`: 2 per parameter outside embedding tables, plus
    `attention` (4·d·S for a layer with self-attention); None: 0."""
    if module is None:
        return 0.0
    embedded = {
        id(p) for m in module.modules() if isinstance(m, nn.Embedding) for p in m.parameters()
    }
    matmul = sum(p.numel() for p in module.parameters() if id(p) not in embedded)
    return 2.0 * matmul + attention


def balanced_bounds(costs: list[float], stages: int) -> list[tuple[int, int]]:
    """Cut the pieces `costs` (in order) into `stages` contiguous, non-empty runs whose largest
    total is the least possible (the linear partition problem, by dynamic programming), as
    [(start, stop), ...]; among the best cuts, earlier stages take as many pieces as the bound
    lets them (the encoder's earlier even split: earlier stages take the remainder)."""
    n = len(costs)
    if not 1 <= stages <= n:
        raise ValueError(f"{stages} stages for {n} pieces: allowed 1..{n}")
    prefix = [0.0]
    for c in costs:
        prefix.append(prefix[-1] + c)
    inf = float("inf")
    # best[k][i]: the least largest stage total of the first i pieces in k stages
    best = [[inf] * (n + 1) for _ in range(stages + 1)]
    best[0][0] = 0.0
    for k in range(1, stages + 1):
        for i in range(k, n + 1):
            best[k][i] = min(max(best[k - 1][j], prefix[i] - prefix[j]) for j in range(k - 1, i))
    bound = best[stages][n] * (1 + 1e-9) + 1e-9
    bounds, start = [], 0
    for k in range(stages):
        left = stages - k - 1  # stages after this one, each needing a piece
        stop = start + 1
        while stop < n - left and prefix[stop + 1] - prefix[start] <= bound:
            stop += 1
        if k == stages - 1:
            stop = n
        bounds.append((start, stop))
        start = stop
    return bounds


def stage_pieces(
    layer_costs: list[float], embedding: float, head: float, stage: int, stages: int
) -> tuple[bool, bool, int, int]:
    """Stage `stage` of `stages` over the pieces [embedding, layer 0, ..., layer L-1, head]:
    (holds the embedding, holds the head, first layer, layer after its last)."""
    costs = [embedding, *layer_costs, head]
    start, stop = balanced_bounds(costs, stages)[stage]
    layers = len(layer_costs)
    return start == 0, stop == layers + 2, max(start - 1, 0), min(stop - 1, layers)

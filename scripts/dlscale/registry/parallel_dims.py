"""How a cell's ranks share the model: its strategy (dlscale.registry.strategies) as one typed
record of parallel dimensions, checked before any job.

`ParallelDims` is the shape torchtitan uses: the degree of each dimension (data-parallel
replicas, data-parallel shards, tensor parallel, pipeline stages), validated once (each degree
at least 1, their product the world size, tensor parallel inside a node), and the one value the
PyTorch adapter builds its device mesh from (dlscale.frameworks.torch_parallel). Each strategy's
record gives its data-parallel degrees (Strategy.degrees); the checks here name the study's keys
(tp_degree, pp_degree, microbatches) and their allowed values.

Pure Python: the workflow checks a study's degrees at parse time without importing a framework.
"""

from __future__ import annotations

from dataclasses import dataclass

from dlscale.registry.strategies import (
    DEFAULT_STRATEGY,
    PIPELINED,
    SHARDED,
    STRATEGIES,
    TENSOR_PARALLEL,
)
from dlscale.registry.strategies import get as strategy


@dataclass(frozen=True)
class ParallelDims:
    """The degrees of a cell's parallel dimensions; their product is its world size."""

    dp_replicate: int
    dp_shard: int
    tp: int
    ranks_per_node: int
    pp: int = 1  # pipeline stages: not offered yet (always 1)

    def __post_init__(self):
        for name in ("dp_replicate", "dp_shard", "tp", "pp", "ranks_per_node"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"parallel degree {name} must be an integer >= 1, not {value!r}")
        if self.ranks_per_node % self.tp:
            raise ValueError(
                f"tensor parallel degree {self.tp} must divide the ranks per node "
                f"({self.ranks_per_node}): its ranks share a node; allowed: "
                f"{', '.join(map(str, divisors(self.ranks_per_node)))}"
            )

    @property
    def world_size(self) -> int:
        return self.dp_replicate * self.dp_shard * self.tp * self.pp

    @property
    def dp(self) -> int:
        """Data-parallel degree: how many different batches one step trains on."""
        return self.dp_replicate * self.dp_shard

    def mesh(self) -> tuple[tuple[int, ...], tuple[str, ...]]:
        """The device mesh's shape and dimension names, outermost first: (dp_replicate,
        dp_shard, tp); a tensor-parallel group is consecutive ranks (one node's). A pipeline
        adds its stages outermost: (pp, dp_replicate, dp_shard, tp)."""
        shape, names = (
            (self.dp_replicate, self.dp_shard, self.tp),
            ("dp_replicate", "dp_shard", "tp"),
        )
        if self.pp > 1:
            return (self.pp, *shape), ("pp", *names)
        return shape, names

    def as_dict(self) -> dict:
        return {
            "dp_replicate": self.dp_replicate,
            "dp_shard": self.dp_shard,
            "tp": self.tp,
            "pp": self.pp,
            "world_size": self.world_size,
        }

    @classmethod
    def of(
        cls,
        parallelism: str,
        nodes: int,
        ranks_per_node: int,
        tp_degree: int = 1,
        pp_degree: int = 1,
    ) -> ParallelDims:
        """The degrees of a strategy at a node count (degree_problems first for a message
        that names the configuration's keys)."""
        record = strategy(parallelism)
        tp = tp_degree if record.splits_layers else 1
        pp = pp_degree if record.pipeline else 1
        replicate, shard = record.degrees(nodes, ranks_per_node, tp, pp)
        return cls(replicate, shard, tp, ranks_per_node, pp=pp)


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def cell_pp_degree(parallelism: str, world_size: int, pp_degree: int | None) -> int:
    """A cell's pipeline stages: 1 unless pp, then the config's pp_degree or all its ranks."""
    if parallelism not in PIPELINED:
        return 1
    return _stages(world_size, pp_degree)


def _stages(world_size: int, pp_degree: int | None) -> int:
    return pp_degree if pp_degree is not None else world_size


def cell_microbatches(parallelism: str, pp: int, microbatches: int | None) -> int:
    """A pp cell's micro-batches per step: the config's, or as many as stages."""
    if parallelism not in PIPELINED:
        return 1
    return _microbatches(pp, microbatches)


def _microbatches(pp: int, microbatches: int | None) -> int:
    return microbatches if microbatches is not None else pp


def pipeline_problems(
    world_size: int,
    pp_degree: int | None,
    microbatches: int | None,
    per_rank_batch: int,
    layers: int | None,
    where: str,
) -> list[str]:
    """Why a pp cell cannot run (empty: it can), with the allowed values. A pipeline's ranks
    train on their per-rank batches together (per_rank_batch x stages), which the micro-batches
    must divide; every stage needs a layer."""
    allowed = [d for d in divisors(world_size) if d > 1]
    pp = _stages(world_size, pp_degree)
    if not allowed:
        return [
            f"axes.parallelism: pp needs at least 2 ranks, and {where} has {world_size}; "
            "drop pp there (exclude it) or raise nodes or ranks_per_node"
        ]
    if pp not in allowed:
        return [
            f"pp_degree: {pp} does not divide the {world_size} ranks of {where}; allowed: "
            f"{', '.join(map(str, allowed))} or null (all ranks)"
        ]
    problems = []
    if layers is not None and layers < pp:
        problems.append(
            f"pp_degree: {pp} stages but the model has {layers} layers ({where}); allowed: "
            f"at most {layers}"
        )
    batch = per_rank_batch * pp
    mb = _microbatches(pp, microbatches)
    if batch % mb:
        problems.append(
            f"microbatches: {mb} does not divide a pipeline's batch of {batch} (per_rank_batch "
            f"{per_rank_batch} x {pp} stages, {where}); allowed: "
            f"{', '.join(map(str, divisors(batch)))} or null (as many as stages)"
        )
    return problems


def cell_tp_degree(parallelism: str, ranks_per_node: int, tp_degree: int | None) -> int:
    """A cell's tensor-parallel degree: 1 unless its strategy is tensor parallel, then the
    config's tp_degree or, unset, all ranks of a node."""
    if parallelism not in TENSOR_PARALLEL:
        return 1
    return tp_degree if tp_degree is not None else ranks_per_node


def degree_problems(
    parallelism: str, nodes: int, ranks_per_node: int, tp_degree: int | None, where: str
) -> list[str]:
    """Why a strategy cannot run at this node count and ranks per node (empty: it can), with
    the allowed values; `where` names the hardware entry in the message."""
    if parallelism not in TENSOR_PARALLEL:
        return []
    allowed = [d for d in divisors(ranks_per_node) if d > 1]
    tp = cell_tp_degree(parallelism, ranks_per_node, tp_degree)
    if not allowed:
        return [
            f"axes.parallelism: {parallelism} splits layers over the ranks of a node, but "
            f"{where} has ranks_per_node {ranks_per_node}; tensor parallel needs at least 2 "
            "ranks per node (raise ranks_per_node, or drop tp and fsdp+tp from "
            "axes.parallelism)"
        ]
    if tp not in allowed:
        return [
            f"tp_degree: {tp} is not a tensor-parallel degree for {parallelism} on {where} "
            f"(ranks_per_node {ranks_per_node}); allowed: {', '.join(map(str, allowed))} "
            "(a divisor of ranks_per_node above 1) or null (all ranks of a node)"
        ]
    return []


__all__ = [
    "DEFAULT_STRATEGY",
    "PIPELINED",
    "SHARDED",
    "STRATEGIES",
    "TENSOR_PARALLEL",
    "cell_pp_degree",
    "cell_microbatches",
    "pipeline_problems",
    "ParallelDims",
    "cell_tp_degree",
    "degree_problems",
]

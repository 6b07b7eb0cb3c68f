"""How a cell's ranks share the model: its parallelism (dlscale.study.cell.PARALLELISMS) as one
typed
record of parallel dimensions, checked before any job.

`ParallelDims` is the shape torchtitan uses: the degree of each dimension (data-parallel
replicas, data-parallel shards, tensor parallel, pipeline stages), validated once (each degree
at least 1, their product the world size, tensor parallel inside a node), and the one value the
PyTorch adapter builds its device mesh from (dlscale.frameworks.torch_parallel). A strategy maps
to degrees:

- ddp: every rank a full replica (dp_replicate = world size);
- fsdp: parameters, gradients and optimizer state sharded over all ranks (dp_shard = world);
- hsdp: sharded within a node, replicated across nodes (dp_shard = ranks per node,
  dp_replicate = nodes);
- tp: tensor parallel over tp_degree ranks of a node, replicas across (dp_replicate = world/tp);
- fsdp+tp: tensor parallel inside a node, sharded data parallel across (dp_shard = world/tp);
- pp: pipeline stages over pp_degree ranks (outermost: across nodes), each stage a contiguous
  run of the model's layers, GPipe over `microbatches` micro-batches per step; replicas of the
  pipeline average their gradients (dp_replicate = world/pp).

Pure Python: the workflow checks a study's degrees at parse time without importing a framework.
"""

from __future__ import annotations

from dataclasses import dataclass

from dlscale.study.cell import DEFAULT_PARALLELISM, PARALLELISMS

# The strategies that split layers across ranks (a tensor-parallel degree above 1).
TENSOR_PARALLEL = ("tp", "fsdp+tp")
# Strategies whose optimizer state, gradients and parameters are sharded over data parallel.
SHARDED = ("fsdp", "hsdp", "fsdp+tp")


# Tensor-parallel plans by model architecture (dlscale.models ModelSpec.arch): module names
# (fnmatch patterns over named_modules) -> how torch.distributed.tensor.parallel splits each
# nn.Linear: "colwise" (output features split, ColwiseParallel) then "rowwise" (input
# features split, RowwiseParallel; one all-reduce of the output), Megatron-LM's MLP split.
# The encoder's attention keeps its fused input projection (nn.MultiheadAttention's
# in_proj_weight, no nn.Linear) whole on every rank of the tensor-parallel group.
TP_PLANS = {
    "transformer": {
        "encoder.layers.*.linear1": "colwise",
        "encoder.layers.*.linear2": "rowwise",
    },
    # the GPT-2-class decoder (dlscale.models.torch.gpt): attention by heads (query, key and
    # value projections by columns, the output projection by rows) and the MLP; embeddings,
    # LayerNorms and the tied head whole on every rank of the group. Its heads must divide.
    "gpt": {
        "blocks.*.attn.wq": "colwise",
        "blocks.*.attn.wk": "colwise",
        "blocks.*.attn.wv": "colwise",
        "blocks.*.attn.wo": "rowwise",
        "blocks.*.mlp.fc": "colwise",
        "blocks.*.mlp.proj": "rowwise",
    },
}


# The blocks fully_shard wraps one by one (then the root), by architecture: fnmatch patterns
# over named_modules; an architecture not named here has its top-level children wrapped.
FSDP_UNITS = {"transformer": ("encoder.layers.*",), "gpt": ("blocks.*",)}


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
        world = nodes * ranks_per_node
        tp = tp_degree if parallelism in TENSOR_PARALLEL else 1
        if parallelism == "ddp":
            return cls(world, 1, 1, ranks_per_node)
        if parallelism == "fsdp":
            return cls(1, world, 1, ranks_per_node)
        if parallelism == "hsdp":
            return cls(nodes, ranks_per_node, 1, ranks_per_node)
        if parallelism == "tp":
            return cls(world // tp, 1, tp, ranks_per_node)
        if parallelism == "fsdp+tp":
            return cls(1, world // tp, tp, ranks_per_node)
        if parallelism == "pp":
            return cls(world // pp_degree, 1, 1, ranks_per_node, pp=pp_degree)
        raise ValueError(
            f"unknown parallelism {parallelism!r}; allowed values: {', '.join(PARALLELISMS)}"
        )


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


# Models a pipeline can split into stages, by architecture (dlscale.frameworks.torch_parallel
# .pipeline_stage): the encoder's layers; the GPT-2-class decoders tie their head to their token
# embedding, which two stages cannot share.
PIPELINE_ARCHS = ("transformer",)


def cell_pp_degree(parallelism: str, world_size: int, pp_degree: int | None) -> int:
    """A cell's pipeline stages: 1 unless pp, then the config's pp_degree or all its ranks."""
    if parallelism != "pp":
        return 1
    return pp_degree if pp_degree is not None else world_size


def cell_microbatches(parallelism: str, pp: int, microbatches: int | None) -> int:
    """A pp cell's micro-batches per step: the config's, or as many as stages."""
    if parallelism != "pp":
        return 1
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
    pp = cell_pp_degree("pp", world_size, pp_degree)
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
    mb = cell_microbatches("pp", pp, microbatches)
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
    "DEFAULT_PARALLELISM",
    "FSDP_UNITS",
    "PARALLELISMS",
    "SHARDED",
    "TENSOR_PARALLEL",
    "TP_PLANS",
    "PIPELINE_ARCHS",
    "cell_pp_degree",
    "cell_microbatches",
    "pipeline_problems",
    "ParallelDims",
    "cell_tp_degree",
    "degree_problems",
]

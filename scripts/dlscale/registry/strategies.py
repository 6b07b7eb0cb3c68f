"""What a parallel strategy is: one `Strategy` record each (config `axes.parallelism`).

A record says how a cell's ranks share the model: the degrees of its mesh dimensions at a node
count (`degrees`, read by dlscale.registry.parallel_dims.ParallelDims), whether it splits layers
(tensor parallel: `tp_degree`), shards parameters, gradients and optimizer state, or runs a
pipeline (`pp_degree`, `microbatches`), and which part of a model's plan it needs
(`model_plan`: dlscale.models.parallelize keeps one `ParallelPlan` per architecture, beside the
models), and which frameworks offer it (`frameworks`; a framework record's `strategies` is read
from here). The schema's enums are filled from here.

Adding a strategy: docs/pages/extending.md ("A strategy").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field


class RegistryError(ValueError):
    """A registry record is missing a fact or names an unknown one: raised at import."""


@dataclass(frozen=True)
class ParallelPlan:
    """A model architecture's plan for the strategies beyond ddp (torchtitan's per-model
    `parallelize`), as data: fnmatch patterns over the PyTorch model's named_modules.

    - tp: module -> "colwise" (output features split, ColwiseParallel) or "rowwise" (input
      features split, RowwiseParallel); empty: the model has no tensor-parallel plan;
    - fsdp_units: the blocks fully_shard wraps one by one before the root; empty: the model's
      top-level children;
    - pipeline: whether a pipeline can split the model into stages of contiguous layers (a
      head tied to the token embedding cannot be split: two stages would share it);
    - why_not_pipeline: the reason where it cannot, for the refusal's message;
    - splits_heads: tensor parallel splits the attention heads, so the degree must divide the
      model's `num_heads`.
    """

    tp: dict[str, str] = field(default_factory=dict)
    fsdp_units: tuple[str, ...] = ()
    pipeline: bool = False
    why_not_pipeline: str = ""
    splits_heads: bool = False

    def __post_init__(self):
        bad = {m: s for m, s in self.tp.items() if s not in ("colwise", "rowwise")}
        if bad:
            raise RegistryError(f"ParallelPlan.tp: {bad}; allowed styles: colwise, rowwise")

    def offers(self, need: str | tuple[str, ...] | None) -> bool:
        """Whether this plan has what a strategy's `model_plan` needs (every fact of a tuple)."""
        if need is None:
            return True
        return all(bool(getattr(self, n)) for n in ((need,) if isinstance(need, str) else need))


@dataclass(frozen=True)
class Strategy:
    """One parallel strategy.

    - name: its value in `axes.parallelism` (and its cells' path segment);
    - description: one line for messages and the docs;
    - degrees(nodes, ranks_per_node, tp, pp) -> (dp_replicate, dp_shard): its data-parallel
      dimensions; tensor-parallel and pipeline degrees are given (1 unless it splits layers or
      runs a pipeline);
    - splits_layers: tensor parallel inside a node (`tp_degree`);
    - sharded: parameters, gradients and optimizer state sharded over data parallel;
    - hybrid: sharded within a node and replicated across nodes (the shards' mesh is
      (dp_replicate, dp_shard));
    - pipeline: stages over `pp_degree` ranks, `microbatches` per step;
    - model_plan: the ParallelPlan fact a model needs for it ("tp", "pipeline"), a tuple of
      them (a pipeline of tensor-parallel stages needs both), or None;
    - frameworks: the frameworks whose adapters run it (None: every framework; the default
      strategy is every framework's). Checked against the framework records at import.
    """

    name: str
    description: str
    degrees: Callable[[int, int, int, int], tuple[int, int]]
    splits_layers: bool = False
    sharded: bool = False
    hybrid: bool = False
    pipeline: bool = False
    model_plan: str | tuple[str, ...] | None = None
    frameworks: tuple[str, ...] | None = None

    @property
    def plain_data_parallel(self) -> bool:
        """Every rank a full replica (DistributedDataParallel in PyTorch): nothing split,
        sharded or pipelined."""
        return not (self.splits_layers or self.sharded or self.pipeline)

    @property
    def replicas_average_gradients(self) -> bool:
        """Replicas of a tensor-parallel model that no sharding covers average their
        gradients over dp_replicate themselves (ddp's are DistributedDataParallel's; a
        pipeline's replicas reduce theirs through fully_shard over (dp_replicate, dp_shard):
        dlscale.frameworks.torch_pipeline)."""
        return self.splits_layers and not self.sharded and not self.pipeline

    def __post_init__(self):
        where = f"strategy record {self.name!r} (dlscale.registry.strategies)"
        for f in ("name", "description", "degrees"):
            if not getattr(self, f):
                raise RegistryError(f"{where}: fact {f!r} is missing")
        plan_facts = ("tp", "fsdp_units", "pipeline")
        needs = (self.model_plan,) if isinstance(self.model_plan, str) else self.model_plan
        if needs is not None and (not needs or any(n not in plan_facts for n in needs)):
            raise RegistryError(
                f"{where}: fact 'model_plan' is {self.model_plan!r}; allowed: "
                f"{', '.join(plan_facts)} or None"
            )


STRATEGIES = {
    s.name: s
    for s in (
        Strategy(
            "ddp",
            "every rank a full replica, gradients all-reduced",
            lambda nodes, rpn, tp, pp: (nodes * rpn, 1),
        ),
        Strategy(
            "fsdp",
            "parameters, gradients and optimizer state sharded over all ranks (fully_shard)",
            lambda nodes, rpn, tp, pp: (1, nodes * rpn),
            sharded=True,
            frameworks=("pytorch",),
        ),
        Strategy(
            "hsdp",
            "sharded within a node, replicated across nodes",
            lambda nodes, rpn, tp, pp: (nodes, rpn),
            sharded=True,
            hybrid=True,
            frameworks=("pytorch",),
        ),
        Strategy(
            "tp",
            "tensor parallel over tp_degree ranks of a node, replicas across",
            lambda nodes, rpn, tp, pp: (nodes * rpn // tp, 1),
            splits_layers=True,
            model_plan="tp",
            frameworks=("pytorch",),
        ),
        Strategy(
            "fsdp+tp",
            "tensor parallel inside a node, sharded data parallel across",
            lambda nodes, rpn, tp, pp: (1, nodes * rpn // tp),
            splits_layers=True,
            sharded=True,
            model_plan="tp",
            frameworks=("pytorch",),
        ),
        Strategy(
            "pp",
            "pipeline stages over pp_degree ranks (pp_schedule over microbatches), replicas across",
            lambda nodes, rpn, tp, pp: (nodes * rpn // pp, 1),
            pipeline=True,
            model_plan="pipeline",
            frameworks=("pytorch",),
        ),
        Strategy(
            "pp+fsdp",
            "pipeline stages over pp_degree ranks, each stage sharded over the other ranks "
            "(fully_shard)",
            lambda nodes, rpn, tp, pp: (1, nodes * rpn // pp),
            sharded=True,
            pipeline=True,
            model_plan="pipeline",
            frameworks=("pytorch",),
        ),
        Strategy(
            "pp+tp",
            "pipeline stages over pp_degree ranks, each stage tensor parallel over tp_degree "
            "ranks of a node, replicas across",
            lambda nodes, rpn, tp, pp: (nodes * rpn // (pp * tp), 1),
            splits_layers=True,
            pipeline=True,
            model_plan=("tp", "pipeline"),
            frameworks=("pytorch",),
        ),
        Strategy(
            "pp+fsdp+tp",
            "pipeline stages over pp_degree ranks, each stage tensor parallel inside a node and "
            "sharded over the other ranks (3-D: pp x dp_shard x tp)",
            lambda nodes, rpn, tp, pp: (1, nodes * rpn // (pp * tp)),
            splits_layers=True,
            sharded=True,
            pipeline=True,
            model_plan=("tp", "pipeline"),
            frameworks=("pytorch",),
        ),
    )
}
# Every cell measured before the parallelism axis existed is a ddp cell: the default keeps
# their paths and hashes.
DEFAULT_STRATEGY = "ddp"
if DEFAULT_STRATEGY not in STRATEGIES:
    raise RegistryError(f"DEFAULT_STRATEGY {DEFAULT_STRATEGY!r} has no record")

# The strategies that split layers across ranks (a tensor-parallel degree above 1), that shard,
# and that pipeline: read from the records.
TENSOR_PARALLEL = tuple(n for n, s in STRATEGIES.items() if s.splits_layers)
SHARDED = tuple(n for n, s in STRATEGIES.items() if s.sharded)
PIPELINED = tuple(n for n, s in STRATEGIES.items() if s.pipeline)


def get(name: str) -> Strategy:
    try:
        return STRATEGIES[name]
    except KeyError:
        raise ValueError(
            f"unknown parallelism {name!r}; allowed values: {', '.join(STRATEGIES)}"
        ) from None


def names() -> list[str]:
    return list(STRATEGIES)

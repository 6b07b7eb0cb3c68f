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


# The tensor-parallel styles a plan may name (torch.distributed.tensor.parallel; built by
# dlscale.frameworks.torch_parallel.tp_style): style -> what it does. "Sequence" is dim 1 of a
# (batch, sequence, features) activation: sequence parallel keeps the residual stream split
# over it between the blocks' parallel regions (Korthikanti et al. 2022; torchtitan's plan).
TP_STYLES = {
    "colwise": "ColwiseParallel(): a Linear's output features split, its input replicated",
    "rowwise": "RowwiseParallel(): a Linear's input features split, its output all-reduced",
    "rowwise_to_sequence": "RowwiseParallel(output_layouts=Shard(1)): a Linear's input "
    "features split, its output reduce-scattered over the sequence",
    "embedding": "RowwiseParallel(input_layouts=Replicate()) of an nn.Embedding: the "
    "vocabulary's rows split, the output all-reduced (replicated)",
    "embedding_to_sequence": "RowwiseParallel(input_layouts=Replicate(), "
    "output_layouts=Shard(1)) of an nn.Embedding: the vocabulary's rows split, the output "
    "reduce-scattered over the sequence",
    "sequence_parallel": "SequenceParallel(): a norm on this rank's part of the sequence, its "
    "weights replicated",
    "gather_sequence": "PrepareModuleInput: the module's first input all-gathered from "
    "Shard(1) to Replicate() (its other inputs as they are)",
    "scatter_sequence": "PrepareModuleInput: the module's first input, replicated, cut to "
    "this rank's part of the sequence (Shard(1))",
    "output_loss_parallel": "ColwiseParallel(input_layouts=Shard(1), output_layouts=Shard(-1), "
    "use_local_output=False): the output head's vocabulary split, the logits left "
    "vocabulary-sharded for loss_parallel's cross-entropy",
}
# The styles that leave or take the residual stream split over the sequence
SEQUENCE_STYLES = (
    "rowwise_to_sequence",
    "embedding_to_sequence",
    "sequence_parallel",
    "gather_sequence",
    "scatter_sequence",
    "output_loss_parallel",
)
# The tensor-parallel plans a cell may run (Cell.tp_plan): "blocks" splits the blocks' Linear
# layers only (the field's default: docs/pages/decisions/changed-defaults.md), "complete" the
# whole model as torchtitan's llama3 plan does (embedding, sequence-parallel norms, output head
# with loss parallel).
TP_PLANS = ("blocks", "complete")


@dataclass(frozen=True)
class ParallelPlan:
    """A model architecture's plan for the strategies beyond ddp (torchtitan's per-model
    `parallelize`), as data: fnmatch patterns over the PyTorch model's named_modules.

    - tp: module -> a style of TP_STYLES, the "blocks" plan: the blocks' Linear layers only,
      "colwise" or "rowwise" (the plan of a cell with `tp_plan: blocks`); empty: the model has
      no tensor-parallel plan;
    - tp_complete: module -> a style of TP_STYLES, the "complete" plan (embedding, norms,
      attention and MLP, output head); empty: the model offers only its `tp` plan. Applied in
      the order given (a module's input preparation before its Linear layers' styles);
    - fsdp_units: the blocks fully_shard wraps one by one before the root, and the blocks
      activation checkpointing and per-block compilation wrap; empty: the model's top-level
      children (fully_shard), no blocks (checkpointing and per-block compile refused);
    - pipeline: whether a pipeline can split the model into stages of contiguous layers (a
      head tied to the token embedding cannot be split: two stages would share it);
    - why_not_pipeline: the reason where it cannot, for the refusal's message;
    - splits_heads: tensor parallel splits the attention heads, so the degree must divide the
      model's `num_heads`.
    """

    tp: dict[str, str] = field(default_factory=dict)
    tp_complete: dict[str, str] = field(default_factory=dict)
    fsdp_units: tuple[str, ...] = ()
    pipeline: bool = False
    why_not_pipeline: str = ""
    splits_heads: bool = False

    def __post_init__(self):
        bad = {m: s for m, s in self.tp.items() if s not in ("colwise", "rowwise")}
        if bad:
            raise RegistryError(
                f"ParallelPlan.tp: {bad}; allowed styles of the blocks plan: colwise, rowwise"
            )
        bad = {m: s for m, s in self.tp_complete.items() if s not in TP_STYLES}
        if bad:
            raise RegistryError(
                f"ParallelPlan.tp_complete: {bad}; allowed styles: {', '.join(TP_STYLES)}"
            )
        heads = [m for m, s in self.tp_complete.items() if s == "output_loss_parallel"]
        if len(heads) > 1:
            raise RegistryError(
                f"ParallelPlan.tp_complete: {heads} are all output_loss_parallel; a model has "
                "one output head (loss_parallel reads its logits)"
            )

    def offers(self, need: str | tuple[str, ...] | None) -> bool:
        """Whether this plan has what a strategy's `model_plan` needs (every fact of a tuple)."""
        if need is None:
            return True
        return all(bool(getattr(self, n)) for n in ((need,) if isinstance(need, str) else need))

    def tp_plan(self, name: str) -> dict[str, str]:
        """The tensor-parallel plan `name` (TP_PLANS) as module -> style."""
        if name not in TP_PLANS:
            raise ValueError(f"unknown tp_plan {name!r}; allowed values: {', '.join(TP_PLANS)}")
        if name == "complete":
            if not self.tp_complete:
                raise ValueError("this model offers no complete tensor-parallel plan")
            return self.tp_complete
        return self.tp

    @property
    def best_tp_plan(self) -> str:
        """The plan a new tensor-parallel cell runs: "complete" where the model offers it."""
        return "complete" if self.tp_complete else "blocks"

    @property
    def loss_parallel(self) -> bool:
        """Whether the complete plan leaves the logits vocabulary-sharded (an
        output_loss_parallel head): the loss is then loss_parallel's cross-entropy."""
        return "output_loss_parallel" in self.tp_complete.values()

    @property
    def sequence_parallel(self) -> bool:
        """Whether the complete plan splits activations over the sequence (its length must
        divide by the tensor-parallel degree)."""
        return any(s in SEQUENCE_STYLES for s in self.tp_complete.values())


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
    def replicas_fully_shard(self) -> bool:
        """Replicas of a split model that no sharding covers: a tensor-parallel model's (tp
        across nodes) are fully_shard over the (dp_replicate, dp_shard = 1) mesh, HSDP with
        shards of one rank, i.e. replication whose gradients FSDP2 all-reduces in its bucketed
        reduction (a pipeline's replicas likewise: dlscale.frameworks.torch_pipeline)."""
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

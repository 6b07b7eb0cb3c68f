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
    pp: int = 1  # pipeline stages (ranks; a schedule may loop several stages over each)

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


@dataclass(frozen=True)
class PipelineSchedule:
    """A pipeline schedule (config `pp_schedule`): torch.distributed.pipelining's class, the
    stages each rank holds (`stages_per_rank`: virtual stages, looped: rank r holds stages
    r, r + pp, ...), and its idle share of a step (`bubble_fraction`)."""

    name: str
    torch_class: str
    stages_per_rank: int
    description: str

    def bubble_fraction(self, pp: int, microbatches: int) -> float:
        """The share of a step each rank idles in the pipeline's fill and drain, all stages
        taking equal time: (p - 1) / (v m + p - 1) for p ranks, m micro-batches and v stages per
        rank. GPipe and 1F1B (v = 1) idle the same (p - 1) stage-times of m + p - 1 (Huang et
        al. 2019; Narayanan et al. 2021, sec. 2.2: bubble/ideal = (p - 1) / m); interleaving v
        stages per rank shortens each stage-time v-fold (sec. 2.2.2: (1/v)(p - 1)/m)."""
        v = self.stages_per_rank
        return (pp - 1) / (v * microbatches + pp - 1)

    def microbatch_problem(self, pp: int, microbatches: int) -> str | None:
        """Why the schedule cannot run `microbatches` over `pp` ranks (None: it can), as
        torch.distributed.pipelining refuses it at construction."""
        if self.name == "1f1b" and microbatches < pp:
            return f"1f1b needs at least as many micro-batches as stages ({pp})"
        if self.name == "interleaved_1f1b":
            rounds = max(1, microbatches // pp)
            if microbatches % rounds:
                return (
                    f"interleaved_1f1b runs max(1, microbatches // stages) = {rounds} rounds of "
                    f"micro-batches, which must divide them"
                )
        return None


PIPELINE_SCHEDULES = {
    s.name: s
    for s in (
        PipelineSchedule(
            "gpipe",
            "ScheduleGPipe",
            1,
            "every micro-batch's forward, then every backward (Huang et al. 2019)",
        ),
        PipelineSchedule(
            "1f1b",
            "Schedule1F1B",
            1,
            "one forward, one backward in the steady state: at most p micro-batches' "
            "activations held (PipeDream-Flush; torchtitan's default)",
        ),
        PipelineSchedule(
            "interleaved_1f1b",
            "ScheduleInterleaved1F1B",
            2,
            "1F1B over 2 looped stages per rank: the bubble halved (Narayanan et al. 2021)",
        ),
    )
}
# A new study's schedule (config pp_schedule's default: torchtitan's), and the schedule every pp
# cell measured before the key existed ran (dlscale.study.cell.Cell.pp_schedule's default).
DEFAULT_PIPELINE_SCHEDULE = "1f1b"
MEASURED_PIPELINE_SCHEDULE = "gpipe"


def pipeline_schedule(name: str) -> PipelineSchedule:
    try:
        return PIPELINE_SCHEDULES[name]
    except KeyError:
        raise ValueError(
            f"pp_schedule: unknown schedule {name!r}; allowed values: "
            f"{', '.join(PIPELINE_SCHEDULES)}"
        ) from None


def cell_pp_degree(
    parallelism: str, world_size: int, pp_degree: int | None, tp_degree: int = 1
) -> int:
    """A cell's pipeline stages: 1 unless it pipelines, then the config's pp_degree or all the
    ranks tensor parallel leaves (world size / its tp degree)."""
    if parallelism not in PIPELINED:
        return 1
    return _stages(world_size // tp_degree, pp_degree)


def _stages(world_size: int, pp_degree: int | None) -> int:
    return pp_degree if pp_degree is not None else world_size


def pipeline_batch(per_rank_batch: int, pp: int, tp: int = 1) -> int:
    """The batch one pipeline trains on per step: its ranks' per-rank batches together (pp
    stages of tp ranks each), the micro-batches' sum."""
    return per_rank_batch * pp * tp


def cell_microbatches(
    parallelism: str,
    pp: int,
    microbatches: int | None,
    batch: int | None = None,
    schedule: str = DEFAULT_PIPELINE_SCHEDULE,
) -> int:
    """A pipelined cell's micro-batches per step: the config's, or the fewest of at least twice
    the stages that divide the pipeline's `batch` and suit the schedule (none: twice the
    stages, which pipeline_problems refuses with the allowed values)."""
    if parallelism not in PIPELINED:
        return 1
    return _microbatches(pp, microbatches, batch, schedule)


def _microbatches(pp: int, microbatches: int | None, batch: int | None, schedule: str) -> int:
    if microbatches is not None:
        return microbatches
    record = pipeline_schedule(schedule)
    if batch is not None:
        for m in divisors(batch):
            if m >= 2 * pp and record.microbatch_problem(pp, m) is None:
                return m
    return 2 * pp


def pipeline_problems(
    world_size: int,
    pp_degree: int | None,
    microbatches: int | None,
    per_rank_batch: int,
    layers: int | None,
    where: str,
    schedule: str = DEFAULT_PIPELINE_SCHEDULE,
    tp: int = 1,
) -> list[str]:
    """Why a pipelined cell cannot run (empty: it can), with the allowed values. A pipeline's
    ranks train on their per-rank batches together (per_rank_batch x stages x tp), which the
    micro-batches must divide, in a number the schedule runs; every stage (stages_per_rank per
    rank) needs a piece of the model: a layer, the embedding or the head."""
    record = pipeline_schedule(schedule)
    allowed = [d for d in divisors(world_size // tp) if d > 1]
    pp = _stages(world_size // tp, pp_degree)
    if not allowed:
        return [
            f"axes.parallelism: a pipeline needs at least 2 stages, and {where} has "
            f"{world_size} ranks"
            + (f" ({world_size // tp} after tp {tp})" if tp > 1 else "")
            + "; drop the pipelined strategies there (exclude them) or raise nodes or "
            "ranks_per_node"
        ]
    if pp not in allowed:
        return [
            f"pp_degree: {pp} does not divide the {world_size // tp} pipeline ranks of {where}"
            + (f" ({world_size} ranks / tp {tp})" if tp > 1 else "")
            + f"; allowed: {', '.join(map(str, allowed))} or null (all of them)"
        ]
    problems = []
    stages = pp * record.stages_per_rank
    if layers is not None and layers + 2 < stages:
        problems.append(
            f"pp_degree: {stages} stages ({pp} ranks x {record.stages_per_rank} under "
            f"{schedule}) but the model has {layers} layers ({where}: with its embedding and "
            f"head, {layers + 2} pieces); allowed: at most {(layers + 2) // record.stages_per_rank}"
        )
    batch = pipeline_batch(per_rank_batch, pp, tp)
    mb = _microbatches(pp, microbatches, batch, schedule)
    fits = [d for d in divisors(batch) if record.microbatch_problem(pp, d) is None]
    why = None
    if batch % mb:
        why = f"{mb} does not divide a pipeline's batch of {batch}"
    elif record.microbatch_problem(pp, mb):
        why = f"{mb}: {record.microbatch_problem(pp, mb)}"
    if why:
        problems.append(
            f"microbatches: {why} (per_rank_batch {per_rank_batch} x {pp} stages"
            + (f" x tp {tp}" if tp > 1 else "")
            + f", {where}, pp_schedule {schedule}); allowed: "
            f"{', '.join(map(str, fits)) or 'none (raise per_rank_batch)'}"
            + (" or null (the fewest of at least twice the stages)" if microbatches else "")
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
    "DEFAULT_PIPELINE_SCHEDULE",
    "MEASURED_PIPELINE_SCHEDULE",
    "PIPELINE_SCHEDULES",
    "PipelineSchedule",
    "pipeline_batch",
    "pipeline_problems",
    "pipeline_schedule",
    "ParallelDims",
    "cell_tp_degree",
    "degree_problems",
]

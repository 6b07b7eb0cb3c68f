"""What one rank trains (TrainSpec): the rank-side subset of its cell, derived field by field
(TrainSpec.from_cell, DERIVED_FROM_CELL), which every framework's adapter
(dlscale.frameworks.base.Adapter) is made with."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import TYPE_CHECKING

from dlscale.registry.optimizers import DEFAULT_OPTIMIZER
from dlscale.registry.strategies import DEFAULT_STRATEGY
from dlscale.study.protocol import FIRST_STEP_TIMEOUT_S

if TYPE_CHECKING:
    from dlscale.study.cell import Cell


@dataclass(frozen=True)
class TrainSpec:
    """What one rank trains: the rank-side subset of a cell (dlscale.study.cell.Cell). Frozen and
    explicit: an unknown argument is a TypeError, and the optimizer's settings have no default
    here (they come from the config's `optimizer` section, through the cell)."""

    framework: str
    model: str
    per_rank_batch: int
    warmup_steps: int
    steps: int
    precision: str
    device: str
    threads: int
    learning_rate: float
    momentum: float
    mode: str = "eager"  # or "compiled" (the cell's mode axis)
    seed: int = 0
    workload: str = "throughput"  # or "convergence" (dlscale.study.cell.WORKLOADS)
    # the first warm-up step's deadline (config first_step_timeout_s; dlscale.study.protocol)
    first_step_timeout_s: int = FIRST_STEP_TIMEOUT_S
    # how the ranks share the model (dlscale.registry.parallel_dims) and the tensor-parallel degree
    parallelism: str = DEFAULT_STRATEGY
    tp_degree: int = 1
    pp_degree: int = 1  # pipeline stages (pp) and micro-batches per step
    microbatches: int = 1
    pp_schedule: str = "gpipe"  # the pipeline's schedule (dlscale.registry.parallel_dims)
    # a decoder model's sequence length (the cell's seq_len); None: the model's own input shape
    seq_len: int | None = None
    # the optimizer (dlscale.registry.optimizers) and AdamW's settings (None for SGD), the norm
    # its gradients are clipped to (None: none), and whether a bf16/fp16 cell under fully_shard
    # takes its precision from FSDP2's MixedPrecisionPolicy instead of autocast (the cell's)
    optimizer: str = DEFAULT_OPTIMIZER
    adam_beta1: float | None = None
    adam_beta2: float | None = None
    adam_eps: float | None = None
    weight_decay: float | None = None
    grad_clip_norm: float | None = None
    fsdp_mixed_precision: bool = False
    # the tensor-parallel plan (dlscale.registry.strategies.TP_PLANS), the blocks' activation
    # checkpointing (none, selective, full) and what mode "compiled" compiles (model, block):
    # the cell's (dlscale.study.cell.Cell)
    tp_plan: str = "blocks"
    activation_checkpointing: str = "none"
    compile_scope: str = "model"
    # the attention kernel (None: PyTorch's choice), the compiled loss, what world size 1 runs
    # (plain, fully_shard) and the trace after the window (steps, nsys, the file): the cell's
    attention: str | None = None
    compile_loss: bool = False
    single_device: str = "plain"
    trace_steps: int = 0
    trace_nsys: bool = False
    trace_path: str | None = None
    # a model of the study's own (dlscale.models.zoo): its record, registered where the rank
    # builds it (the cell's model_source); None: a shipped model
    model_source: str | None = None

    @classmethod
    def from_cell(cls, cell: Cell) -> TrainSpec:
        """A cell's rank-side subset: every field the cell's field of the same name, but those
        DERIVED_FROM_CELL says how to derive."""
        return cls(
            **{
                f.name: DERIVED_FROM_CELL[f.name](cell)
                if f.name in DERIVED_FROM_CELL
                else getattr(cell, f.name)
                for f in fields(cls)
            }
        )


# TrainSpec's fields that are not a Cell field of the same name, and how from_cell derives
# each; every other field is the cell's (a field added to both is carried without a word here,
# and tests/unit/frameworks/test_train_spec.py fails on a field the cell lacks).
DERIVED_FROM_CELL = {
    "threads": lambda cell: cell.cpus_per_rank,  # intra-op threads: the rank's CPUs
    "seed": lambda cell: 0,  # every rank of every cell seeds the same
    "trace_path": lambda cell: trace_file(cell) if cell.trace_steps else None,
}


TRACE_FILE = "trace.json"  # a traced cell's Chrome/Perfetto trace, beside its metrics file


def trace_file(cell: Cell) -> str:
    """Where a traced cell's rank 0 writes its trace: TRACE_FILE in the cell's folder."""
    from pathlib import Path

    return str(Path(cell.path).parent / TRACE_FILE)

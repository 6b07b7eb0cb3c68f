"""What one rank trains (TrainSpec): the rank-side subset of its cell, its fields derived from
one list of the cell's (FROM_CELL: their names, types and defaults are the cell's) and the
three it derives (DERIVED_FROM_CELL), which every framework's adapter
(dlscale.frameworks.base.Adapter) is made with."""

from __future__ import annotations

import dataclasses

from dlscale.study.cell import Cell

# The cell's fields a rank reads (dlscale.study.cell.Cell), under the cell's names, types and
# defaults: the one list TrainSpec's fields come from. A field added to the cell reaches the
# ranks by its name here.
FROM_CELL = (
    "framework",
    "model",
    "per_rank_batch",
    "warmup_steps",
    "steps",
    "precision",
    "device",
    "learning_rate",
    "momentum",
    "mode",
    "workload",
    "first_step_timeout_s",
    # how the ranks share the model (dlscale.registry.parallel_dims): degrees, pipeline
    "parallelism",
    "tp_degree",
    "pp_degree",
    "microbatches",
    "pp_schedule",
    "seq_len",
    # the optimizer (dlscale.registry.optimizers), AdamW's settings, the clip norm, FSDP2's
    # mixed precision
    "optimizer",
    "adam_beta1",
    "adam_beta2",
    "adam_eps",
    "weight_decay",
    "grad_clip_norm",
    "fsdp_mixed_precision",
    # the tensor-parallel plan, activation checkpointing, what mode "compiled" compiles
    "tp_plan",
    "activation_checkpointing",
    "compile_scope",
    # the LLM step: attention kernel, compiled loss, world size 1, the trace after the window
    "attention",
    "compile_loss",
    "single_device",
    "trace_steps",
    "trace_nsys",
    # a model of the study's own (dlscale.models.zoo), registered where the rank builds it
    "model_source",
)
# TrainSpec's fields that are no Cell field, and how from_cell derives each from the cell.
DERIVED_FROM_CELL = {
    "threads": lambda cell: cell.cpus_per_rank,  # intra-op threads: the rank's CPUs
    "seed": lambda cell: 0,  # every rank of every cell seeds the same
    "trace_path": lambda cell: trace_file(cell) if cell.trace_steps else None,
}
# Their types and defaults (threads has none), and the one default a spec made directly adds
# to the cell's (the cell's mode axis always names one).
_DERIVED_FIELDS = {
    "threads": (int, dataclasses.MISSING),
    "seed": (int, 0),
    "trace_path": ("str | None", None),
}
_SPEC_DEFAULTS = {"mode": "eager"}


def _spec_fields() -> list[tuple]:
    """(name, type, field) of every TrainSpec field: FROM_CELL with the cell's type and default
    (or _SPEC_DEFAULTS'), then the derived ones; those without a default first, each group in
    this order, as a dataclass needs."""
    cell = {f.name: f for f in dataclasses.fields(Cell)}
    specs = []
    for name in FROM_CELL:
        f = cell[name]
        default = _SPEC_DEFAULTS.get(name, f.default)
        factory = f.default_factory
        specs.append((name, f.type, default, factory))
    for name, (kind, default) in _DERIVED_FIELDS.items():
        specs.append((name, kind, default, dataclasses.MISSING))
    required = [s for s in specs if s[2] is dataclasses.MISSING and s[3] is dataclasses.MISSING]
    optional = [s for s in specs if s not in required]
    return [
        (name, kind, dataclasses.field(default=default, default_factory=factory))
        for name, kind, default, factory in required + optional
    ]


def _from_cell(cls, cell: Cell) -> TrainSpec:
    """A cell's rank-side subset: every field the cell's field of the same name, but those
    DERIVED_FROM_CELL says how to derive."""
    return cls(
        **{
            f.name: DERIVED_FROM_CELL[f.name](cell)
            if f.name in DERIVED_FROM_CELL
            else getattr(cell, f.name)
            for f in dataclasses.fields(cls)
        }
    )


# What one rank trains: the rank-side subset of its cell, FROM_CELL and DERIVED_FROM_CELL.
# Frozen and explicit: an unknown argument is a TypeError, and the optimizer's settings have no
# default (they come from the config's `optimizer` section, through the cell). Made by every
# framework's adapter from the cell (TrainSpec.from_cell), or directly with keywords.
TrainSpec = dataclasses.make_dataclass(
    "TrainSpec",
    _spec_fields(),
    frozen=True,
    namespace={"from_cell": classmethod(_from_cell), "__module__": __name__},
)


TRACE_FILE = "trace.json"  # a traced cell's Chrome/Perfetto trace, beside its metrics file


def trace_file(cell: Cell) -> str:
    """Where a traced cell's rank 0 writes its trace: TRACE_FILE in the cell's folder."""
    from pathlib import Path

    return str(Path(cell.path).parent / TRACE_FILE)

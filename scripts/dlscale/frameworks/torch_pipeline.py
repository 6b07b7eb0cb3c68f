"""Pipeline parallel for the PyTorch adapter (strategies pp, pp+fsdp, pp+tp, pp+fsdp+tp):
torch.distributed.pipelining over the `pp` dimension of the cell's device mesh, (pp,
dp_replicate, dp_shard, tp) outermost first (dlscale.registry.parallel_dims.ParallelDims.mesh),
as torchtitan's distributed/pipeline_parallel.py builds it:

1. the whole model, the same on every rank, is cut into `pp x v` stages (v = the schedule's
   stages per rank: 1 for gpipe and 1f1b, 2 for interleaved_1f1b), balanced by forward FLOPs
   with the embedding and the head counted (dlscale.models.torch.pipeline_split; each
   architecture's `pipeline_stage`); rank r of the pipeline holds stages r, r + pp, ... (looped);
2. each stage module is tensor-parallel split over `tp` by the model's plan
   (dlscale.frameworks.torch_parallel.apply_tensor_parallel), then wrapped by fully_shard (FSDP2)
   over the data-parallel ranks: over dp_shard (pp+fsdp, pp+fsdp+tp: the stage's parameters,
   gradients and optimizer state sharded), or over (dp_replicate, dp_shard = 1) for replicas of
   a pipeline (pp, pp+tp across nodes): FSDP2's hybrid layout with shards of one rank, i.e. the
   replicas' gradients all-reduced by FSDP2's own reduction, which PipelineStage drives
   (it defers the reduction to the last micro-batch's backward, perform_reduce_grad);
3. the schedule (config pp_schedule: ScheduleGPipe, Schedule1F1B, ScheduleInterleaved1F1B) over
   the cell's micro-batches, the loss a mean per micro-batch and the gradients divided by the
   micro-batches (scale_grads): the gradient of the pipeline's batch's mean loss.

A pipeline's ranks (its stages, and the tensor-parallel ranks of each) train on their
per-rank batches together, so a step trains on the same global batch as ddp. The rank's record
(`parallelism.pipeline`) states the schedule, stages, micro-batches, the bubble fraction
((p - 1) / (v m + p - 1): dlscale.registry.parallel_dims.PipelineSchedule.bubble_fraction), and
each local stage's pieces and parameters.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field

import torch
from torch import nn

from dlscale.models.parallelize import plan_for
from dlscale.registry.parallel_dims import ParallelDims, pipeline_schedule


def pipeline_stage(model: nn.Module, arch: str, stage: int, stages: int) -> nn.Module:
    """Stage `stage` of `stages` of a model whose plan offers a pipeline
    (dlscale.models.parallelize.<arch>.PLAN.pipeline): the split beside the model,
    dlscale.models.torch.<arch>.pipeline_stage."""
    if not plan_for(arch).pipeline:
        why = plan_for(arch).why_not_pipeline
        raise ValueError(
            f"no pipeline split for architecture {arch!r}" + (f": {why}" if why else "")
        )
    return importlib.import_module(f"dlscale.models.torch.{arch}").pipeline_stage(
        model, stage, stages
    )


def stage_ids(pp_rank: int, pp: int, stages_per_rank: int) -> list[int]:
    """The stages pipeline rank `pp_rank` holds: r, r + pp, ... (the looped placement
    ScheduleInterleaved1F1B expects)."""
    return [pp_rank + k * pp for k in range(stages_per_rank)]


def _pieces(module: nn.Module) -> list[str]:
    """A stage module's pieces by name, as the whole model names them (layers by their index in
    the model where the stage keeps it: layer_ids)."""
    ids = getattr(module, "layer_ids", None)
    out = []
    for name, child in module.named_children():
        if isinstance(child, nn.ModuleList):
            out += [f"{name}.{i}" for i in (ids if ids is not None else range(len(child)))]
        elif type(child) is nn.Module:  # a container keeping the model's names (encoder.layers)
            out += [f"{name}.{piece}" for piece in _pieces(child)]
        else:
            out.append(name)
    return out


@dataclass
class Pipeline:
    """This rank's part of the pipeline: its stage modules (split and wrapped), their
    PipelineStages, the schedule, and the facts for the rank's record."""

    modules: list[nn.Module]
    stages: list
    schedule: object
    facts: dict
    wrapper: str
    losses: list = field(default_factory=list)  # the last stage's micro-batch losses

    @property
    def module(self) -> nn.Module:
        """What the optimizer trains: the one stage module, or a ModuleList of this rank's."""
        return self.modules[0] if len(self.modules) == 1 else nn.ModuleList(self.modules)

    @property
    def has_first(self) -> bool:
        return any(s.is_first for s in self.stages)

    @property
    def has_last(self) -> bool:
        return any(s.is_last for s in self.stages)

    def step(self, x: torch.Tensor, y: torch.Tensor) -> None:
        """One schedule step over the pipeline's batch: the first stage's rank feeds `x`, the
        last's computes the loss against `y` (its micro-batch losses kept in `losses`)."""
        self.losses = []
        args = (x,) if self.has_first else ()
        kwargs = {"target": y, "losses": self.losses} if self.has_last else {}
        self.schedule.step(*args, **kwargs)


def data_parallel_mesh(dims: ParallelDims, mesh):
    """The mesh fully_shard wraps a stage over: None without data parallel; dp_shard where the
    stage is sharded; (dp_replicate, dp_shard) where replicas are (FSDP2's hybrid layout,
    shards of one rank when dp_shard is 1)."""
    if dims.dp == 1:
        return None
    if dims.dp_replicate == 1:
        return mesh["dp_shard"]
    return mesh["dp_replicate", "dp_shard"]


def build_pipeline(
    model: nn.Module,
    arch: str,
    dims: ParallelDims,
    mesh,
    device: torch.device,
    schedule_name: str,
    microbatches: int,
    loss_fn,
    mp_policy=None,
) -> Pipeline:
    """This rank's stages of `model` (its weights the same on every rank), tensor parallel and
    fully_shard applied to each, and the schedule over them (module docstring)."""
    from torch.distributed import pipelining

    from dlscale.frameworks.torch_parallel import (
        _matching,
        apply_fully_shard,
        apply_tensor_parallel,
    )

    record = pipeline_schedule(schedule_name)
    pp_mesh = mesh["pp"]
    pp, pp_rank, group = dims.pp, pp_mesh.get_local_rank(), pp_mesh.get_group()
    total = pp * record.stages_per_rank
    ids = stage_ids(pp_rank, pp, record.stages_per_rank)
    dp_mesh = data_parallel_mesh(dims, mesh)
    modules, stages, described = [], [], []
    tensor_parallel, sharded = [], []
    for i in ids:
        module = pipeline_stage(model, arch, i, total)
        pieces = _pieces(module)
        parameters = sum(p.numel() for p in module.parameters())
        # a stage without a module the plan splits (a head-only stage while the plan covers
        # the blocks alone) stays whole on its tensor-parallel ranks
        if dims.tp > 1 and _matching(module, list(plan_for(arch).tp)):
            tensor_parallel += apply_tensor_parallel(module, arch, mesh["tp"])
        elif dims.tp > 1 and any("layers." in p for p in pieces):  # blocks left whole
            raise ValueError(
                f"tensor-parallel plan of {arch} splits nothing of pipeline stage {i} (pieces "
                f"{', '.join(pieces)}): its ranks would repeat one another's work"
            )
        if dp_mesh is not None:
            sharded += apply_fully_shard(module, arch, dp_mesh, mp_policy)
        modules.append(module)
        stages.append(pipelining.PipelineStage(module, i, total, device, group=group))
        described.append({"stage": i, "pieces": pieces, "parameters": parameters})
    schedule_class = getattr(pipelining, record.torch_class)
    schedule = schedule_class(
        stages if record.stages_per_rank > 1 else stages[0], microbatches, loss_fn=loss_fn
    )
    if dp_mesh is None:
        data_parallel = None
    elif dims.dp_replicate == 1:
        data_parallel = "torch.distributed.fsdp.fully_shard (FSDP2) over dp_shard"
    else:
        data_parallel = (
            "torch.distributed.fsdp.fully_shard (FSDP2, hybrid) over (dp_replicate, dp_shard"
            + (" = 1: replicas, gradients all-reduced by FSDP2" if dims.dp_shard == 1 else "")
            + ")"
        )
    facts = {
        "dims": dims.as_dict(),
        "mesh": list(mesh.mesh_dim_names),
        "pipeline": {
            "schedule": record.name,
            "torch_schedule": f"torch.distributed.pipelining.{record.torch_class}",
            "stages": pp,
            "stages_per_rank": record.stages_per_rank,
            "virtual_stages": total,
            "stage": ids[0],
            "stage_ids": ids,
            "microbatches": microbatches,
            "bubble_fraction": record.bubble_fraction(pp, microbatches),
            "bubble_formula": "(p - 1) / (v m + p - 1)",
            "local_stages": described,
            "layers": sum(len(getattr(m, "layers", ())) for m in modules),
            "split": "contiguous pieces (embedding, layers, head) balanced by forward FLOPs "
            "per token (dlscale.models.torch.pipeline_split)",
            "data_parallel": data_parallel,
        },
    }
    if tensor_parallel:
        facts["tensor_parallel"] = tensor_parallel
    if sharded or dp_mesh is not None:
        facts["fully_shard"] = sharded
    if mp_policy is not None and dp_mesh is not None:
        facts["mixed_precision"] = {
            "param_dtype": str(mp_policy.param_dtype).replace("torch.", ""),
            "reduce_dtype": str(mp_policy.reduce_dtype).replace("torch.", ""),
        }
    parts = []
    if dims.tp > 1:
        parts.append("torch.distributed.tensor.parallel over tp")
    if data_parallel:
        parts.append(data_parallel)
    parts.append(
        f"torch.distributed.pipelining (PipelineStage x {record.stages_per_rank}, "
        f"{record.torch_class}) over pp"
    )
    return Pipeline(modules, stages, schedule, facts, ", then ".join(parts))

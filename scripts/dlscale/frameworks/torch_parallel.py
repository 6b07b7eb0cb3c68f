"""PyTorch's own parallel APIs for a cell's parallelism (dlscale.registry.parallel_dims): one
ParallelDims in, one device mesh out (torch.distributed.device_mesh.init_device_mesh, dimensions
dp_replicate, dp_shard, tp), then tensor parallel per block (torch.distributed.tensor.parallel
.parallelize_module with ColwiseParallel/RowwiseParallel, the model's plan in
dlscale.models.parallelize), then fully_shard (FSDP2) per block and on the root over the
data-parallel dimensions: dp_shard alone (fsdp, fsdp+tp) or (dp_replicate, dp_shard) for hsdp.
Replicas of a tensor-parallel model (tp at more than one node) average their gradients over
dp_replicate before each optimizer step. ddp keeps DistributedDataParallel
(dlscale.frameworks.pytorch).

Works on CPUs with gloo (every collective these APIs use) and on GPUs with NCCL."""

from __future__ import annotations

import datetime
import fnmatch

import torch
import torch.distributed as dist
from torch import nn

from dlscale.models.parallelize import plan_for
from dlscale.rank.timing import COLLECTIVE_TIMEOUT_S
from dlscale.registry.parallel_dims import SHARDED, TENSOR_PARALLEL, ParallelDims
from dlscale.registry.strategies import STRATEGIES


def wrapper_of(parallelism: str) -> str:
    """What wraps the model under a strategy beyond ddp, as the rank records it (metrics
    `wrapper`), from the strategy's record: tensor parallel, then fully_shard, or a pipeline."""
    record = STRATEGIES[parallelism]
    tensor_parallel = "torch.distributed.tensor.parallel"
    hybrid = "(FSDP2, hybrid) over (dp_replicate, dp_shard)"
    shard_over = hybrid if record.hybrid else "(FSDP2) over dp_shard"
    parts = []
    if record.splits_layers and record.sharded:
        parts.append(f"{tensor_parallel} over tp, then fully_shard {shard_over}")
    elif record.splits_layers:
        parts.append(f"{tensor_parallel} (ColwiseParallel/RowwiseParallel) over tp")
    elif record.sharded:
        parts.append(f"torch.distributed.fsdp.fully_shard {shard_over}")
    if record.pipeline:
        parts.append("torch.distributed.pipelining (PipelineStage, ScheduleGPipe) over pp")
    if record.replicas_average_gradients:
        parts.append("gradients averaged over dp_replicate")
    return ", ".join(parts) or f"torch.distributed device mesh ({parallelism})"


def build_mesh(dims: ParallelDims, device_type: str):
    """The cell's device mesh: (dp_replicate, dp_shard, tp), outermost first (a tensor-parallel
    group is consecutive ranks, i.e. ranks of one node). Every dimension's process group gets
    the project's collective timeout (init_device_mesh creates its subgroups with the backend's
    default: 10 minutes for NCCL, 30 for gloo), so a peer that never joins fails the cell at
    the same deadline whichever group it stalls."""
    from torch.distributed.device_mesh import init_device_mesh

    shape, names = dims.mesh()
    mesh = init_device_mesh(device_type, shape, mesh_dim_names=names)
    for group in mesh_groups(mesh):
        set_group_timeout(group, COLLECTIVE_TIMEOUT_S)
    return mesh


def mesh_groups(mesh) -> list:
    """The process groups of every dimension of `mesh` (this rank's one per dimension)."""
    return [mesh.get_group(name) for name in mesh.mesh_dim_names]


def set_group_timeout(group, seconds: float) -> None:
    """The timeout of one process group's collectives (None: the default, world group)."""
    dist.distributed_c10d._set_pg_timeout(datetime.timedelta(seconds=seconds), group)


def broadcast_from_rank0(model: nn.Module) -> None:
    """Every rank starts from rank 0's weights and buffers, as DistributedDataParallel does at
    construction (each rank built its model with its own seed)."""
    with torch.no_grad():
        for t in [*model.parameters(), *model.buffers()]:
            dist.broadcast(t.data, 0)


def _matching(model: nn.Module, patterns) -> list[tuple[str, nn.Module]]:
    """The modules whose names match a pattern at its depth (a `*` is one name, no dots)."""
    return [
        (name, module)
        for name, module in model.named_modules()
        if name
        and any(fnmatch.fnmatchcase(name, p) and name.count(".") == p.count(".") for p in patterns)
    ]


def apply_tensor_parallel(model: nn.Module, arch: str, tp_mesh) -> list[str]:
    """Split the Linear layers of the model's tensor-parallel plan
    (dlscale.models.parallelize.<arch>.PLAN.tp) over the tensor-parallel mesh; returns the names
    of the modules split."""
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    styles = {"colwise": ColwiseParallel, "rowwise": RowwiseParallel}
    plan = {}
    for pattern, style in plan_for(arch).tp.items():
        for name, module in _matching(model, [pattern]):
            if not isinstance(module, nn.Linear):
                raise TypeError(f"tensor-parallel plan of {arch}: {name} is not an nn.Linear")
            plan[name] = styles[style]()
    if not plan:
        raise ValueError(f"tensor-parallel plan of {arch} matched no module")
    parallelize_module(model, tp_mesh, plan)
    return sorted(plan)


def shard_units(model: nn.Module, arch: str) -> list[tuple[str, nn.Module]]:
    """The blocks fully_shard wraps one by one before the root: the plan's fsdp_units
    patterns (dlscale.models.parallelize), else the model's top-level children that hold
    parameters."""
    units = plan_for(arch).fsdp_units
    if units:
        return _matching(model, units)
    return [(n, m) for n, m in model.named_children() if any(True for _ in m.parameters())]


def apply_fully_shard(model: nn.Module, arch: str, dp_mesh, mp_policy=None) -> list[str]:
    """fully_shard (FSDP2) each of the model's units, then the root, over `dp_mesh`, with
    `mp_policy` (a MixedPrecisionPolicy; None: float32 throughout, FSDP2's default)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    policy = mp_policy if mp_policy is not None else MixedPrecisionPolicy()
    units = shard_units(model, arch)
    for _, module in units:
        fully_shard(module, mesh=dp_mesh, mp_policy=policy)
    fully_shard(model, mesh=dp_mesh, mp_policy=policy)
    return [name for name, _ in units]


def gradient_averager(model: nn.Module, group, size: int):
    """An optimizer step pre-hook that averages the gradients (their local shards) over a
    process group: the replicas of a tensor-parallel model. One flat all-reduce per step."""

    def hook(optimizer, args, kwargs):
        grads = [_local(p.grad) for p in model.parameters() if p.grad is not None]
        if not grads:
            return
        flat = torch._utils._flatten_dense_tensors(grads)
        dist.all_reduce(flat, group=group)
        flat.div_(size)
        for g, synced in zip(grads, torch._utils._unflatten_dense_tensors(flat, grads)):
            g.copy_(synced)

    return hook


def total_grad_norm(params, stage_group=None) -> torch.Tensor:
    """The 2-norm of the model's whole gradient, the same on every rank, as a tensor (no host
    synchronisation): a DTensor's gradients by their placements (torch.nn.utils.get_total_norm
    per mesh and placements, then full_tensor(): the shards' squares summed over the ranks that
    hold different parts), plain gradients as they are (ddp's are averaged already; a tensor
    parallel group's replicated ones are the same on its ranks), and under a pipeline the
    stages' squares summed over `stage_group` (each stage holds other parameters)."""
    from torch.distributed.tensor import DTensor

    grads = [p.grad for p in params if p.grad is not None]
    groups: dict[tuple, list] = {}
    plain = []
    for g in grads:
        if isinstance(g, DTensor):
            groups.setdefault((g.device_mesh, tuple(g.placements)), []).append(g)
        else:
            plain.append(g)
    squares = []
    for group in groups.values():
        norm = torch.nn.utils.get_total_norm(group, 2.0, foreach=True)
        squares.append(norm.full_tensor().float() ** 2)
    if plain:
        squares.append(torch.nn.utils.get_total_norm(plain, 2.0, foreach=True).float() ** 2)
    if not squares:
        return torch.zeros(())
    total = torch.stack([s.to(squares[0].device) for s in squares]).sum()
    if stage_group is not None:
        dist.all_reduce(total, group=stage_group)
    return total.sqrt()


def gradient_clipper(parameters, max_norm: float, stage_group=None):
    """An optimizer step pre-hook that scales the gradients so that their total 2-norm
    (total_grad_norm) is at most `max_norm`, as torch.nn.utils.clip_grad_norm_ does (factor
    max_norm / (norm + 1e-6), at most 1), on every gradient's local part. Registered after the
    replicas' averaging hook, so it reads the averaged gradients."""
    params = list(parameters)

    def hook(optimizer, args, kwargs):
        with torch.no_grad():
            norm = total_grad_norm(params, stage_group)
            grads = [_local(p.grad) for p in params if p.grad is not None]
            if not grads:
                return
            factor = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
            torch._foreach_mul_(grads, factor.to(grads[0].device))

    return hook


def _local(t: torch.Tensor) -> torch.Tensor:
    """A tensor's local part: a DTensor's shard on this rank, a plain tensor itself."""
    to_local = getattr(t, "to_local", None)
    return to_local() if to_local is not None else t


def nbytes(tensors) -> int:
    """Bytes held on this rank by these tensors (a DTensor's local shard only)."""
    return sum(_local(t).numel() * _local(t).element_size() for t in tensors)


def group_batch(x: torch.Tensor, group, size: int) -> torch.Tensor:
    """The batches of a tensor-parallel group's ranks, concatenated in rank order: every rank
    of the group trains on the same input (their per-rank batches together), so a step trains
    on the same global batch as ddp."""
    parts = [torch.empty_like(x) for _ in range(size)]
    dist.all_gather(parts, x.contiguous(), group=group)
    return torch.cat(parts)


def parallelize(
    model: nn.Module, arch: str, parallelism: str, dims: ParallelDims, mesh, mp_policy=None
) -> dict:
    """Apply a strategy other than ddp to a model whose weights agree on every rank (or that is
    still on the meta device: fsdp and hsdp materialise it afterwards); `mp_policy`: FSDP2's
    MixedPrecisionPolicy for fully_shard. Returns what was done (recorded in the rank's
    metrics)."""
    done = {"dims": dims.as_dict(), "mesh": list(mesh.mesh_dim_names)}
    if parallelism in TENSOR_PARALLEL:
        done["tensor_parallel"] = apply_tensor_parallel(model, arch, mesh["tp"])
    if parallelism in SHARDED:
        hybrid = STRATEGIES[parallelism].hybrid
        dp_mesh = mesh["dp_replicate", "dp_shard"] if hybrid else mesh["dp_shard"]
        done["fully_shard"] = apply_fully_shard(model, arch, dp_mesh, mp_policy)
        if mp_policy is not None:
            done["mixed_precision"] = {
                "param_dtype": str(mp_policy.param_dtype).replace("torch.", ""),
                "reduce_dtype": str(mp_policy.reduce_dtype).replace("torch.", ""),
            }
    return done

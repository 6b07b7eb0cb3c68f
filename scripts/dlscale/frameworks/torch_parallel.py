"""PyTorch's own parallel APIs for a cell's parallelism (dlscale.registry.parallel_dims): one
ParallelDims in, one device mesh out (torch.distributed.device_mesh.init_device_mesh, dimensions
dp_replicate, dp_shard, tp), then tensor parallel (torch.distributed.tensor.parallel
.parallelize_module with the styles of the model's plan in dlscale.models.parallelize: the
cell's tp_plan, "complete" as torchtitan's llama3 plan splits the model, embedding, sequence
parallel norms and a vocabulary-sharded head under loss_parallel, or "blocks", the blocks'
Linear layers only), then activation checkpointing and torch.compile per block (the plan's
fsdp_units; torchtitan's order), then fully_shard (FSDP2) per block and on the root over the
data-parallel dimensions: dp_shard alone (fsdp, fsdp+tp) or (dp_replicate, dp_shard) for hsdp,
and for the replicas of a tensor-parallel model (tp at more than one node) over
(dp_replicate, dp_shard = 1): HSDP with shards of one rank, i.e. replication whose gradients
FSDP2 all-reduces in its bucketed reduction; a pipeline's replicas likewise
(dlscale.frameworks.torch_pipeline). ddp keeps
DistributedDataParallel (dlscale.frameworks.pytorch).

Activation checkpointing (Cell.activation_checkpointing): "full" recomputes every block in the
backward, "selective" every second block (torchtitan's per-layer selective checkpointing,
selective_ac_option 2: the 2nd, 4th, ... block), "selective_op" the cheap operators of every
block, its matrix products' and attention kernels' outputs kept (torchtitan's op-level policy:
OpLevelCheckpoint), by torch.distributed._composable.checkpoint
(non-reentrant torch.utils.checkpoint on the block's forward; the module keeps its names, so a
model materialised after fully_shard finds its parameters by name). Per-block compilation
(Cell.compile_scope "block"): nn.Module.compile() of each block in place (torch.compile of its
forward, names kept), before fully_shard, as torchtitan compiles each TransformerBlock.

Works on CPUs with gloo (every collective these APIs use) and on GPUs with NCCL."""

from __future__ import annotations

import contextlib
import datetime
import fnmatch
import inspect

import torch
import torch.distributed as dist
from torch import nn

from dlscale.models.parallelize import plan_for
from dlscale.rank.timing import COLLECTIVE_TIMEOUT_S
from dlscale.registry.parallel_dims import SHARDED, TENSOR_PARALLEL, ParallelDims
from dlscale.registry.strategies import STRATEGIES


def wrapper_of(parallelism: str, replicas: int = 1) -> str:
    """What wraps the model under a strategy beyond ddp, as the rank records it (metrics
    `wrapper`), from the strategy's record and its replicas (dp_replicate): tensor parallel,
    then fully_shard, or a pipeline."""
    record = STRATEGIES[parallelism]
    tensor_parallel = "torch.distributed.tensor.parallel"
    hybrid = "(FSDP2, hybrid) over (dp_replicate, dp_shard)"
    shard_over = hybrid if record.hybrid else "(FSDP2) over dp_shard"
    parts = []
    if record.splits_layers and record.sharded:
        parts.append(f"{tensor_parallel} over tp, then fully_shard {shard_over}")
    elif record.splits_layers:
        parts.append(f"{tensor_parallel} over tp")
    elif record.sharded:
        parts.append(f"torch.distributed.fsdp.fully_shard {shard_over}")
    if record.pipeline:
        parts.append("torch.distributed.pipelining (PipelineStage, the cell's schedule) over pp")
    if record.replicas_fully_shard and replicas > 1:
        parts.append(
            "replicas by torch.distributed.fsdp.fully_shard (FSDP2, hybrid, shards of one "
            "rank) over (dp_replicate, dp_shard): gradients all-reduced by FSDP2"
        )
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


LINEAR_STYLES = ("colwise", "rowwise", "rowwise_to_sequence", "output_loss_parallel")
EMBEDDING_STYLES = ("embedding", "embedding_to_sequence")


def tp_style(style: str, module: nn.Module):
    """The torch.distributed.tensor.parallel style of a plan's style name
    (dlscale.registry.strategies.TP_STYLES) for `module`."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
    )

    if style == "colwise":
        return ColwiseParallel()
    if style == "rowwise":
        return RowwiseParallel()
    if style == "rowwise_to_sequence":
        return RowwiseParallel(output_layouts=Shard(1))
    if style == "embedding":
        return RowwiseParallel(input_layouts=Replicate())
    if style == "embedding_to_sequence":
        return RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1))
    if style == "sequence_parallel":
        return SequenceParallel()
    if style == "output_loss_parallel":
        return ColwiseParallel(
            input_layouts=Shard(1), output_layouts=Shard(-1), use_local_output=False
        )
    if style in ("gather_sequence", "scatter_sequence"):
        given, wanted = (Shard(1), Replicate())
        if style == "scatter_sequence":
            given, wanted = wanted, given
        rest = (None,) * (_positional_inputs(module) - 1)
        # the scattered input is the block's residual stream: a plain local tensor, as the
        # rowwise_to_sequence outputs added to it
        return PrepareModuleInput(
            input_layouts=(given, *rest),
            desired_input_layouts=(wanted, *rest),
            use_local_output=style == "scatter_sequence",
        )
    raise ValueError(f"unknown tensor-parallel style {style!r}")


def _positional_inputs(module: nn.Module) -> int:
    """How many positional arguments the module's forward takes (a PrepareModuleInput names a
    layout for each: the first is the activation, the others, e.g. RoPE's rotations, pass as
    they are)."""
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    params = inspect.signature(module.forward).parameters.values()
    return max(1, sum(p.kind in kinds for p in params))


def _tied_groups(model: nn.Module) -> list[list[tuple[nn.Module, str]]]:
    """Each parameter held by more than one module (a head tied to the token embedding), as
    its (module, attribute) owners."""
    owners: dict[int, list] = {}
    for module in model.modules():
        for attr, p in module._parameters.items():
            if p is not None:
                owners.setdefault(id(p), []).append((module, attr))
    return [group for group in owners.values() if len(group) > 1]


def apply_tensor_parallel(
    model: nn.Module, arch: str, tp_mesh, tp_plan: str = "blocks"
) -> list[str]:
    """Split the model over the tensor-parallel mesh by its plan `tp_plan`
    (dlscale.models.parallelize.<arch>.PLAN: "blocks" or "complete"); returns the names of the
    modules given a style. A parameter tied between two modules (GPT-2's head and token
    embedding) is split by both styles the same way (Shard(0) of the same [vocab, d] weight)
    and tied again afterwards: parallelize_module gives each module its own DTensor."""
    from torch.distributed.tensor.parallel import parallelize_module

    if arch.startswith("zoo."):  # a study's transformers model: split by its own plan
        from dlscale.models.torch.zoo import tensor_parallel

        return tensor_parallel(model, tp_mesh)
    styles = plan_for(arch).tp_plan(tp_plan)
    tied = _tied_groups(model)
    plan = {}
    for pattern, style in styles.items():
        for name, module in _matching(model, [pattern]):
            if style in LINEAR_STYLES and not isinstance(module, nn.Linear):
                raise TypeError(f"tensor-parallel plan of {arch}: {name} is not an nn.Linear")
            if style in EMBEDDING_STYLES and not isinstance(module, nn.Embedding):
                raise TypeError(f"tensor-parallel plan of {arch}: {name} is not an nn.Embedding")
            plan[name] = tp_style(style, module)
    if not plan:
        raise ValueError(f"tensor-parallel plan of {arch} matched no module")
    parallelize_module(model, tp_mesh, plan)
    for group in tied:
        (first, attr), rest = group[0], group[1:]
        shared = first._parameters[attr]
        for module, other in rest:
            param = module._parameters[other]
            if getattr(param, "placements", None) != getattr(shared, "placements", None):
                raise ValueError(
                    f"tensor-parallel plan {tp_plan!r} of {arch} splits a tied parameter two "
                    f"ways ({getattr(shared, 'placements', 'whole')} and "
                    f"{getattr(param, 'placements', 'whole')}): the tie cannot be kept"
                )
            module._parameters[other] = shared
    return sorted(plan)


def gradients_as_parameters(model: nn.Module) -> list[str]:
    """Make each DTensor parameter's gradient take its parameter's placements once it is
    accumulated (a post-accumulate-grad hook; tensor parallel without fully_shard, which does
    the same for its parameters): an embedding split by rows gets a replicated gradient from
    DTensor's embedding backward (the whole [vocab, d], cut to its rows: no communication), a
    replicated norm weight a partial one (all-reduced once here, not in every optimizer
    operation that reads it). Returns the names of the parameters hooked."""
    from torch.distributed.tensor import DTensor

    def hook(param):
        grad = param.grad
        if isinstance(grad, DTensor) and grad.placements != param.placements:
            param.grad = grad.redistribute(param.device_mesh, param.placements)

    names = []
    for name, param in model.named_parameters():
        if isinstance(param, DTensor):
            param.register_post_accumulate_grad_hook(hook)
            names.append(name)
    return names


@contextlib.contextmanager
def loss_parallel_if(enabled: bool):
    """torch.distributed.tensor.parallel.loss_parallel() around the loss and its backward where
    the logits are vocabulary-sharded (a plan with an output_loss_parallel head), else
    nothing."""
    if not enabled:
        yield
        return
    from torch.distributed.tensor.parallel import loss_parallel

    with loss_parallel():
        yield


CHECKPOINTING = ("none", "selective", "full", "selective_op")


def checkpointed_blocks(count: int, mode: str) -> list[int]:
    """The indices of the blocks activation checkpointing recomputes of `count` blocks: none,
    every second (selective: the 2nd, 4th, ..., torchtitan's per-layer selective_ac_option 2)
    or all (full; and selective_op, which keeps the outputs of SAVED_OPS in every block and
    recomputes the rest)."""
    if mode not in CHECKPOINTING:
        raise ValueError(
            f"unknown activation_checkpointing {mode!r}; allowed values: {', '.join(CHECKPOINTING)}"
        )
    if mode in ("full", "selective_op"):
        return list(range(count))
    if mode == "selective":
        return [i for i in range(count) if (i + 1) % 2 == 0]
    return []


def block_units(model: nn.Module, arch: str) -> list[tuple[str, nn.Module]]:
    """The model's blocks (its plan's fsdp_units), in order; refused where the plan names
    none (activation checkpointing and per-block compilation need blocks)."""
    units = plan_for(arch).fsdp_units
    if not units:
        raise ValueError(
            f"architecture {arch!r} names no blocks (dlscale.models.parallelize.<arch>.PLAN "
            "fsdp_units): no activation checkpointing or per-block compilation"
        )
    return _matching(model, units)


def saved_ops() -> tuple:
    """The operators whose outputs op-level selective checkpointing keeps (torchtitan's `op`
    policy's list, every matrix product kept): matrix products (mm, addmm, bmm, float8's
    _scaled_mm), the fused attention kernels (their output and log-sum-exp: as dear as a matrix
    product to recompute), float8's amax (max) and a reduce-scatter's result; every other
    operator of a block (norms, RoPE, activations, elementwise products) is recomputed."""
    aten = torch.ops.aten
    ops = [aten.mm.default, aten.addmm.default, aten.bmm.default, aten.max.default]
    for name in (
        "_scaled_mm",
        "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_flash_attention_for_cpu",
        "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_cudnn_attention",
    ):
        if hasattr(aten, name):
            ops.append(getattr(aten, name).default)
    functional = getattr(torch.ops, "_c10d_functional", None)
    if functional is not None and hasattr(functional, "reduce_scatter_tensor"):
        ops.append(functional.reduce_scatter_tensor.default)
    return tuple(ops)


class OpLevelCheckpoint:
    """Op-level selective checkpointing of one block (torch.utils.checkpoint
    .create_selective_checkpoint_contexts): the outputs of saved_ops() are kept in the forward
    (CheckpointPolicy.MUST_SAVE), every other operator recomputed in the backward
    (PREFER_RECOMPUTE). `saved_bytes`: the bytes of the outputs its last forward kept (each
    storage once), read by the memory checks."""

    def __init__(self) -> None:
        self.saved: dict[int, int] = {}
        self.ops = frozenset(saved_ops())

    def policy(self, ctx, op, *args, **kwargs):
        from torch.utils.checkpoint import CheckpointPolicy

        if op not in self.ops:
            return CheckpointPolicy.PREFER_RECOMPUTE
        if not ctx.is_recompute:
            output = getattr(ctx, "op_output", None)
            for t in torch.utils._pytree.tree_leaves(output):
                if isinstance(t, torch.Tensor) and t.device.type != "meta":
                    storage = _local(t).untyped_storage()
                    self.saved[storage._cdata] = storage.nbytes()
        return CheckpointPolicy.MUST_SAVE

    def context_fn(self):
        from torch.utils.checkpoint import create_selective_checkpoint_contexts

        self.saved = {}  # a new forward of the block
        return create_selective_checkpoint_contexts(self.policy)

    @property
    def saved_bytes(self) -> int:
        return sum(self.saved.values())


def apply_activation_checkpointing(model: nn.Module, arch: str, mode: str) -> list[str]:
    """Activation checkpointing of the model's blocks (checkpointed_blocks) by
    torch.distributed._composable.checkpoint (non-reentrant torch.utils.checkpoint around the
    block's forward, the module's names kept; selective_op with an OpLevelCheckpoint's
    context_fn per block, kept on the block as `op_checkpoint`); returns the names of the blocks
    checkpointed."""
    from torch.distributed._composable import checkpoint

    if mode == "none":
        return []
    blocks = block_units(model, arch)
    chosen = [blocks[i] for i in checkpointed_blocks(len(blocks), mode)]
    for _, module in chosen:
        if mode == "selective_op":
            module.op_checkpoint = OpLevelCheckpoint()
            checkpoint(module, context_fn=module.op_checkpoint.context_fn)
        else:
            checkpoint(module)
    return [name for name, _ in chosen]


def compile_blocks(model: nn.Module, arch: str) -> list[str]:
    """torch.compile of each block, in place (nn.Module.compile: the module's call compiled,
    its names kept), as torchtitan compiles each TransformerBlock before fully_shard; returns
    the blocks' names."""
    blocks = block_units(model, arch)
    for _, module in blocks:
        module.compile()
    return [name for name, _ in blocks]


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
    model: nn.Module,
    arch: str,
    parallelism: str,
    dims: ParallelDims,
    mesh,
    mp_policy=None,
    tp_plan: str = "blocks",
    checkpointing: str = "none",
    per_block_compile: bool = False,
) -> dict:
    """Apply a strategy other than ddp to a model whose weights agree on every rank (or that is
    still on the meta device: fsdp and hsdp materialise it afterwards); `mp_policy`: FSDP2's
    MixedPrecisionPolicy for fully_shard; `tp_plan`: the model's tensor-parallel plan;
    `checkpointing` and `per_block_compile`: the blocks' activation checkpointing and
    compilation, after tensor parallel and before fully_shard (wrap_blocks). Returns what was
    done (recorded in the rank's metrics)."""
    record = STRATEGIES[parallelism]
    done = {"dims": dims.as_dict(), "mesh": list(mesh.mesh_dim_names)}
    if parallelism in TENSOR_PARALLEL:
        done["tensor_parallel"] = apply_tensor_parallel(model, arch, mesh["tp"], tp_plan)
        done["tp_plan"] = tp_plan
        done["loss_parallel"] = tp_plan == "complete" and plan_for(arch).loss_parallel
    done.update(wrap_blocks(model, arch, checkpointing, per_block_compile))
    dp_mesh = None
    if parallelism in SHARDED:
        dp_mesh = mesh["dp_replicate", "dp_shard"] if record.hybrid else mesh["dp_shard"]
    elif record.replicas_fully_shard and dims.dp_replicate > 1:
        dp_mesh = mesh["dp_replicate", "dp_shard"]  # HSDP with shards of one rank
        done["replicas"] = "fully_shard over (dp_replicate, dp_shard = 1)"
    if dp_mesh is None and parallelism in TENSOR_PARALLEL:
        done["gradients_as_parameters"] = len(gradients_as_parameters(model))
    if dp_mesh is not None:
        done["fully_shard"] = apply_fully_shard(model, arch, dp_mesh, mp_policy)
        if mp_policy is not None:
            done["mixed_precision"] = {
                "param_dtype": str(mp_policy.param_dtype).replace("torch.", ""),
                "reduce_dtype": str(mp_policy.reduce_dtype).replace("torch.", ""),
            }
    return done


def wrap_blocks(model: nn.Module, arch: str, checkpointing: str, per_block_compile: bool) -> dict:
    """Activation checkpointing, then torch.compile, of the model's blocks (torchtitan's
    order: after tensor parallel, before fully_shard or the data-parallel wrapper); returns
    what was done."""
    done = {}
    if checkpointing != "none":
        done["activation_checkpointing"] = {
            "mode": checkpointing,
            "blocks": apply_activation_checkpointing(model, arch, checkpointing),
        }
    if per_block_compile:
        done["compiled_blocks"] = compile_blocks(model, arch)
    return done

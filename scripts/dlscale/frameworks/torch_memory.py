"""What a PyTorch rank should hold in memory (predicted) beside what it holds (measured).

Measured (`measured_state`): the bytes of the parameters, gradients and optimizer-state tensors
this rank holds, as allocated (a DTensor's local shard: to_local(); the optimizer's 0-dim step
counters left out, 4-8 bytes per parameter tensor). On GPUs beside them: the peak allocated and
reserved device memory of the timed window (dlscale.frameworks.torch_model: the statistics are
reset after the warm-up and re-warm steps). On CPUs the state bytes are the comparable figure:
the process's peak resident set is mostly the interpreter and torch (~360 MB in every cell of
the parallelism study).

Predicted (`predicted_parts`), per rank, from the model's full parameter shapes and the
strategy's layout, never from the tensors' storage:
- parameters: each parameter's elements on this rank x its dtype's bytes. fsdp and hsdp shard
  dim 0 over dp_shard as FSDP2 does (torch.chunk: ceil(n / d) rows per rank, the last ranks
  fewer or none; `padding_bytes`: the rows FSDP2 pads each sharded parameter to ceil(n / d) x
  d with, allocated but in no to_local()); tensor parallel: the local shape its placements
  give (torch's compute_local_shape_and_global_offset); ddp, one device and a pipeline stage:
  whole;
- gradients: as the parameters (float32 master weights: FSDP2's reduce_dtype and autocast's
  .grad are float32);
- optimizer state: the optimizer's float32 tensors per parameter (dlscale.registry.optimizers:
  SGD's momentum buffer 4 B, none without momentum; AdamW's two moments 8 B);
- activations (`activation_bytes`): the tensors autograd saves for backward in one forward of
  the rank's batch, counted on the meta device (torch.autograd.graph.saved_tensors_hooks, each
  storage once, parameters excluded); attention as PyTorch's fused kernels hold it (query, key,
  value, output and the log-sum-exp rows, no sequence x sequence matrix); in the cell's
  precision (bf16 and fp16: every activation in it, which undercounts what autocast keeps in
  float32: norms, softmax, the loss). Estimated by rank 0 for one device, ddp, fsdp and hsdp
  (every rank's whole batch through the whole model: the same on every rank; a meta-device
  forward imports torch._dynamo, seconds, which rank 0 pays for its FLOP count anyway); not
  under tensor parallel or a pipeline. Under activation checkpointing (none, selective: every
  second block, full: every block) a checkpointed block keeps only its input: the storages its
  operations save are left out, its input counted (`bytes_without_checkpointing` beside);
  under selective_op every block keeps its input and the outputs of its matrix products and
  attention kernel (torch_parallel.saved_ops), counted as they are made.
What no part counts: temporaries freed within the forward or backward (the logits' gradient,
an FSDP unit's all-gathered parameters, the fp16 gradient scaler), the allocator's caching
(reserved minus allocated), the CUDA context and the communication buffers (the hardware
entry's memory_headroom_gib, dlscale.study.partitions).

The exact shard fraction (`full_state_bytes` / `shard_degree`): the whole model's state divided
by fsdp's or hsdp's dp_shard: what a rank would hold if every parameter split evenly.
"""

from __future__ import annotations

import contextlib

import torch

from dlscale.registry.optimizers import OPTIMIZERS

ACTIVATION_METHOD = (
    "saved-for-backward tensors of one forward of the rank's batch on the meta device "
    "(torch.autograd.graph.saved_tensors_hooks; each storage once, parameters excluded; "
    "attention as the fused kernels hold it: q, k, v, output, log-sum-exp)"
)
STATE_METHOD = (
    "full parameter shapes x the strategy's layout (fsdp/hsdp: torch.chunk of dim 0 over "
    "dp_shard, FSDP2's rule; tensor parallel: the placements' local shapes) x dtype bytes; "
    "gradients as parameters; optimizer state: its float32 tensors per parameter"
)


def local_rows(rows: int, shards: int, index: int) -> int:
    """Rows of shard `index` of `shards` when dim 0 of `rows` is split as torch.chunk (and
    FSDP2) split it: ceil(rows / shards) each, the last shards fewer or none."""
    chunk = -(-rows // shards)
    return max(0, min(chunk, rows - index * chunk))


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n


def _local_numel(param: torch.Tensor) -> int:
    """A parameter's elements on this rank as its placements cut it (a plain tensor: all)."""
    from torch.distributed.tensor import DTensor

    if not isinstance(param, DTensor):
        return param.numel()
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    shape, _ = compute_local_shape_and_global_offset(
        param.shape, param.device_mesh, param.placements
    )
    return _numel(shape)


def predicted_parts(
    params,
    optimizer: str,
    momentum: float,
    fsdp_shard: tuple[int, int] | None = None,
    activation: dict | None = None,
) -> dict:
    """This rank's predicted bytes (module docstring) of `params` (the unique parameters of the
    module it trains: full shapes, a DTensor's global shape). `fsdp_shard`: (dp_shard, this
    rank's place in it) under fsdp and hsdp; `activation`: activation_bytes' record."""
    record = OPTIMIZERS[optimizer]
    per_param = record.state_bytes(1, momentum)
    local = full = padding = param_bytes = 0
    for p in params:
        size = p.element_size()
        n = _numel(p.shape)
        if fsdp_shard is not None and p.dim() > 0:
            d, i = fsdp_shard
            rest = n // p.shape[0] if p.shape[0] else 0
            k = local_rows(p.shape[0], d, i) * rest
            padding += (-(-p.shape[0] // d) * rest - k) * size
        elif fsdp_shard is not None:  # a 0-dim parameter: FSDP2 keeps it whole
            k = n
        else:
            k = _local_numel(p)
        local += k
        param_bytes += k * size
        full += n * (2 * size + per_param)
    state = 2 * param_bytes + per_param * local
    out = {
        "param_bytes": param_bytes,
        "grad_bytes": param_bytes,
        "optimizer_state_bytes": per_param * local,
        "optimizer_state_dtype": "float32" if per_param else None,
        "state_bytes": state,
        "padding_bytes": padding if fsdp_shard is not None else None,
        "full_state_bytes": full,
        "shard_degree": fsdp_shard[0] if fsdp_shard is not None else None,
        "method": STATE_METHOD,
    }
    activation = activation or {"available": False, "reason": "not estimated"}
    out["activation_bytes"] = activation.get("bytes")
    out["activation"] = activation
    out["total_bytes"] = state + (activation.get("bytes") or 0)
    return out


def measured_state(module: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """Parameter, gradient and optimizer-state bytes held by this rank (a DTensor's local
    shard), and the optimizer state's dtypes."""
    from dlscale.frameworks.torch_parallel import nbytes

    params = list(module.parameters())
    opt = [
        v
        for s in optimizer.state.values()
        for v in s.values()
        if torch.is_tensor(v) and v.dim() > 0
    ]
    dtypes = sorted({str(t.dtype).replace("torch.", "") for t in opt})
    return {
        "param_bytes": nbytes(params),
        "grad_bytes": nbytes(p.grad for p in params if p.grad is not None),
        "optimizer_state_bytes": nbytes(opt),
        "optimizer_state_dtype": ", ".join(dtypes) or None,
    }


class _FusedAttention(torch.autograd.Function):
    """What a fused attention kernel saves for backward (q, k, v, the output and the float32
    log-sum-exp per query row), for counting on the meta device, where scaled_dot_product_attention
    falls back to the math path and saves the sequence x sequence weights."""

    @staticmethod
    def forward(ctx, q, k, v):
        # (batch, heads, sequence, dim) laid out as (batch, sequence, heads, dim), as the
        # kernels write it: the usual transpose(1, 2).reshape after attention is then a view
        *batch, heads, seq, _ = q.shape
        out = q.new_empty((*batch, seq, heads, v.shape[-1])).transpose(-3, -2)
        lse = q.new_empty(q.shape[:-1], dtype=torch.float32)
        ctx.save_for_backward(q, k, v, out, lse)
        return out

    @staticmethod
    def backward(ctx, grad):  # pragma: no cover - only forwards are counted
        raise RuntimeError("counting only")


@contextlib.contextmanager
def _fused_attention(outputs=None):
    """scaled_dot_product_attention as a fused kernel holds it (_FusedAttention); `outputs`, a
    callable, is told each call's output and log-sum-exp (what op-level checkpointing keeps of
    a fused attention kernel)."""
    functional = torch.nn.functional
    original = functional.scaled_dot_product_attention

    def counted(q, k, v, *args, **kwargs):
        out = _FusedAttention.apply(q, k, v)
        if outputs is not None:
            outputs(out, q.new_empty(q.shape[:-1], dtype=torch.float32))
        return out

    functional.scaled_dot_product_attention = counted
    try:
        yield
    finally:
        functional.scaled_dot_product_attention = original


def activation_bytes(
    model: str,
    seq_len: int | None,
    batch: int,
    dtype=None,
    checkpointing: str = "none",
    gqa: bool = False,
) -> dict:
    """The activation estimate (module docstring) of `batch` samples of a registered model in
    `dtype` (None: float32) under activation checkpointing `checkpointing` (none, selective,
    full, selective_op: dlscale.frameworks.torch_parallel.checkpointed_blocks): {"available",
    "bytes", "method", "checkpointing", "bytes_without_checkpointing"} or why not (a failed
    count is a missing number, never a failed cell). A checkpointed block keeps its input (the
    checkpoint's) instead of what its operations save, and under selective_op also the outputs
    of the operators it keeps (torch_parallel.saved_ops: matrix products, the attention
    kernel's output and log-sum-exp); each storage is attributed to the block whose forward
    saved or made it (module hooks on the plan's blocks). `gqa`: the attention takes the
    key/value heads as they are (enable_gqa) instead of repeated."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from dlscale.frameworks.torch_attention import set_gqa
    from dlscale.frameworks.torch_parallel import block_units, checkpointed_blocks, saved_ops
    from dlscale.models import spec_for
    from dlscale.models.torch import build, example_batch

    try:
        spec = spec_for(model, seq_len)
        with torch.device("meta"):
            net = build(model, seq_len)
        set_gqa(net, gqa)
        if dtype is not None:
            net = net.to(dtype)
        net.train()
        x, y = example_batch(spec, batch, device="meta")
        if dtype is not None and x.is_floating_point():
            x = x.to(dtype)
        blocks = block_units(net, spec.arch) if checkpointing != "none" else []
        recomputed = set(checkpointed_blocks(len(blocks), checkpointing))
        params = {p.untyped_storage()._cdata for p in net.parameters()}
        saved: dict[int, int] = {}  # storage -> bytes
        owner: dict[int, int | None] = {}  # storage -> the block that saved it (None: none)
        inputs: dict[int, int] = {}  # a checkpointed block's input storage -> bytes
        current: list[int | None] = [None]

        def enter(i):
            def hook(module, args):
                current[0] = i
                if i in recomputed and args and torch.is_tensor(args[0]):
                    storage = args[0].untyped_storage()
                    inputs[storage._cdata] = storage.nbytes()

            return hook

        def leave(module, args, output):
            current[0] = None

        handles = []
        for i, (_, block) in enumerate(blocks):
            handles.append(block.register_forward_pre_hook(enter(i)))
            handles.append(block.register_forward_hook(leave))

        def pack(t):
            storage = t.untyped_storage()
            if storage._cdata not in params:
                saved[storage._cdata] = storage.nbytes()
                if owner.get(storage._cdata, "unset") is not None:  # outside a block wins
                    owner[storage._cdata] = current[0]
            return t

        op_outputs: dict[int, int] = {}  # selective_op: the kept operators' outputs in blocks
        alive: list = []  # held until counted: a freed storage's address is reused
        keep_ops = frozenset(saved_ops()) if checkpointing == "selective_op" else frozenset()

        def keep(*tensors):
            if current[0] in recomputed:
                for t in tensors:
                    storage = t.untyped_storage()
                    op_outputs[storage._cdata] = storage.nbytes()
                    alive.append(t)

        class KeptOutputs(TorchDispatchMode):
            def __torch_dispatch__(self, func, _types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                if func in keep_ops:
                    keep(*(t for t in torch.utils._pytree.tree_leaves(out) if torch.is_tensor(t)))
                return out

        kept_outputs = KeptOutputs() if keep_ops else contextlib.nullcontext()
        try:
            with (
                torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t),
                _fused_attention(keep if keep_ops else None),
                kept_outputs,
            ):
                torch.nn.functional.cross_entropy(net(x), y)
        finally:
            for handle in handles:
                handle.remove()
    except Exception as exc:  # noqa: BLE001 - an estimate that fails is reported, not raised
        return {"available": False, "reason": f"{type(exc).__name__}: {exc}"}
    kept = {k: v for k, v in saved.items() if owner.get(k) not in recomputed}
    kept.update(inputs)
    kept.update(op_outputs)
    return {
        "available": True,
        "bytes": sum(kept.values()),
        "bytes_without_checkpointing": sum(saved.values()),
        "checkpointing": checkpointing,
        "checkpointed_blocks": sorted(recomputed),
        "dtype": str(dtype or torch.float32).replace("torch.", ""),
        "gqa": gqa,
        "method": ACTIVATION_METHOD
        + (
            "; a checkpointed block counted by its input and the outputs of the operators it "
            "keeps (matrix products, the attention kernel's output and log-sum-exp: "
            "torch_parallel.saved_ops; the rest is recomputed in the backward)"
            if checkpointing == "selective_op"
            else "; a checkpointed block counted by its input alone (what its operations save "
            "is recomputed in the backward)"
            if checkpointing != "none"
            else ""
        ),
    }

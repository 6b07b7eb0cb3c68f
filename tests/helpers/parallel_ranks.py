"""Real ranks of a parallelism (dlscale.registry.parallel_dims) for the equivalence tests: each rank
is its own process running the production PyTorch adapter (setup: device mesh, tensor parallel,
fully_shard, pipeline; three training steps), on gloo over TCP, with a dropout-free tiny
transformer (the registry's transformer_small architecture at a smaller size: dropout draws
different masks on a sharded activation by construction, so it is off for a comparison of
losses).

    python parallel_ranks.py RANK WORLD RANKS_PER_NODE PORT PARALLELISM TP_DEGREE OUT.json \
        [MODEL [OPTIMIZER [PRECISION [CHECKPOINTING]]]]

PORT and PARALLELISM may be comma-separated lists of the same length: the entries then run one
after another in the same processes (one interpreter start and torch import for all), each
rank's result one record per entry, by the entry as written. An entry is
STRATEGY[:OPTION...][@CHECKPOINTING][/OPTIMIZER]: a strategy with its pipeline's options
(parse_token: `pp:interleaved_1f1b`, `pp+fsdp+tp:1f1b:pp2:mb4`; `ddp:fs1` at world size 1:
FSDP2 at degree 1, single_device fully_shard), the blocks' activation
checkpointing for this entry (`ddp@full`) and its own optimizer (`fsdp/sgd0`); without them the
command line's CHECKPOINTING and OPTIMIZER. MODEL: transformer_small, made tiny as above, or a
tiny decoder of the registry as it is, gpt2_tiny or llama3_debug (they have no dropout).
OPTIMIZER (OPTIMIZERS): sgd (momentum 0.9), sgd0 (plain SGD: no momentum, no clipping, so the
update is the learning rate times the gradient and a wrong gradient scale moves it by that
factor), or adamw with its gradients clipped to norm 1 (nearly blind to a constant factor on
the gradients: Adam divides it out, clipping removes it). PRECISION: fp32, or bf16 under
fully_shard with FSDP2's MixedPrecisionPolicy as a study gives it: the dtype the first
Linear's weight has in the forward is written beside the loss. CHECKPOINTING: none, selective
or full activation checkpointing of the blocks. A tensor-parallel strategy runs the plan a
study gives it: the complete plan where the model has one.

Writes this rank's loss on its batch after the steps (averaged over the ranks: the loss on the
global batch; its cross-entropy taken in float32 from the logits, whatever precision the
forward ran in, so that a bf16 run's loss is read to float32's resolution; the production
loss in the forward's precision beside it, `loss_in_precision`) and its memory record (measured
and predicted state bytes) right after the steps.

`reference_loss` computes the same loss in one process: rank 0's initial weights (a model with
init_weights(): each parameter seeded by its name, as every rank draws it), the ranks' batches
together as one batch, torch's own SGD (momentum 0.9, or none for sgd0) or AdamW and
clip_grad_norm_; for bf16, each step's forward and backward on a bfloat16 copy of the float32
weights, the gradients taken back in float32 (what FSDP2's MixedPrecisionPolicy with
param_dtype bf16 and reduce_dtype float32 computes). Its `fault` computes what a broken
gradient reduction would train to instead (FAULTS: the effect each equivalence check must be
able to see).

DLSCALE_TEST_BREAK=NAME (a name of FAULTS) injects that break into the rank processes
(apply_break monkeypatches the production functions in this process before any training;
production code never reads the variable): benchmarks/loss_breaks.py runs the equivalence tests
with each break and tabulates which checks see it."""

from __future__ import annotations

import dataclasses
import json
import os
import sys

STEPS = 3
PER_RANK_BATCH = 4
LEARNING_RATE, MOMENTUM = 0.05, 0.9
# AdamW: torchtitan's Llama 3 settings, a learning rate for three stable steps, clipping at 1
# (the tiny decoder's first gradient norm is about 1.7: the clipping acts)
ADAMW = {
    "adam_beta1": 0.9,
    "adam_beta2": 0.95,
    "adam_eps": 1e-8,
    "weight_decay": 0.1,
    "grad_clip_norm": 1.0,
}
ADAMW_LEARNING_RATE = 1e-3
# an entry's optimizer -> (the cell's optimizer, its momentum)
OPTIMIZERS = {"sgd": ("sgd", MOMENTUM), "sgd0": ("sgd", 0.0), "adamw": ("adamw", MOMENTUM)}
TINY = {"d_model": 64, "num_layers": 2, "num_heads": 2, "dim_feedforward": 128, "dropout": 0.0}
SEQ_LEN, VOCAB = 16, 256

# The breaks of the gradient's reduction an equivalence check must be able to see, injected
# into the rank processes by DLSCALE_TEST_BREAK (apply_break) and computed in one process by
# reference_loss(fault=...); the data-parallel degree is the world size there.
FAULTS = {
    "no_average": "the data-parallel gradients summed, not averaged (x the data-parallel "
    "degree): DistributedDataParallel's all-reduce, fully_shard's reduce-scatter and "
    "all-reduce",
    "double_average": "the data-parallel gradients averaged twice (/ the degree twice)",
    "skip_microbatch_scale": "a pipeline's first micro-batch of each step left out of the "
    "division by the micro-batches (its gradient counted micro-batches times)",
    "no_sync": "no gradient sync: each rank's gradient (fully_shard: its shard's rows) from its "
    "own batch alone",
}
BREAK_VARIABLE = "DLSCALE_TEST_BREAK"
# Every entry's adapter, kept until the process ends, which it leaves by os._exit as a
# production rank does (dlscale.run.train.exit_now): freeing a DistributedDataParallel wrapper
# after its process group is destroyed now and then hangs in gloo's destructor (joining its
# worker thread: ~Reducer, ~ProcessGroupGloo), and the rank then never starts its next entry.
_KEPT: list = []


def use_tiny_model() -> None:
    """transformer_small's registry entry, made tiny and dropout-free, in this process."""
    from dlscale import models

    spec = models.SPECS["transformer_small"]
    models.SPECS["transformer_small"] = dataclasses.replace(
        spec, input_shape=(SEQ_LEN,), vocab_size=VOCAB, arch_kwargs=TINY
    )


MICROBATCHES = 2  # a pipeline's micro-batches per step, unless its token names others


def parse_token(token: str, tp_degree: int) -> dict:
    """A strategy token of the command line: NAME[:OPTION...], options `ppN` (stages), `mbN`
    (micro-batches) and a schedule name (gpipe, 1f1b, interleaved_1f1b; default gpipe). A
    pipelined strategy without tensor parallel takes TP_DEGREE as its stages (`pp` with
    TP_DEGREE 2: 2 stages); with tensor parallel, TP_DEGREE is tp and `ppN` the stages."""
    from dlscale.registry.strategies import STRATEGIES

    name, *options = token.split(":")
    record = STRATEGIES[name]
    out = {
        "parallelism": name,
        "tp_degree": tp_degree if record.splits_layers else 1,
        "pp_degree": 1,
        "microbatches": 1,
        "pp_schedule": "gpipe",
    }
    if record.pipeline:
        out["pp_degree"] = tp_degree if not record.splits_layers else 2
        out["microbatches"] = MICROBATCHES
    for option in options:
        if option == "fs1":  # world size 1 under FSDP2 at degree 1 (single_device fully_shard)
            out["single_device"] = "fully_shard"
        elif option.startswith("pp"):
            out["pp_degree"] = int(option[2:])
        elif option.startswith("mb"):
            out["microbatches"] = int(option[2:])
        else:
            out["pp_schedule"] = option
    return out


def entry_parts(entry: str, optimizer: str, checkpointing: str) -> tuple[str, str, str]:
    """An entry of the command line, STRATEGY[:OPTION...][@CHECKPOINTING][/OPTIMIZER], as
    (strategy token, optimizer, checkpointing); what it does not name, the command line's."""
    rest, _, own_optimizer = entry.partition("/")
    token, _, own_checkpointing = rest.partition("@")
    return token, own_optimizer or optimizer, own_checkpointing or checkpointing


def train_spec(
    parallelism: str,
    tp_degree: int,
    model: str = "transformer_small",
    optimizer: str = "sgd",
    precision: str = "fp32",
    checkpointing: str = "none",
):
    """The rank-side cell of a strategy token (parse_token) and an optimizer of OPTIMIZERS."""
    from dlscale.frameworks.train_spec import TrainSpec
    from dlscale.study.cell_fields import cell_tp_plan, fsdp_mixed_precision

    parsed = parse_token(parallelism, tp_degree)
    name, momentum = OPTIMIZERS[optimizer]
    adamw = name == "adamw"
    one_device = parsed.get("single_device") == "fully_shard" and precision != "fp32"
    return TrainSpec(
        framework="pytorch",
        model=model,
        per_rank_batch=PER_RANK_BATCH,
        warmup_steps=0,
        steps=STEPS,
        precision=precision,
        device="cpu",
        threads=1,
        learning_rate=ADAMW_LEARNING_RATE if adamw else LEARNING_RATE,
        momentum=momentum,
        **parsed,
        optimizer=name,
        **(ADAMW if adamw else {}),
        fsdp_mixed_precision=fsdp_mixed_precision(parsed["parallelism"], precision) or one_device,
        tp_plan=cell_tp_plan(parsed["parallelism"], model),
        activation_checkpointing=checkpointing,
    )


def run_rank(
    rank,
    world,
    rpn,
    port,
    parallelism,
    tp_degree,
    model="transformer_small",
    optimizer="sgd",
    precision="fp32",
    checkpointing="none",
) -> dict:
    import torch
    import torch.distributed as dist

    from dlscale.frameworks.base import RankContext
    from dlscale.frameworks.pytorch import Adapter

    use_tiny_model()
    ctx = RankContext(rank, world, rank % rpn, rpn, rank // rpn, "n", "127.0.0.1", port, "test")
    spec = train_spec(parallelism, tp_degree, model, optimizer, precision, checkpointing)
    adapter = Adapter(spec, ctx)
    adapter.setup()
    try:
        linear = next(m for m in adapter.model.modules() if isinstance(m, torch.nn.Linear))
        dtypes = []
        hook = linear.register_forward_pre_hook(lambda m, a: dtypes.append(str(m.weight.dtype)))
        for _ in range(STEPS - 1):
            adapter.step()
        # the last step's saved-for-backward bytes (each storage once, parameters left out):
        # what the forward keeps outside activation checkpointing's own hooks
        params = {_storage(p) for p in adapter.module.parameters()}
        saved: dict[int, int] = {}

        def pack(t):
            key = _storage(t)
            if key not in params:
                saved[key] = _local(t).untyped_storage().nbytes()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            adapter.step()
        hook.remove()
        # before the loss's forward: FSDP2 keeps the root's parameters unsharded after a
        # forward outside backward
        memory = adapter.memory_per_rank()
        extra = {}
        if adapter.pipelined:
            # one more step: its forward's loss is the loss after STEPS updates (the last
            # stage's micro-batch losses; their mean is its pipeline's batch's loss), averaged
            # over the ranks that hold the last stage (its data-parallel and tp ranks)
            adapter.step()
            pipe = adapter.pipe
            loss = torch.stack(pipe.losses).mean().detach() if pipe.has_last else torch.zeros(())
            loss = loss.float()
            dist.all_reduce(loss)
            loss /= world // adapter.dims.pp
        else:
            # the production loss (in the forward's precision), and for bf16 the same loss
            # read in float32
            loss = _global_mean(adapter.loss_value(adapter.x, adapter.y), world)
            if precision != "fp32":
                extra["loss_in_precision"] = float(loss)
                loss = _global_mean(float32_loss(adapter), world)
        return {
            "loss": float(loss),
            **extra,
            "saved_activation_bytes": sum(saved.values()),
            "forward_weight_dtype": dtypes[-1] if dtypes else None,
            "memory": memory,
            "wrapper": adapter.wrapper(),
            "execution": adapter.execution()["parallelism"],
            "training": adapter.execution()["training"],
        }
    finally:
        adapter.teardown()
        _KEPT.append(adapter)


def _global_mean(loss, world: int):
    """A rank's loss averaged over the ranks (each holds an equal part of the global batch)."""
    import torch.distributed as dist

    if world > 1:
        dist.all_reduce(loss)
        loss /= world
    return loss


def float32_loss(adapter):
    """The adapter's loss on its batch with the cross-entropy taken in float32 from the
    forward's logits (a bf16 forward under FSDP2's MixedPrecisionPolicy gives bf16 logits, and
    a bf16 loss is rounded to within 2^-8 = 4e-3 of itself: more than the differences the
    checks look for)."""
    import torch

    with torch.no_grad(), adapter.loss_scope():
        with adapter._autocast():
            logits = adapter.forward(adapter.x)
        loss = adapter.loss_fn(logits.float(), adapter.y)
    full = getattr(loss, "full_tensor", None)
    return (full() if full is not None else loss).detach().clone().float()


def _local(t):
    return t.to_local() if hasattr(t, "to_local") else t


def _storage(t) -> int:
    return _local(t).untyped_storage()._cdata


# ---- breaks, injected into a rank process (DLSCALE_TEST_BREAK) ------------------------------
def apply_break(name: str) -> None:
    """Monkeypatch this process's production functions so that training runs with break `name`
    (FAULTS): DistributedDataParallel (dlscale.frameworks.pytorch wraps ddp's model in it) gets
    a communication hook that reduces its gradient buckets wrongly; apply_fully_shard
    (dlscale.frameworks.torch_parallel: fully_shard of every strategy that shards or
    replicates through FSDP2, a pipeline's stages too) sets FSDP2's gradient divide factor
    (with sum-only collectives), or a reduce-scatter that keeps this rank's own rows;
    build_pipeline (dlscale.frameworks.torch_pipeline) gets a loss function whose first
    micro-batch of each step carries micro-batches times its gradient (its value unchanged).
    A break that has nothing to act on under a strategy (no data parallel, no pipeline) leaves
    it as it is."""
    if name not in FAULTS:
        raise ValueError(f"{BREAK_VARIABLE}={name!r}; allowed values: {', '.join(FAULTS)}")
    if name == "skip_microbatch_scale":
        _break_microbatch_scale()
    else:
        _break_ddp(name)
        _break_fully_shard(name)


def _break_ddp(name: str) -> None:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from dlscale.frameworks import pytorch

    def hook(state, bucket):
        # the bucket reduced here, synchronously, and handed back as a completed future
        buffer = bucket.buffer()
        if name != "no_sync":
            dist.all_reduce(buffer)
            world = dist.get_world_size()
            buffer.mul_(1.0 if name == "no_average" else 1.0 / world**2)
        done = torch.futures.Future()
        done.set_result(buffer)
        return done

    class BrokenDistributedDataParallel(DistributedDataParallel):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.register_comm_hook(None, hook)

    pytorch.DistributedDataParallel = BrokenDistributedDataParallel


def _break_fully_shard(name: str) -> None:
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.fsdp._fully_shard._fsdp_collectives import DefaultReduceScatter

    from dlscale.frameworks import torch_parallel

    class OwnRows(DefaultReduceScatter):
        """A reduce-scatter that reduces nothing: this rank's rows of its own gradient."""

        def __call__(self, output_tensor, input_tensor, group, op, async_op=False):
            import torch.distributed as dist

            rows = input_tensor.view(group.size(), -1)[dist.get_rank(group)]
            output_tensor.copy_(rows)
            return None

    original = torch_parallel.apply_fully_shard

    def apply_fully_shard(model, arch, dp_mesh, mp_policy=None):
        done = original(model, arch, dp_mesh, mp_policy)
        degree = dp_mesh.size()
        divide = {"no_average": 1.0, "double_average": float(degree**2), "no_sync": 1.0}[name]
        # FSDP2 divides by a custom factor once more where its shard group has one rank (the
        # replicas of a tensor-parallel model or a pipeline: dp_shard = 1)
        factor = divide**0.5 if dp_mesh.shape[-1] == 1 else divide
        for module in model.modules():
            if isinstance(module, FSDPModule):
                module.set_force_sum_reduction_for_comms(True)  # then the factor divides
                module.set_gradient_divide_factor(factor)
                if name == "no_sync":
                    module.set_custom_reduce_scatter(OwnRows())
        return done

    torch_parallel.apply_fully_shard = apply_fully_shard


def _break_microbatch_scale() -> None:
    from dlscale.frameworks import torch_pipeline

    original = torch_pipeline.build_pipeline

    def build_pipeline(model, arch, dims, mesh, device, schedule, microbatches, loss_fn, **kw):
        calls = [0]

        def first_unscaled(output, target):
            loss = loss_fn(output, target)
            first = calls[0] % microbatches == 0
            calls[0] += 1
            if not first:
                return loss
            # the same value, micro-batches times the gradient: the schedule's division by
            # the micro-batches leaves this one unscaled
            return loss * microbatches - loss.detach() * (microbatches - 1)

        return original(
            model, arch, dims, mesh, device, schedule, microbatches, first_unscaled, **kw
        )

    torch_pipeline.build_pipeline = build_pipeline


# ---- the single-process program ----------------------------------------------------------
def reference_loss(
    world: int,
    name: str = "transformer_small",
    optimizer: str = "sgd",
    precision: str = "fp32",
    fault: str | None = None,
    degree: int | None = None,
) -> float:
    """The loss after STEPS steps of the single-process program on the global batch: rank 0's
    weights, rank r's batch drawn as rank r draws it (seed r, the model built first); `fault`
    (FAULTS): what the program trains to under that break instead: a data-parallel average
    over `degree` ranks (default: the world) missed or applied twice, a pipeline of
    MICROBATCHES micro-batches over the global batch with its first one unscaled, fully_shard
    over the world's ranks without sync.
    Runs in the test process on one intra-op thread, as each rank does: the registry entry
    use_tiny_model replaces and the thread count are restored afterwards, so later tests in
    the same worker see the real transformer_small (a test of the planner read seq_len 16 from
    it) and the worker's own threads."""
    from dlscale import models

    if fault is not None and fault not in FAULTS:
        raise ValueError(f"unknown fault {fault!r}; allowed values: {', '.join(FAULTS)}")
    import torch

    saved, threads = models.SPECS["transformer_small"], torch.get_num_threads()
    use_tiny_model()
    # with the ranks' one intra-op thread (train_spec's threads=1): a bf16 matmul's sums run in
    # another order on more threads (8e-6 apart on gpt2_tiny, 8x the tightest tolerance)
    torch.set_num_threads(1)
    try:
        return _reference_loss(world, name, optimizer, precision, fault, degree or world)
    finally:
        models.SPECS["transformer_small"] = saved
        torch.set_num_threads(threads)


def _reference_loss(
    world: int, name: str, optimizer: str, precision: str, fault, degree: int
) -> float:
    import torch

    from dlscale.models import get_spec
    from dlscale.models.torch import build, example_batch
    from dlscale.models.torch.seeded_init import has_init_weights, seeded_init

    spec = get_spec(name)
    with torch.device("meta"):
        seeded = has_init_weights(build(name))
    xs, ys = [], []
    for r in range(world):
        torch.manual_seed(r)
        if seeded:  # the rank draws its batch first; its weights come from their own seeds
            x, y = example_batch(spec, PER_RANK_BATCH)
        else:
            model = build(name)
            x, y = example_batch(spec, PER_RANK_BATCH)
            if r == 0:
                reference = model
        xs.append(x)
        ys.append(y)
    if seeded:
        reference = build(name)
        with torch.device("meta"):
            twin = build(name)
        seeded_init(reference, twin, seed=0)
    x, y = torch.cat(xs), torch.cat(ys)
    kind, momentum = OPTIMIZERS[optimizer]
    if kind == "adamw":
        opt = torch.optim.AdamW(
            reference.parameters(),
            lr=ADAMW_LEARNING_RATE,
            betas=(ADAMW["adam_beta1"], ADAMW["adam_beta2"]),
            eps=ADAMW["adam_eps"],
            weight_decay=ADAMW["weight_decay"],
        )
    else:
        opt = torch.optim.SGD(reference.parameters(), lr=LEARNING_RATE, momentum=momentum)
    loss_fn = torch.nn.CrossEntropyLoss()
    params = list(reference.parameters())
    for _ in range(STEPS):
        opt.zero_grad(set_to_none=True)
        if fault == "no_sync":  # each row shard (FSDP2: dim 0 in `world` chunks) its rank's
            per_rank = [_gradients(reference, xr, yr, loss_fn, precision) for xr, yr in zip(xs, ys)]
            grads = [_own_rows(list(gs)) for gs in zip(*per_rank)]
        else:
            weights = None
            if fault == "skip_microbatch_scale":  # micro-batch 0 unscaled, the others / m
                weights = [1.0] + [1.0 / MICROBATCHES] * (MICROBATCHES - 1)
            grads = _gradients(reference, x, y, loss_fn, precision, weights)
            scale = {"no_average": degree, "double_average": 1 / degree}.get(fault, 1)
            grads = [None if g is None else g * scale for g in grads]
        for p, g in zip(params, grads):
            p.grad = g
        if kind == "adamw":
            torch.nn.utils.clip_grad_norm_(params, ADAMW["grad_clip_norm"])
        opt.step()
    with torch.no_grad():
        return float(loss_fn(_forward_model(reference, precision)(x).float(), y))


def _forward_model(model, precision: str):
    """The model the forward runs: itself, or for bf16 a bfloat16 copy of it (FSDP2's
    param_dtype bf16: the float32 weights cast for the forward and backward)."""
    import copy

    import torch

    if precision == "fp32":
        return model
    if precision != "bf16":
        raise ValueError(f"reference precision {precision!r}; allowed values: fp32, bf16")
    return copy.deepcopy(model).to(torch.bfloat16)


def _gradients(model, x, y, loss_fn, precision: str, weights=None) -> list:
    """The float32 gradients of the mean loss on (x, y) with respect to model.parameters();
    `weights`: the loss as a weighted sum over len(weights) micro-batches (torch.tensor_split
    of the batch, as the pipeline splits it) instead."""
    import torch

    run = _forward_model(model, precision)
    if weights is None:
        loss = loss_fn(run(x), y)
    else:
        parts = zip(x.tensor_split(len(weights)), y.tensor_split(len(weights)), weights)
        loss = sum(w * loss_fn(run(xk), yk) for xk, yk, w in parts)
    # a parameter the loss does not reach keeps no gradient (None), as after backward()
    grads = torch.autograd.grad(loss, list(run.parameters()), allow_unused=True)
    return [None if g is None else g.float() for g in grads]


def _own_rows(grads: list):
    """One parameter's gradient under fully_shard without sync: its dim-0 chunk r (FSDP2's
    shard of rank r) from rank r's gradient."""
    import torch

    world = len(grads)
    if grads[0] is None:
        return None
    out = torch.empty_like(grads[0])
    for r, piece in enumerate(torch.chunk(out, world, dim=0)):
        piece.copy_(torch.chunk(grads[r], world, dim=0)[r])
    return out


def degree_of(parallelism: str, tp_degree: int) -> int:
    """TP_DEGREE for a strategy that splits layers or pipelines (its tensor-parallel degree or
    stages), 1 for the others: one command line runs several strategies."""
    from dlscale.registry.strategies import STRATEGIES

    record = STRATEGIES[parallelism.split(":")[0]]
    return tp_degree if record.splits_layers or record.pipeline else 1


if __name__ == "__main__":
    rank, world, rpn = (int(a) for a in sys.argv[1:4])
    ports, entries = sys.argv[4].split(","), sys.argv[5].split(",")
    tp_degree, out = int(sys.argv[6]), sys.argv[7]
    model = sys.argv[8] if len(sys.argv) > 8 else "transformer_small"
    optimizer = sys.argv[9] if len(sys.argv) > 9 else "sgd"
    precision = sys.argv[10] if len(sys.argv) > 10 else "fp32"
    checkpointing = sys.argv[11] if len(sys.argv) > 11 else "none"
    if os.environ.get(BREAK_VARIABLE):
        apply_break(os.environ[BREAK_VARIABLE])
    results = {}
    for port, entry in zip(ports, entries, strict=True):
        token, own_optimizer, own_checkpointing = entry_parts(entry, optimizer, checkpointing)
        results[entry] = run_rank(
            rank,
            world,
            rpn,
            int(port),
            token,
            degree_of(token, tp_degree),
            model,
            own_optimizer,
            precision,
            own_checkpointing,
        )
    with open(out, "w") as f:
        json.dump(results if len(results) > 1 else results[entries[0]], f)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # the adapters left as they are (_KEPT)

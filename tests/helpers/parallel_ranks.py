"""Real ranks of a parallelism (dlscale.registry.parallel_dims) for the equivalence tests: each rank
is its own
process running the production PyTorch adapter (setup: device mesh, tensor parallel,
fully_shard; three training steps), on gloo over TCP, with a dropout-free tiny transformer (the
registry's transformer_small architecture at a smaller size: dropout draws different masks on a
sharded activation by construction, so it is off for a comparison of losses).

    python parallel_ranks.py RANK WORLD RANKS_PER_NODE PORT PARALLELISM TP_DEGREE OUT.json \
        [MODEL [OPTIMIZER [PRECISION [CHECKPOINTING]]]]

(PARALLELISM@CHECKPOINTING, e.g. ddp@full: that strategy with that activation checkpointing,
its result under that name; MODEL: transformer_small, made tiny as above, or a tiny decoder of
the registry as it is, gpt2_tiny or llama3_debug: they have no dropout; PORT and PARALLELISM
may be comma-separated lists of the same length: the strategies then run one after another in
the same processes; a strategy may carry its pipeline's options, NAME:OPTION:... (parse_token:
`pp:interleaved_1f1b`, `pp+fsdp+tp:1f1b:pp2:mb4`);
OPTIMIZER: sgd, or adamw with its gradients clipped to norm 1; PRECISION: fp32, or bf16,
under fully_shard with FSDP2's MixedPrecisionPolicy as a study gives it: the dtype the first
Linear's weight has in the forward is written beside the loss; CHECKPOINTING: none,
selective or full activation checkpointing of the blocks; a tensor-parallel strategy runs the
plan a study gives it: the complete plan where the model has one)

writes this rank's loss on its batch after the steps (averaged over the ranks: the loss on the
global batch) and its memory record (measured and predicted state bytes) right after the
steps (several strategies: one such record per strategy, by name). `reference_loss` computes
the same loss in one process: rank 0's initial weights (a model with init_weights(): each
parameter seeded by its name, as every rank draws it), the ranks' batches together as one
batch, torch's own SGD or AdamW and clip_grad_norm_."""

from __future__ import annotations

import dataclasses
import json
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
TINY = {"d_model": 64, "num_layers": 2, "num_heads": 2, "dim_feedforward": 128, "dropout": 0.0}
SEQ_LEN, VOCAB = 16, 256


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
        if option.startswith("pp"):
            out["pp_degree"] = int(option[2:])
        elif option.startswith("mb"):
            out["microbatches"] = int(option[2:])
        else:
            out["pp_schedule"] = option
    return out


def train_spec(
    parallelism: str,
    tp_degree: int,
    model: str = "transformer_small",
    optimizer: str = "sgd",
    precision: str = "fp32",
    checkpointing: str = "none",
):
    """The rank-side cell of a strategy token (parse_token)."""
    from dlscale.frameworks.base import TrainSpec
    from dlscale.study.matrix import cell_tp_plan, fsdp_mixed_precision

    parsed = parse_token(parallelism, tp_degree)
    adamw = optimizer == "adamw"
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
        momentum=MOMENTUM,
        **parsed,
        optimizer=optimizer,
        **(ADAMW if adamw else {}),
        fsdp_mixed_precision=fsdp_mixed_precision(parsed["parallelism"], precision),
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
        if adapter.pipelined:
            # one more step: its forward's loss is the loss after STEPS updates (the last
            # stage's micro-batch losses; their mean is its pipeline's batch's loss), averaged
            # over the ranks that hold the last stage (its data-parallel and tp ranks)
            adapter.step()
            pipe = adapter.pipe
            loss = torch.stack(pipe.losses).mean().detach() if pipe.has_last else torch.zeros(())
            dist.all_reduce(loss)
            loss /= world // adapter.dims.pp
        else:
            loss = adapter.loss_value(adapter.x, adapter.y)
            if world > 1:
                dist.all_reduce(loss)
                loss /= world
        return {
            "loss": float(loss),
            "saved_activation_bytes": sum(saved.values()),
            "forward_weight_dtype": dtypes[-1] if dtypes else None,
            "memory": memory,
            "wrapper": adapter.wrapper(),
            "execution": adapter.execution()["parallelism"],
            "training": adapter.execution()["training"],
        }
    finally:
        adapter.teardown()


def _local(t):
    return t.to_local() if hasattr(t, "to_local") else t


def _storage(t) -> int:
    return _local(t).untyped_storage()._cdata


def reference_loss(world: int, name: str = "transformer_small", optimizer: str = "sgd") -> float:
    """The loss after STEPS steps of the single-process program on the global batch: rank 0's
    weights, rank r's batch drawn as rank r draws it (seed r, the model built first). Runs in
    the test process: the registry entry use_tiny_model replaces is restored afterwards, so
    later tests in the same worker see the real transformer_small (a test of the planner read
    seq_len 16 from it)."""
    from dlscale import models

    saved = models.SPECS["transformer_small"]
    use_tiny_model()
    try:
        return _reference_loss(world, name, optimizer)
    finally:
        models.SPECS["transformer_small"] = saved


def _reference_loss(world: int, name: str, optimizer: str) -> float:
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
    if optimizer == "adamw":
        opt = torch.optim.AdamW(
            reference.parameters(),
            lr=ADAMW_LEARNING_RATE,
            betas=(ADAMW["adam_beta1"], ADAMW["adam_beta2"]),
            eps=ADAMW["adam_eps"],
            weight_decay=ADAMW["weight_decay"],
        )
    else:
        opt = torch.optim.SGD(reference.parameters(), lr=LEARNING_RATE, momentum=MOMENTUM)
    loss_fn = torch.nn.CrossEntropyLoss()
    for _ in range(STEPS):
        loss = loss_fn(reference(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if optimizer == "adamw":
            torch.nn.utils.clip_grad_norm_(reference.parameters(), ADAMW["grad_clip_norm"])
        opt.step()
    with torch.no_grad():
        return float(loss_fn(reference(x), y))


def degree_of(parallelism: str, tp_degree: int) -> int:
    """TP_DEGREE for a strategy that splits layers or pipelines (its tensor-parallel degree or
    stages), 1 for the others: one command line runs several strategies."""
    from dlscale.registry.strategies import STRATEGIES

    record = STRATEGIES[parallelism.split(":")[0]]
    return tp_degree if record.splits_layers or record.pipeline else 1


if __name__ == "__main__":
    rank, world, rpn = (int(a) for a in sys.argv[1:4])
    ports, parallelisms = sys.argv[4].split(","), sys.argv[5].split(",")
    tp_degree, out = int(sys.argv[6]), sys.argv[7]
    model = sys.argv[8] if len(sys.argv) > 8 else "transformer_small"
    optimizer = sys.argv[9] if len(sys.argv) > 9 else "sgd"
    precision = sys.argv[10] if len(sys.argv) > 10 else "fp32"
    checkpointing = sys.argv[11] if len(sys.argv) > 11 else "none"
    # several strategies, comma-separated (each with its own port), run one after another in
    # the same processes: one interpreter start and torch import for all of them
    results = {
        p: run_rank(
            rank,
            world,
            rpn,
            int(port),
            p.partition("@")[0],
            degree_of(p.partition("@")[0], tp_degree),
            model,
            optimizer,
            precision,
            p.partition("@")[2] or checkpointing,
        )
        for port, p in zip(ports, parallelisms, strict=True)
    }
    with open(out, "w") as f:
        json.dump(results if len(results) > 1 else results[parallelisms[0]], f)

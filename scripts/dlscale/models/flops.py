"""FLOPs per sample of a registered model, counted by PyTorch's FLOP counter (the counting half
of MFU, with its method text; dlscale.analysis.mfu holds the MFU arithmetic), and the decoder's
formula it is cross-checked against. Imports PyTorch inside the functions only: a PyTorch
cell's ranks call it once before their first step, and the report reads FLOP_METHOD without
PyTorch."""

from __future__ import annotations

import functools
import time

COUNT_BATCH = 2  # samples per counted batch; FLOPs per sample = the count / COUNT_BATCH

FLOP_METHOD = (
    "torch.utils.flop_counter.FlopCounterMode over one forward and backward of "
    f"{COUNT_BATCH} samples on the meta device (attention in the math backend), divided by "
    f"{COUNT_BATCH}: matrix multiplications, convolutions and attention products; elementwise "
    "operations, normalisation, softmax, loss and optimizer update not counted; counted once "
    "per model and sequence length, before the first step"
)


@functools.cache
def count_flops_per_sample(model: str, seq_len: int | None = None) -> dict:
    """FLOPs of one training sample (forward + backward) of a registered model, counted by
    PyTorch's FLOP counter on the meta device (FLOP_METHOD); cached per (model, seq_len).

    Returns ``{"flops_per_sample": int, "seq_len": int | None, "method": str,
    "seconds": float}`` (seconds: how long the count took)."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    from dlscale.models import spec_for
    from dlscale.models.torch import build, example_batch

    started = time.perf_counter()
    spec = spec_for(model, seq_len)
    with torch.device("meta"):
        net = build(model, seq_len)
    net.train()
    x, y = example_batch(spec, COUNT_BATCH, device="meta")
    counter = FlopCounterMode(display=False)
    with counter, sdpa_kernel(SDPBackend.MATH):
        loss = torch.nn.functional.cross_entropy(net(x), y)
        loss.backward()
    total = counter.get_total_flops()
    if total % COUNT_BATCH:
        raise RuntimeError(f"{model}: {total} FLOPs for {COUNT_BATCH} samples is not a multiple")
    return {
        "flops_per_sample": total // COUNT_BATCH,
        "seq_len": seq_len if seq_len is not None else _seq_len(spec),
        "method": FLOP_METHOD,
        "seconds": time.perf_counter() - started,
    }


def _seq_len(spec) -> int | None:
    from dlscale.models import seq_len_of

    return seq_len_of(spec)


def decoder_flops_per_token(spec) -> dict:
    """A decoder spec's FLOPs per token (forward + backward) by formula, torchtitan's
    convention (torchtitan/models/utils.py get_dense_model_nparams_and_flops):

    - ``n``: the parameters that count, N: every trainable parameter (spec.param_count) less
      the input embedding, a lookup that does no matrix product, where the head has a weight
      of its own (the Llama family); all of them where the head is tied to the embedding
      (GPT-2, Llama 3.2 1B), whose matrix the head multiplies by;
    - ``six_n``: 6 N;
    - ``attention``: 12 L d S, the attention scores (Q K^T) and the weighted values (A V),
      2 S d FLOPs each per token and layer forward, 3x for forward + backward (the causal mask's
      zeros counted, as torchtitan and PaLM count them);
    - ``six_n_plus_attention``: their sum, the FLOPs per token MFU is quoted with (57.9 G for
      llama3_8b at sequence 8,192);
    - ``counted``: what FlopCounterMode counts, exactly: 6 x the parameters that take part in a
      matrix product + 12 L d S. The difference to six_n_plus_attention is 6 x the parameters
      that do none: the GPT-2 decoder's position table, biases and LayerNorms, a Llama's
      RMSNorm weights.
    """
    a = spec.arch_kwargs
    d, layers = a["d_model"], a["num_layers"]
    s = spec.input_shape[0]
    if spec.arch == "llama":
        from dlscale.models import llama_ffn_dim

        f = llama_ffn_dim(d, a["multiple_of"], a.get("ffn_dim_multiplier"))
        tied = a.get("tie_embeddings", False)
        n = spec.param_count - (0 if tied else spec.vocab_size * d)
        kv = a["num_kv_heads"] * (d // a["num_heads"])
        matmul_params = spec.vocab_size * d + layers * (2 * d * d + 2 * d * kv + 3 * d * f)
    elif spec.arch == "gpt":
        f = a["dim_feedforward"]
        n = spec.param_count  # the head is tied to the token embedding
        matmul_params = spec.vocab_size * d + layers * (4 * d * d + 2 * d * f)
    else:
        raise ValueError(f"{spec.name}: no FLOP formula for architecture {spec.arch!r}")
    attention = 12 * layers * d * s
    return {
        "n": n,
        "six_n": 6 * n,
        "attention": attention,
        "six_n_plus_attention": 6 * n + attention,
        "counted": 6 * matmul_params + attention,
    }

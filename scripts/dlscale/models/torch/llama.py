"""Llama-3-class decoder-only transformer (Grattafiori et al. 2024, "The Llama 3 Herd of Models"),
as torchtitan builds it (torchtitan/models/llama3): RMSNorm, SwiGLU feed-forward, rotary position
embeddings (RoPE, theta 500,000, Llama 3.1's frequency scaling where the entry asks for it),
grouped-query attention and an output head of its own (tied to the token embedding only where
the registry entry says so: Llama 3.2 1B).

The model is built without drawing a random number and then initialised by ``init_weights``
(torchtitan's scheme: ``from_spec`` builds on the meta device, materialises on the current
default device and calls it), so its values are the seed's and ``init_weights`` alone: a model
built on the meta device, sharded and materialised later gets the same values from the same
generator state by calling ``init_weights`` again (a DTensor parameter draws its full value and
takes its shard of rank 0's draw, :func:`_fill`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from dlscale.models import ModelSpec, llama_ffn_dim

__all__ = [
    "Attention",
    "FeedForward",
    "Llama",
    "LlamaStage",
    "TransformerBlock",
    "from_spec",
    "pipeline_stage",
    "rope_cache",
]

NORM_EPS = 1e-5  # Llama 3's RMSNorm epsilon
BASE_STD = 0.02  # the projections' initial standard deviation (torchtitan)


def rope_cache(
    head_dim: int,
    seq_len: int,
    theta: float,
    scaling_factor: float | None = None,
    low_freq_factor: float = 1.0,
    high_freq_factor: float = 4.0,
    original_context: int = 8192,
    device: torch.device | str | None = None,
) -> Tensor:
    """RoPE's rotation per position and pair of channels: ``(seq_len, head_dim // 2, 2)``, the
    cosine and sine of ``position x frequency``, frequencies ``theta ** (-2i / head_dim)``.
    ``scaling_factor``: Llama 3.1's long-context scaling of the low frequencies (wavelengths
    beyond ``original_context / low_freq_factor`` divided by the factor, a smooth blend up to
    ``original_context / high_freq_factor``); None: unscaled."""
    freqs = 1.0 / (
        theta ** (torch.arange(0, head_dim, 2, device=device)[: head_dim // 2].float() / head_dim)
    )
    if scaling_factor is not None:
        wavelen = 2 * math.pi / freqs
        low_freq_wavelen = original_context / low_freq_factor
        high_freq_wavelen = original_context / high_freq_factor
        smooth = (original_context / wavelen - low_freq_factor) / (
            high_freq_factor - low_freq_factor
        )
        blended = (1 - smooth) * freqs / scaling_factor + smooth * freqs
        scaled = torch.where(wavelen > low_freq_wavelen, freqs / scaling_factor, freqs)
        medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
        freqs = torch.where(medium, blended, scaled)
    angles = torch.outer(torch.arange(seq_len, device=device).float(), freqs)
    return torch.stack((angles.cos(), angles.sin()), dim=-1)


def apply_rope(x: Tensor, cache: Tensor) -> Tensor:
    """Rotate ``x`` ``(B, S, H, head_dim)`` by ``cache[:S]``: each pair of adjacent channels
    ``(a, b)`` becomes ``(a cos - b sin, a sin + b cos)`` (Meta's reference rotates adjacent
    pairs as complex numbers; the same in real arithmetic), in float32, returned in x's dtype."""
    s = x.shape[1]
    pairs = x.float().reshape(*x.shape[:-1], -1, 2)
    a, b = pairs[..., 0], pairs[..., 1]
    cos = cache[:s, None, :, 0]
    sin = cache[:s, None, :, 1]
    rotated = torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1)
    return rotated.flatten(-2).type_as(x)


def repeat_kv(x: Tensor, n_rep: int) -> Tensor:
    """Grouped-query attention: each of ``x``'s KV heads ``(B, S, H_kv, D)`` repeated
    ``n_rep`` times, next to each other, for the ``H_kv x n_rep`` query heads."""
    if n_rep == 1:
        return x
    b, s, h, d = x.shape
    return x[:, :, :, None, :].expand(b, s, h, n_rep, d).reshape(b, s, h * n_rep, d)


class Attention(nn.Module):
    """Causal grouped-query self-attention without biases: ``num_heads`` query heads share
    ``num_kv_heads`` key/value heads (wq: d -> d, wk and wv: d -> num_kv_heads x head_dim,
    wo: d -> d). The heads are read from the projections' output widths, so a tensor-parallel
    plan that splits wq/wk/wv by columns and wo by rows runs the local heads unchanged (its
    degree must divide both head counts). RoPE on queries and keys, then
    ``scaled_dot_product_attention(is_causal=True)``: with the key/value heads repeated
    (repeat_kv), or, where ``enable_gqa`` is set (a cell's attention setting, where its kernel
    supports it: dlscale.frameworks.torch_attention.uses_gqa), as they are with
    ``enable_gqa=True``."""

    enable_gqa = False  # a switch, not state: set per instance by the adapter

    def __init__(self, d_model: int, num_heads: int, num_kv_heads: int) -> None:
        super().__init__()
        if d_model % num_heads:
            raise ValueError(f"d_model {d_model} is not divisible by num_heads {num_heads}")
        if num_heads % num_kv_heads:
            raise ValueError(
                f"num_heads {num_heads} is not divisible by num_kv_heads {num_kv_heads}"
            )
        self.head_dim = d_model // num_heads
        kv_dim = num_kv_heads * self.head_dim
        self.wq = nn.Linear(d_model, d_model, bias=False)
        self.wk = nn.Linear(d_model, kv_dim, bias=False)
        self.wv = nn.Linear(d_model, kv_dim, bias=False)
        self.wo = nn.Linear(d_model, d_model, bias=False)

    def forward(self, x: Tensor, rope: Tensor) -> Tensor:
        b, s, _ = x.shape
        q = self.wq(x).view(b, s, -1, self.head_dim)
        k = self.wk(x).view(b, s, -1, self.head_dim)
        v = self.wv(x).view(b, s, -1, self.head_dim)
        q, k = apply_rope(q, rope), apply_rope(k, rope)
        n_rep = q.shape[2] // k.shape[2]
        gqa = self.enable_gqa and n_rep > 1
        if not gqa:
            k, v = repeat_kv(k, n_rep), repeat_kv(v, n_rep)
        y = F.scaled_dot_product_attention(
            q.transpose(1, 2),
            k.transpose(1, 2),
            v.transpose(1, 2),
            is_causal=True,
            **({"enable_gqa": True} if gqa else {}),
        )
        return self.wo(y.transpose(1, 2).reshape(b, s, -1))

    def init_weights(self, depth_std: float) -> None:
        for linear in (self.wq, self.wk, self.wv):
            _fill(linear.weight, partial(nn.init.trunc_normal_, std=BASE_STD))
        _fill(self.wo.weight, partial(nn.init.trunc_normal_, std=depth_std))


class FeedForward(nn.Module):
    """SwiGLU: ``w2(silu(w1(x)) * w3(x))``, no biases; w1 and w3: d -> hidden, w2: hidden -> d."""

    def __init__(self, d_model: int, hidden_dim: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(d_model, hidden_dim, bias=False)
        self.w2 = nn.Linear(hidden_dim, d_model, bias=False)
        self.w3 = nn.Linear(d_model, hidden_dim, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))

    def init_weights(self, depth_std: float) -> None:
        _fill(self.w1.weight, partial(nn.init.trunc_normal_, std=BASE_STD))
        for linear in (self.w2, self.w3):
            _fill(linear.weight, partial(nn.init.trunc_normal_, std=depth_std))


class TransformerBlock(nn.Module):
    """Pre-norm block: ``h = x + attention(attention_norm(x))``, then
    ``h + feed_forward(ffn_norm(h))``; the FSDP unit (fully_shard wraps each, then the root)."""

    def __init__(
        self,
        layer_id: int,
        d_model: int,
        num_heads: int,
        num_kv_heads: int,
        hidden_dim: int,
    ) -> None:
        super().__init__()
        self.layer_id = layer_id
        self.attention_norm = nn.RMSNorm(d_model, eps=NORM_EPS)
        self.attention = Attention(d_model, num_heads, num_kv_heads)
        self.ffn_norm = nn.RMSNorm(d_model, eps=NORM_EPS)
        self.feed_forward = FeedForward(d_model, hidden_dim)

    def forward(self, x: Tensor, rope: Tensor) -> Tensor:
        h = x + self.attention(self.attention_norm(x), rope)
        return h + self.feed_forward(self.ffn_norm(h))

    def init_weights(self) -> None:
        """Norms to one; wq/wk/wv and w1 N(0, 0.02), wo, w2 and w3 N(0, 0.02 / sqrt(2 (layer
        + 1))) (torchtitan's depth-scaled init), truncated at +-2 as torch's trunc_normal_."""
        depth_std = BASE_STD / (2 * (self.layer_id + 1)) ** 0.5
        for norm in (self.attention_norm, self.ffn_norm):
            _fill(norm.weight, nn.init.ones_)
        self.attention.init_weights(depth_std)
        self.feed_forward.init_weights(depth_std)


class Llama(nn.Module):
    """Llama 3: token embedding, ``num_layers`` pre-norm blocks (grouped-query attention with
    RoPE, SwiGLU), a final RMSNorm (``norm``) and the output head (``output``, no bias; tied to
    the token embedding where ``tie_embeddings``). No dropout, as the GPT-2 decoder: a
    deterministic step whose loss strategies can be compared step for step.

    Trainable parameters (``V`` vocabulary, ``d`` width, ``k`` = KV heads x head dim, ``f`` the
    SwiGLU width, ``L`` layers): ``V d (2, or 1 tied) + L (2 d^2 + 2 d k + 3 d f + 2 d) + d``.
    The sequence length adds none: RoPE's rotations are a non-persistent buffer
    (``rope``, ``(seq_len, head_dim / 2, 2)``), recomputed by ``init_weights``.

    ``forward`` maps token ids ``(N, S)``, ``S <= seq_len``, to next-token logits flattened to
    ``(N*S, V)``, as dlscale.models.torch.gpt.GPT.
    """

    def __init__(
        self,
        vocab_size: int,
        seq_len: int,
        d_model: int,
        num_layers: int,
        num_heads: int,
        num_kv_heads: int,
        multiple_of: int,
        ffn_dim_multiplier: float | None = None,
        rope_theta: float = 500_000.0,
        rope_scaling_factor: float | None = None,
        tie_embeddings: bool = False,
    ) -> None:
        super().__init__()
        self.seq_len, self.d_model = seq_len, d_model
        self.rope_theta, self.rope_scaling_factor = rope_theta, rope_scaling_factor
        self.head_dim = d_model // num_heads
        self.tie_embeddings = tie_embeddings
        hidden_dim = llama_ffn_dim(d_model, multiple_of, ffn_dim_multiplier)
        self.tok_embeddings = nn.Embedding(vocab_size, d_model)
        self.layers = nn.ModuleList(
            TransformerBlock(i, d_model, num_heads, num_kv_heads, hidden_dim)
            for i in range(num_layers)
        )
        self.norm = nn.RMSNorm(d_model, eps=NORM_EPS)
        self.output = nn.Linear(d_model, vocab_size, bias=False)
        self.tie_weights()
        self.register_buffer("rope", self._rope(), persistent=False)

    def tie_weights(self) -> None:
        """Make the head's weight the token embedding's where ``tie_embeddings`` (again after
        ``to_empty``, which gives each module a tensor of its own)."""
        if self.tie_embeddings:
            self.output.weight = self.tok_embeddings.weight

    def _rope(self, device=None) -> Tensor:
        return rope_cache(
            self.head_dim,
            self.seq_len,
            self.rope_theta,
            self.rope_scaling_factor,
            device=device,
        )

    @torch.no_grad()
    def init_weights(self) -> None:
        """(Re)initialise every parameter and buffer in place, in a fixed order, from the
        default generator of each tensor's device (torchtitan's scheme): RoPE's rotations
        recomputed where the buffer lies; the token embedding N(0, 1) (not drawn where the head
        is tied to it); each block (TransformerBlock.init_weights); the final norm to one; the
        head N(0, d^-1/2) truncated at 3 standard deviations. A DTensor (a sharded or split
        parameter) draws its full value and keeps its part of rank 0's draw (:func:`_fill`)."""
        self.rope.copy_(self._rope(device=self.rope.device))
        if not self.tie_embeddings:
            _fill(self.tok_embeddings.weight, partial(nn.init.normal_, std=1.0))
        for layer in self.layers:
            layer.init_weights()
        _fill(self.norm.weight, nn.init.ones_)
        std = self.d_model**-0.5
        _fill(self.output.weight, partial(nn.init.trunc_normal_, std=std, a=-3 * std, b=3 * std))

    def forward(self, tokens: Tensor) -> Tensor:
        """Next-token logits ``(N*S, V)`` of token ids ``(N, S)``, ``S <= seq_len``."""
        h = self.tok_embeddings(tokens)
        for layer in self.layers:
            h = layer(h, self.rope)
        logits = self.output(self.norm(h))
        return logits.reshape(-1, logits.shape[-1])


class LlamaStage(nn.Module):
    """One pipeline stage of a Llama (pipeline_stage): the first stage embeds the tokens, every
    stage runs its contiguous run of blocks (RoPE's rotations shared), the last normalises and
    projects to the vocabulary: the model's forward, cut between pieces. The pieces keep their
    names (tok_embeddings, layers.<i>, norm, output), so the model's plan applies to a stage
    as it does to the whole (dlscale.models.parallelize.llama)."""

    def __init__(self, model: Llama, start: int, stop: int, first: bool, last: bool):
        super().__init__()
        self.first, self.last = first, last
        self.layer_ids = list(range(start, stop))
        if first:
            self.tok_embeddings = model.tok_embeddings
        self.layers = nn.ModuleList(model.layers[start:stop])
        if last:
            self.norm, self.output = model.norm, model.output
        self.register_buffer("rope", model.rope, persistent=False)

    def forward(self, x: Tensor) -> Tensor:
        h = self.tok_embeddings(x) if self.first else x
        for layer in self.layers:
            h = layer(h, self.rope)
        if not self.last:
            return h
        logits = self.output(self.norm(h))
        return logits.reshape(-1, logits.shape[-1])


def pipeline_stage(model: Llama, stage: int, stages: int) -> LlamaStage:
    """Stage `stage` of `stages` of the model (dlscale.models.parallelize.llama.PLAN.pipeline):
    the embedding, the blocks and the head (final norm and output) cut by forward FLOPs per
    token (dlscale.models.torch.pipeline_split: a block's matrices and attention, the head's
    2·d·V, the embedding a lookup). A head tied to the token embedding cannot be split from it
    (two stages would hold one parameter): refused."""
    from dlscale.models.torch.pipeline_split import forward_flops, stage_pieces

    if model.tie_embeddings:
        raise ValueError(
            "a Llama whose head is tied to its token embedding cannot be cut into pipeline "
            "stages (two stages would share one parameter)"
        )
    attention = 4.0 * model.d_model * model.seq_len
    costs = [forward_flops(layer, attention) for layer in model.layers]
    head = forward_flops(model.norm) + forward_flops(model.output)
    first, last, start, stop = stage_pieces(costs, 0.0, head, stage, stages)
    return LlamaStage(model, start, stop, first, last)


def _fill(param: Tensor, init: Callable[[Tensor], object]) -> None:
    """Initialise ``param`` in place by ``init``. A DTensor (fully_shard, tensor parallel)
    draws its full shape on its device, as one process would, and keeps its part of rank 0's
    draw (distribute_tensor scatters from rank 0: a collective, so every rank initialises the
    same parameters in the same order), so the values do not depend on how the parameter is
    split; a plain tensor keeps this rank's own draw; a meta tensor is left as it is."""
    if param.device.type == "meta":
        return
    from torch.distributed.tensor import DTensor, distribute_tensor

    if isinstance(param, DTensor):
        full = torch.empty(param.shape, dtype=param.dtype, device=param.to_local().device)
        init(full)
        param.copy_(distribute_tensor(full, param.device_mesh, param.placements))
    else:
        init(param)


def from_spec(spec: ModelSpec, **llama) -> Llama:
    """The Llama of ``spec`` (the registry's ``arch="llama"``): vocabulary and sequence length
    from the spec, the sizes from ``arch_kwargs``. Built on the meta device (no draws), then
    materialised on the current default device (``torch.get_default_device()``: the CPU, or
    the device of an enclosing ``with torch.device(...)``; a meta default stays meta), tied
    again where the head is tied, and initialised by ``init_weights`` from the default
    generator."""
    device = torch.get_default_device()
    with torch.device("meta"):
        model = Llama(vocab_size=spec.vocab_size, seq_len=spec.input_shape[0], **llama)
    if device.type != "meta":
        model.to_empty(device=device)
        model.tie_weights()
        model.init_weights()
    return model

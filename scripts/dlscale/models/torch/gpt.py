"""GPT-2-class decoder-only transformer (causal language model) for next-token prediction."""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from dlscale.models import ModelSpec

__all__ = ["Block", "GPT", "from_spec"]


class Attention(nn.Module):
    """Causal self-attention with separate query, key and value projections (wq, wk, wv) and
    an output projection (wo), all with biases as in GPT-2. The heads are read from the
    projections' output width (``view(B, S, -1, head_dim)``), so a tensor-parallel plan that
    splits wq/wk/wv by columns and wo by rows runs the local heads unchanged. Attention is
    ``torch.nn.functional.scaled_dot_product_attention`` with ``is_causal=True``."""

    def __init__(self, d_model: int, num_heads: int) -> None:
        super().__init__()
        if d_model % num_heads:
            raise ValueError(f"d_model {d_model} is not divisible by num_heads {num_heads}")
        self.head_dim = d_model // num_heads
        self.wq = nn.Linear(d_model, d_model)
        self.wk = nn.Linear(d_model, d_model)
        self.wv = nn.Linear(d_model, d_model)
        self.wo = nn.Linear(d_model, d_model)

    def forward(self, x: Tensor) -> Tensor:
        b, s, _ = x.shape
        q, k, v = (
            w(x).view(b, s, -1, self.head_dim).transpose(1, 2) for w in (self.wq, self.wk, self.wv)
        )
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(y.transpose(1, 2).reshape(b, s, -1))


class MLP(nn.Module):
    """GPT-2's feed-forward sublayer: Linear(d, ffn), GELU (tanh approximation), Linear(ffn, d)."""

    def __init__(self, d_model: int, dim_feedforward: int) -> None:
        super().__init__()
        self.fc = nn.Linear(d_model, dim_feedforward)
        self.proj = nn.Linear(dim_feedforward, d_model)

    def forward(self, x: Tensor) -> Tensor:
        return self.proj(F.gelu(self.fc(x), approximate="tanh"))


class Block(nn.Module):
    """Pre-norm decoder block: x + attn(ln_1(x)), then x + mlp(ln_2(x))."""

    def __init__(self, d_model: int, num_heads: int, dim_feedforward: int) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(d_model)
        self.attn = Attention(d_model, num_heads)
        self.ln_2 = nn.LayerNorm(d_model)
        self.mlp = MLP(d_model, dim_feedforward)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """GPT-2 (Radford et al. 2019): token and learned position embeddings, ``num_layers``
    pre-norm decoder blocks, a final LayerNorm and a language-model head tied to the token
    embedding (no bias). No dropout: a benchmark step whose loss is deterministic, so that
    strategies can be compared step for step.

    Trainable parameters (``V`` vocabulary, ``S`` sequence length, ``d`` width, ``f`` FFN
    width, ``L`` layers; the tied head adds none):
    ``V*d + S*d + L*(4*d*d + 4*d + 2*d*f + f + d + 4*d) + 2*d``.

    ``forward`` maps token ids ``(N, S)`` to next-token logits flattened to ``(N*S, V)``, so
    the adapters' loss (cross-entropy against one label per row) and their accuracy
    (``argmax(dim=1)``) apply unchanged; the labels are the ``(N*S,)`` next tokens
    (:func:`dlscale.models.torch.example_batch`).
    """

    def __init__(
        self,
        vocab_size: int,
        seq_len: int,
        d_model: int,
        num_layers: int,
        num_heads: int,
        dim_feedforward: int,
    ) -> None:
        super().__init__()
        self.seq_len = seq_len
        self.token_embedding = nn.Embedding(vocab_size, d_model)
        self.position_embedding = nn.Embedding(seq_len, d_model)
        self.blocks = nn.ModuleList(
            Block(d_model, num_heads, dim_feedforward) for _ in range(num_layers)
        )
        self.ln_f = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab_size, bias=False)
        self.head.weight = self.token_embedding.weight  # tied, as in GPT-2
        self.num_layers = num_layers
        self.init_weights()

    def init_weights(self) -> None:
        """GPT-2's initialisation of every parameter, in the order of ``named_parameters()``
        (the tied head once, as the token embedding), drawn from torch's default generator:
        biases zero, LayerNorm weights one, matrices N(0, 0.02) with the residual projections
        (``wo``, ``proj``) scaled by 1/sqrt(2 L). Every parameter is set here, so a model built
        on the meta device and materialised after sharding is initialised by this alone
        (:mod:`dlscale.models.torch.seeded_init`); the model has no buffers."""
        for name, p in self.named_parameters():
            if name.endswith(".bias"):
                nn.init.zeros_(p)
            elif p.dim() >= 2:
                std = (
                    0.02 / (2 * self.num_layers) ** 0.5
                    if name.endswith(("wo.weight", "proj.weight"))
                    else 0.02
                )
                nn.init.normal_(p, std=std)
            else:  # the LayerNorms' weights
                nn.init.ones_(p)

    def forward(self, tokens: Tensor) -> Tensor:
        """Next-token logits ``(N*S, V)`` of token ids ``(N, S)``, ``S <= seq_len``."""
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.token_embedding(tokens) + self.position_embedding(positions)
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln_f(x))
        return logits.reshape(-1, logits.shape[-1])


def from_spec(spec: ModelSpec, **decoder) -> GPT:
    """The decoder of ``spec`` (the registry's ``arch="gpt"``): vocabulary and sequence length
    from the spec, the sizes (``d_model``, ``num_layers``, ``num_heads``, ``dim_feedforward``)
    from ``arch_kwargs``."""
    return GPT(vocab_size=spec.vocab_size, seq_len=spec.input_shape[0], **decoder)

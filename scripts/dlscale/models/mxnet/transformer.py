"""Small pre-norm transformer encoder classifier in Gluon, mirroring
:mod:`dlscale.models.torch.transformer` (``nn.TransformerEncoderLayer`` with
``batch_first=True, norm_first=True``, GELU, dropout 0.1, and a final LayerNorm).

Per layer, exactly as PyTorch's ``MultiheadAttention``: one packed q/k/v input projection
(``in_proj``: d x 3d weight, 3d bias, Xavier-uniform weight, zero bias), scaled dot-product
attention with dropout on the attention weights, an output projection (zero bias), then the
residual; the feed-forward sublayer is Linear(d, ff) - GELU (exact, erf) - dropout -
Linear(ff, d) - dropout, then the residual. Every sequence is full length (no padding mask).
"""

from __future__ import annotations

import math

import mxnet as mx
from mxnet.gluon import nn

from dlscale.models import ModelSpec
from dlscale.models.mxnet.init import XAVIER_UNIFORM, linear

__all__ = ["EncoderLayer", "TransformerClassifier", "from_spec"]


class EncoderLayer(nn.HybridBlock):
    """One pre-norm encoder layer (``norm_first=True``)."""

    def __init__(
        self, d_model: int, num_heads: int, dim_feedforward: int, dropout: float, **kwargs
    ) -> None:
        super().__init__(**kwargs)
        if d_model % num_heads:
            raise ValueError("d_model must be divisible by num_heads")
        self.d_model, self.num_heads = d_model, num_heads
        self.scale = 1.0 / math.sqrt(d_model // num_heads)
        with self.name_scope():
            self.norm1 = nn.LayerNorm(epsilon=1e-5, in_channels=d_model, prefix="norm1_")
            self.in_proj = linear(
                3 * d_model,
                d_model,
                flatten=False,
                zero_bias=True,
                weight_initializer=XAVIER_UNIFORM,
                prefix="in_proj_",
            )
            self.attn_dropout = nn.Dropout(dropout)
            self.out_proj = linear(
                d_model, d_model, flatten=False, zero_bias=True, prefix="out_proj_"
            )
            self.dropout1 = nn.Dropout(dropout)
            self.norm2 = nn.LayerNorm(epsilon=1e-5, in_channels=d_model, prefix="norm2_")
            self.linear1 = linear(dim_feedforward, d_model, flatten=False, prefix="linear1_")
            self.dropout = nn.Dropout(dropout)
            self.linear2 = linear(d_model, dim_feedforward, flatten=False, prefix="linear2_")
            self.dropout2 = nn.Dropout(dropout)

    def _self_attention(self, F, x):
        h = self.num_heads
        qkv = self.in_proj(x)  # (N, L, 3d)
        qkv = F.reshape(qkv, shape=(0, 0, 3 * h, -1))  # (N, L, 3h, dh): q|k|v heads
        qkv = F.transpose(qkv, axes=(0, 2, 1, 3))  # (N, 3h, L, dh)
        q, k, v = F.split(qkv, num_outputs=3, axis=1)  # (N, h, L, dh) each
        q = F.reshape(q, shape=(-3, 0, 0)) * self.scale  # (N*h, L, dh)
        k = F.reshape(k, shape=(-3, 0, 0))
        v = F.reshape(v, shape=(-3, 0, 0))
        weights = F.softmax(F.batch_dot(q, k, transpose_b=True), axis=-1)  # (N*h, L, L)
        out = F.batch_dot(self.attn_dropout(weights), v)  # (N*h, L, dh)
        out = F.reshape(out, shape=(-4, -1, h, 0, 0))  # (N, h, L, dh)
        out = F.reshape(F.transpose(out, axes=(0, 2, 1, 3)), shape=(0, 0, -3))  # (N, L, d)
        return self.out_proj(out)

    def hybrid_forward(self, F, x):
        x = x + self.dropout1(self._self_attention(F, self.norm1(x)))
        ff = self.dropout(F.LeakyReLU(self.linear1(self.norm2(x)), act_type="gelu"))
        return x + self.dropout2(self.linear2(ff))


class TransformerClassifier(nn.HybridBlock):
    """Token + learned positional embedding, pre-norm encoder, final LayerNorm, mean pool,
    linear head: 5,289,986 trainable parameters with the defaults."""

    def __init__(
        self,
        vocab_size: int = 8192,
        seq_len: int = 128,
        num_classes: int = 2,
        d_model: int = 256,
        num_layers: int = 4,
        num_heads: int = 4,
        dim_feedforward: int = 1024,
        dropout: float = 0.1,
        **kwargs,
    ) -> None:
        super().__init__(**kwargs)
        with self.name_scope():
            self.token_embedding = nn.Embedding(
                vocab_size,
                d_model,
                weight_initializer=mx.init.Normal(0.02),
                prefix="token_embedding_",
            )
            self.position_embedding = nn.Embedding(
                seq_len,
                d_model,
                weight_initializer=mx.init.Normal(0.02),
                prefix="position_embedding_",
            )
            self.layers = nn.HybridSequential(prefix="encoder_")
            with self.layers.name_scope():
                for i in range(num_layers):
                    self.layers.add(
                        EncoderLayer(
                            d_model, num_heads, dim_feedforward, dropout, prefix=f"layer{i}_"
                        )
                    )
            self.norm = nn.LayerNorm(epsilon=1e-5, in_channels=d_model, prefix="norm_")
            self.head = linear(num_classes, d_model, prefix="head_")

    def hybrid_forward(self, F, tokens):
        """Map token ids ``(N, L)`` (float-held, ``L <= seq_len``) to logits ``(N, classes)``."""
        positions = F.contrib.arange_like(tokens, axis=1)  # (L,)
        x = F.broadcast_add(
            self.token_embedding(tokens), F.expand_dims(self.position_embedding(positions), axis=0)
        )
        x = self.norm(self.layers(x))
        return self.head(F.mean(x, axis=1))


def from_spec(spec: ModelSpec, **encoder) -> TransformerClassifier:
    """The classifier of ``spec`` (the registry's ``arch="transformer"``): vocabulary,
    sequence length and classes from the spec, the encoder's sizes (``d_model``, ``num_layers``,
    ``num_heads``, ``dim_feedforward``, ``dropout``) from ``arch_kwargs``."""
    return TransformerClassifier(
        vocab_size=spec.vocab_size,
        seq_len=spec.input_shape[0],
        num_classes=spec.num_classes,
        **encoder,
    )

"""Pre-norm transformer encoder classifier in Keras, layer for layer the PyTorch one.

PyTorch's model is `nn.TransformerEncoder` of `nn.TransformerEncoderLayer(batch_first=True,
norm_first=True, activation="gelu", dropout=0.1)` plus a final LayerNorm, learned token and
position embeddings and a mean-pool + linear head: 5,289,986 parameters at the defaults. The
encoder layer is written out here so that its weights are those of PyTorch's, tensor for tensor:
a fused q/k/v input projection (d_model -> 3 d_model, Xavier-uniform weight, zero bias), an output
projection (PyTorch-default weight, zero bias), dropout on the attention weights and after each
sublayer and inside the feed-forward block, exact (erf) GELU, LayerNorm eps 1e-5. (Keras'
MultiHeadAttention has the same parameter count but separate q/k/v kernels; the explicit layer
keeps the structure and initialisation identical.) Softmax is computed in float32 under a
mixed-precision policy, as PyTorch autocast does.
"""

from __future__ import annotations

import math

import tensorflow as tf

from dlscale.models import ModelSpec
from dlscale.models.tf._common import (
    LN_EPSILON,
    float32_logits,
    initializers,
    keras,
    layers,
    torch_linear,
)


class TokenAndPositionEmbedding(layers.Layer):
    """token_embedding(tokens) + position_embedding(arange(L)), both N(0, 0.02^2) initialised."""

    def __init__(self, vocab_size: int, seq_len: int, d_model: int, **kwargs):
        super().__init__(**kwargs)
        self.token_embedding = layers.Embedding(
            vocab_size,
            d_model,
            embeddings_initializer=initializers.RandomNormal(stddev=0.02),
            name="token_embedding",
        )
        self.position_embedding = layers.Embedding(
            seq_len,
            d_model,
            embeddings_initializer=initializers.RandomNormal(stddev=0.02),
            name="position_embedding",
        )

    def build(self, input_shape):
        self.token_embedding.build(input_shape)
        self.position_embedding.build((input_shape[1],))
        super().build(input_shape)

    def call(self, tokens):
        positions = tf.range(tf.shape(tokens)[1])
        return self.token_embedding(tokens) + self.position_embedding(positions)[tf.newaxis]


class EncoderLayer(layers.Layer):
    """nn.TransformerEncoderLayer(norm_first=True, activation="gelu", batch_first=True):
    x = x + dropout1(self_attn(norm1(x)));
    x = x + dropout2(linear2(dropout(gelu(linear1(norm2(x))))))."""

    def __init__(
        self, d_model: int, num_heads: int, dim_feedforward: int, dropout: float, **kwargs
    ):
        super().__init__(**kwargs)
        if d_model % num_heads:
            raise ValueError("d_model must be divisible by num_heads")
        self.d_model, self.num_heads = d_model, num_heads
        self.head_dim = d_model // num_heads
        self.norm1 = layers.LayerNormalization(epsilon=LN_EPSILON, name="norm1")
        # PyTorch: in_proj_weight (3d, d) Xavier-uniform, in_proj_bias zeros
        self.in_proj = layers.Dense(
            3 * d_model,
            kernel_initializer=initializers.GlorotUniform(),
            bias_initializer="zeros",
            name="self_attn_in_proj",
        )
        # PyTorch: out_proj keeps nn.Linear's default weight init, bias zeroed
        self.out_proj = torch_linear(d_model, d_model, name="self_attn_out_proj", zero_bias=True)
        self.attn_dropout = layers.Dropout(dropout, name="self_attn_dropout")
        self.dropout1 = layers.Dropout(dropout, name="dropout1")
        self.norm2 = layers.LayerNormalization(epsilon=LN_EPSILON, name="norm2")
        self.linear1 = torch_linear(dim_feedforward, d_model, name="linear1")
        self.dropout = layers.Dropout(dropout, name="dropout")
        self.linear2 = torch_linear(d_model, dim_feedforward, name="linear2")
        self.dropout2 = layers.Dropout(dropout, name="dropout2")

    def build(self, input_shape):
        ff = self.linear1.units
        self.norm1.build(input_shape)
        self.in_proj.build(input_shape)
        self.out_proj.build(input_shape)
        self.norm2.build(input_shape)
        self.linear1.build(input_shape)
        self.linear2.build((*input_shape[:-1], ff))
        super().build(input_shape)

    def _self_attention(self, x, training):
        n, length = tf.shape(x)[0], tf.shape(x)[1]
        qkv = tf.reshape(self.in_proj(x), [n, length, 3, self.num_heads, self.head_dim])
        qkv = tf.transpose(qkv, [2, 0, 3, 1, 4])  # (3, N, H, L, Dh)
        q, k, v = qkv[0], qkv[1], qkv[2]
        scores = tf.matmul(q, k, transpose_b=True) * tf.cast(
            1.0 / math.sqrt(self.head_dim), q.dtype
        )
        probs = tf.cast(tf.nn.softmax(tf.cast(scores, tf.float32), axis=-1), q.dtype)
        probs = self.attn_dropout(probs, training=training)
        out = tf.transpose(tf.matmul(probs, v), [0, 2, 1, 3])  # (N, L, H, Dh)
        return self.out_proj(tf.reshape(out, [n, length, self.d_model]))

    def call(self, x, training=None):
        x = x + self.dropout1(self._self_attention(self.norm1(x), training), training=training)
        h = tf.nn.gelu(self.linear1(self.norm2(x)), approximate=False)
        h = self.linear2(self.dropout(h, training=training))
        return x + self.dropout2(h, training=training)


def transformer_classifier(
    vocab_size: int = 8192,
    seq_len: int = 128,
    num_classes: int = 2,
    d_model: int = 256,
    num_layers: int = 4,
    num_heads: int = 4,
    dim_feedforward: int = 1024,
    dropout: float = 0.1,
    name: str = "transformer_small",
):
    tokens = keras.Input(shape=(seq_len,), dtype="int64", name="tokens")
    x = TokenAndPositionEmbedding(vocab_size, seq_len, d_model, name="embedding")(tokens)
    for i in range(num_layers):
        x = EncoderLayer(d_model, num_heads, dim_feedforward, dropout, name=f"encoder_layers_{i}")(
            x
        )
    x = layers.LayerNormalization(epsilon=LN_EPSILON, name="encoder_norm")(x)
    x = layers.GlobalAveragePooling1D(name="mean_pool")(x)
    x = torch_linear(num_classes, d_model, name="head")(x)
    return keras.Model(tokens, float32_logits()(x), name=name)


def from_spec(
    spec: ModelSpec,
    *,
    d_model: int,
    num_layers: int,
    num_heads: int,
    dim_feedforward: int,
    dropout: float,
):
    """The classifier of `spec` (the registry's arch="transformer"): vocabulary, sequence length
    and classes from the spec, the encoder's sizes from `arch_kwargs`."""
    return transformer_classifier(
        vocab_size=spec.vocab_size,
        seq_len=spec.input_shape[0],
        num_classes=spec.num_classes,
        d_model=d_model,
        num_layers=num_layers,
        num_heads=num_heads,
        dim_feedforward=dim_feedforward,
        dropout=dropout,
        name=spec.name,
    )

"""Keras helpers shared by the TensorFlow builders: the Keras in use and PyTorch's initialisers.

`keras` is whatever `tf.keras` resolves to in this process: Keras 3 by default, legacy Keras 2
(tf_keras) when TF_USE_LEGACY_KERAS=1 was set before TensorFlow was imported. The builders use
only layers and initialisers that both provide, so one definition serves both adapters.
"""

from __future__ import annotations

import math

import tensorflow as tf

from dlscale.models import ModelSpec

keras = tf.keras
layers = keras.layers
initializers = keras.initializers

#: PyTorch BatchNorm2d defaults (eps 1e-5, momentum 0.1 == Keras momentum 0.9).
BN_EPSILON = 1e-5
BN_MOMENTUM = 0.9
#: PyTorch LayerNorm default eps.
LN_EPSILON = 1e-5


def kaiming_normal_fan_out():
    """torch.nn.init.kaiming_normal_(mode="fan_out", nonlinearity="relu"): N(0, 2 / fan_out)."""
    return initializers.VarianceScaling(
        scale=2.0, mode="fan_out", distribution="untruncated_normal"
    )


def torch_linear(
    units: int,
    fan_in: int,
    name: str | None = None,
    zero_bias: bool = False,
    kernel_initializer=None,
):
    """A Dense layer initialised like torch.nn.Linear: weight and bias U(-1/sqrt(fan_in), +)."""
    bound = 1.0 / math.sqrt(fan_in)
    return layers.Dense(
        units,
        name=name,
        kernel_initializer=kernel_initializer
        or initializers.VarianceScaling(scale=1.0 / 3.0, mode="fan_in", distribution="uniform"),
        bias_initializer="zeros" if zero_bias else initializers.RandomUniform(-bound, bound),
    )


def float32_logits(name: str = "logits_float32"):
    """Identity that casts logits to float32 (no parameters): under a mixed-precision policy the
    loss is computed in float32, as Keras' mixed-precision guide prescribes."""
    return layers.Activation("linear", dtype="float32", name=name)


def input_shape(spec: ModelSpec) -> tuple[int, ...]:
    """Per-sample input shape as the Keras models take it: (H, W, C) for vision, (L,) for tokens."""
    if spec.family == "vision":
        c, h, w = spec.input_shape
        return (h, w, c)
    return tuple(spec.input_shape)

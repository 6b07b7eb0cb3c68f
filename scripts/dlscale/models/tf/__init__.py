"""TensorFlow/Keras builders for the models registered in :mod:`dlscale.models`.

The same architectures as :mod:`dlscale.models.torch`, with exactly the same (trainable)
parameter counts, built with `tf.keras` -- Keras 3 by default, legacy Keras 2 (tf_keras) when
TF_USE_LEGACY_KERAS=1 was set before TensorFlow was imported. Vision models take NHWC images
(TensorFlow's native layout on CPU); the registry's per-sample shape is (C, H, W).

Usage::

    from dlscale.models import get_spec
    from dlscale.models.tf import build, example_batch

    with strategy.scope():
        model = build("resnet50")
    images, labels = example_batch(get_spec("resnet50"), 32, seed=0)
"""
from __future__ import annotations

from collections.abc import Callable

import tensorflow as tf

from dlscale.models import ModelSpec, get_spec

from .cnn import small_cnn
from .resnet import resnet18, resnet50
from .transformer import transformer_classifier

__all__ = ["BUILDERS", "build", "example_batch", "input_shape", "param_count"]


def input_shape(spec: ModelSpec) -> tuple[int, ...]:
    """Per-sample input shape as the Keras models take it: (H, W, C) for vision, (L,) for tokens."""
    if spec.family == "vision":
        c, h, w = spec.input_shape
        return (h, w, c)
    return tuple(spec.input_shape)


#: Builder per registered model name; each takes the model's spec and returns a Keras model.
BUILDERS: dict[str, Callable[[ModelSpec], object]] = {
    "resnet50": lambda s: resnet50(input_shape(s), num_classes=s.num_classes),
    "resnet18": lambda s: resnet18(input_shape(s), num_classes=s.num_classes),
    "cnn_small": lambda s: small_cnn(input_shape(s), num_classes=s.num_classes),
    "transformer_small": lambda s: transformer_classifier(
        vocab_size=s.vocab_size, seq_len=s.input_shape[0], num_classes=s.num_classes),
}


def build(name: str):
    """A freshly initialised Keras model for the registered model `name` (build it inside
    `strategy.scope()` to distribute it).

    Raises:
        KeyError: `name` is unknown or has no TensorFlow builder.
    """
    spec = get_spec(name)
    try:
        builder = BUILDERS[name]
    except KeyError:
        raise KeyError(f"model {name!r} has no TensorFlow builder; allowed: "
                       f"{', '.join(BUILDERS)}") from None
    return builder(spec)


def param_count(model) -> int:
    """Trainable parameters (PyTorch's `parameters()`; BN moving statistics are buffers)."""
    return int(sum(int(tf.size(w)) for w in model.trainable_weights))


def example_batch(spec: ModelSpec, batch: int, seed: int = 0) -> tuple[tf.Tensor, tf.Tensor]:
    """A synthetic (inputs, labels) batch matching `spec`, created on the current device.

    Vision inputs are standard-normal float32 of shape (batch, H, W, C); sequence inputs are
    uniform int64 token ids in [0, vocab_size). Labels are int64 class indices of shape (batch,).
    """
    gen = tf.random.Generator.from_seed(seed)
    if spec.family == "vision":
        inputs = gen.normal((batch, *input_shape(spec)), dtype=tf.float32)
    elif spec.family == "sequence":
        inputs = gen.uniform((batch, *spec.input_shape), minval=0, maxval=spec.vocab_size,
                             dtype=tf.int64)
    else:
        raise ValueError(f"unknown model family {spec.family!r} for model {spec.name!r}")
    labels = gen.uniform((batch,), minval=0, maxval=spec.num_classes, dtype=tf.int64)
    return inputs, labels

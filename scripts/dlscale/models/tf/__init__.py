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

A model is built by `dlscale.models.tf.<spec.arch>.from_spec(spec, **spec.arch_kwargs)` (found by
convention, `dlscale.models.find_builder`); there is no list to extend.
"""

from __future__ import annotations

import tensorflow as tf

from dlscale.models import ModelSpec, find_builder, supported
from dlscale.models.tf._common import input_shape

__all__ = ["build", "example_batch", "input_shape", "names", "param_count"]


def names() -> list[str]:
    """Registered model names that have a TensorFlow builder, in registry order."""
    return supported(__name__)


def build(name: str):
    """A freshly initialised Keras model for the registered model `name` (build it inside
    `strategy.scope()` to distribute it).

    Raises:
        KeyError: `name` is unknown or has no TensorFlow builder.
    """
    return find_builder(__name__, "TensorFlow", name)()


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
        inputs = gen.uniform(
            (batch, *spec.input_shape), minval=0, maxval=spec.vocab_size, dtype=tf.int64
        )
    else:
        raise ValueError(f"unknown model family {spec.family!r} for model {spec.name!r}")
    labels = gen.uniform((batch,), minval=0, maxval=spec.num_classes, dtype=tf.int64)
    return inputs, labels

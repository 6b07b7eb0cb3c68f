"""Small CIFAR-size CNN in Keras, layer for layer the PyTorch `SmallCNN` (391,466 parameters)."""

from __future__ import annotations

from collections.abc import Sequence

from dlscale.models import ModelSpec
from dlscale.models.tf._common import (
    BN_EPSILON,
    BN_MOMENTUM,
    float32_logits,
    input_shape,
    kaiming_normal_fan_out,
    keras,
    layers,
    torch_linear,
)

CHANNELS: tuple[int, ...] = (32, 64, 128, 256)


def small_cnn(
    input_shape_hwc: tuple[int, int, int],
    num_classes: int = 10,
    channels: tuple[int, ...] = CHANNELS,
    name: str = "cnn_small",
):
    """Four conv3x3(no bias)-BN-ReLU-maxpool2 blocks, global average pool, linear head (NHWC)."""
    inputs = keras.Input(shape=input_shape_hwc, name="images")
    x = inputs
    prev = input_shape_hwc[-1]
    for i, width in enumerate(channels):
        # stride 1, kernel 3: "same" pads 1 on every side, exactly like padding=1
        x = layers.Conv2D(
            width,
            3,
            padding="same",
            use_bias=False,
            kernel_initializer=kaiming_normal_fan_out(),
            name=f"features_{i}_conv",
        )(x)
        x = layers.BatchNormalization(
            epsilon=BN_EPSILON, momentum=BN_MOMENTUM, name=f"features_{i}_bn"
        )(x)
        x = layers.ReLU(name=f"features_{i}_relu")(x)
        x = layers.MaxPooling2D(2, name=f"features_{i}_pool")(x)
        prev = width
    x = layers.GlobalAveragePooling2D(name="pool")(x)
    x = torch_linear(num_classes, prev, name="head")(x)
    return keras.Model(inputs, float32_logits()(x), name=name)


def from_spec(spec: ModelSpec, *, channels: Sequence[int]):
    """The CNN of `spec` (the registry's arch="cnn"): one conv block per `channels`."""
    return small_cnn(
        input_shape(spec), num_classes=spec.num_classes, channels=tuple(channels), name=spec.name
    )

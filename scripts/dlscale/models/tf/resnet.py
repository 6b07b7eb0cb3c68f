"""ImageNet-style ResNets in Keras (NHWC; the registry's arch="resnet"), layer for layer the
PyTorch/torchvision ones: `arch_kwargs = {"block": "basic" | "bottleneck", "layers": (4 counts)}`,
the bottleneck being v1.5.

Same layers, order, biases (none on convolutions), BatchNorm (eps 1e-5, momentum 0.1 in PyTorch
terms), initialisation (Kaiming-normal fan-out convolutions, BN gamma 1 / beta 0, PyTorch-default
linear head) and parameter counts (e.g. ResNet-18 11,689,512 and ResNet-50 25,557,032 trainable
parameters; Keras' BN moving mean/variance are buffers, as in PyTorch). Padding is symmetric like
PyTorch's: strided convolutions and the stem max-pool pad explicitly (ZeroPadding2D + "valid"),
because Keras' "same" pads asymmetrically when the stride is 2. Zero padding before the max-pool
equals PyTorch's -inf padding there, since it follows a ReLU.
"""

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


def _conv(x, filters: int, kernel: int, stride: int, name: str):
    """Conv2D without bias, padding (kernel - 1) // 2 on every side, as in PyTorch."""
    pad = (kernel - 1) // 2
    if pad and stride > 1:
        x = layers.ZeroPadding2D(pad, name=f"{name}_pad")(x)
        padding = "valid"
    else:
        padding = "same" if pad else "valid"
    return layers.Conv2D(
        filters,
        kernel,
        strides=stride,
        padding=padding,
        use_bias=False,
        kernel_initializer=kaiming_normal_fan_out(),
        name=name,
    )(x)


def _bn(x, name: str):
    return layers.BatchNormalization(epsilon=BN_EPSILON, momentum=BN_MOMENTUM, name=name)(x)


def _basic_block(x, inplanes: int, planes: int, stride: int, name: str):
    identity = x
    if stride != 1 or inplanes != planes:
        identity = _bn(_conv(x, planes, 1, stride, f"{name}_downsample_0"), f"{name}_downsample_1")
    out = layers.ReLU(name=f"{name}_relu1")(
        _bn(_conv(x, planes, 3, stride, f"{name}_conv1"), f"{name}_bn1")
    )
    out = _bn(_conv(out, planes, 3, 1, f"{name}_conv2"), f"{name}_bn2")
    return layers.ReLU(name=f"{name}_relu2")(layers.Add(name=f"{name}_add")([out, identity]))


def _bottleneck(x, inplanes: int, planes: int, stride: int, name: str):
    expansion = 4
    identity = x
    if stride != 1 or inplanes != planes * expansion:
        identity = _bn(
            _conv(x, planes * expansion, 1, stride, f"{name}_downsample_0"), f"{name}_downsample_1"
        )
    out = layers.ReLU(name=f"{name}_relu1")(
        _bn(_conv(x, planes, 1, 1, f"{name}_conv1"), f"{name}_bn1")
    )
    # v1.5: the stride sits on the 3x3 convolution
    out = layers.ReLU(name=f"{name}_relu2")(
        _bn(_conv(out, planes, 3, stride, f"{name}_conv2"), f"{name}_bn2")
    )
    out = _bn(_conv(out, planes * expansion, 1, 1, f"{name}_conv3"), f"{name}_bn3")
    return layers.ReLU(name=f"{name}_relu3")(layers.Add(name=f"{name}_add")([out, identity]))


def _resnet(
    block, expansion: int, blocks_per_stage: list[int], input_shape_hwc, num_classes: int, name: str
):
    inputs = keras.Input(shape=input_shape_hwc, name="images")
    x = _conv(inputs, 64, 7, 2, "conv1")
    x = layers.ReLU(name="relu")(_bn(x, "bn1"))
    x = layers.ZeroPadding2D(1, name="maxpool_pad")(x)
    x = layers.MaxPooling2D(3, strides=2, name="maxpool")(x)
    inplanes = 64
    for stage, (planes, blocks) in enumerate(zip((64, 128, 256, 512), blocks_per_stage), start=1):
        for b in range(blocks):
            stride = 2 if (stage > 1 and b == 0) else 1
            x = block(x, inplanes, planes, stride, f"layer{stage}_{b}")
            inplanes = planes * expansion
    x = layers.GlobalAveragePooling2D(name="avgpool")(x)
    x = torch_linear(num_classes, 512 * expansion, name="fc")(x)
    return keras.Model(inputs, float32_logits()(x), name=name)


#: Residual block function and its channel expansion per `arch_kwargs["block"]`.
BLOCKS = {"basic": (_basic_block, 1), "bottleneck": (_bottleneck, 4)}


def from_spec(spec: ModelSpec, *, block: str, layers: Sequence[int]):
    """The ResNet of `spec`: `block` ("basic" or "bottleneck") stages of `layers` blocks."""
    if block not in BLOCKS:
        raise ValueError(f"unknown ResNet block {block!r}; allowed: {', '.join(BLOCKS)}")
    block_fn, expansion = BLOCKS[block]
    return _resnet(
        block_fn, expansion, list(layers), input_shape(spec), spec.num_classes, spec.name
    )

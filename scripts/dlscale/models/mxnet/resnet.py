"""ImageNet-style ResNets in Gluon (the registry's ``arch="resnet"``; ``arch_kwargs =
{"block": "basic" | "bottleneck", "layers": (blocks per stage x 4)}``), mirroring
:mod:`dlscale.models.torch.resnet` (the torchvision layout): 7x7 stem without bias, BN, ReLU,
3x3/2 max-pool, four stages, global average pool, biased linear head; the shortcut projection
is a strided 1x1 conv + BN and, in the bottleneck (v1.5), the stride sits on the 3x3
convolution. Gluon's own model zoo ``resnet50_v1`` strides the first 1x1 conv instead (v1), so
it is not used."""

from __future__ import annotations

from collections.abc import Sequence

from mxnet.gluon import nn

from dlscale.models import ModelSpec
from dlscale.models.mxnet.init import KAIMING_FAN_OUT, linear

__all__ = ["BLOCKS", "BasicBlock", "Bottleneck", "ResNet", "from_spec"]


def _conv(out_planes: int, in_planes: int, kernel: int, stride: int = 1) -> nn.Conv2D:
    return nn.Conv2D(
        out_planes,
        kernel_size=kernel,
        strides=stride,
        padding=kernel // 2,
        use_bias=False,
        in_channels=in_planes,
        weight_initializer=KAIMING_FAN_OUT,
    )


def _bn(channels: int) -> nn.BatchNorm:
    # torch: momentum 0.1 on the new statistic == Gluon momentum 0.9 on the running one.
    return nn.BatchNorm(in_channels=channels, momentum=0.9, epsilon=1e-5)


class BasicBlock(nn.HybridBlock):
    """Two 3x3 convolutions with a residual connection (ResNet-18/34)."""

    expansion = 1

    def __init__(
        self, inplanes: int, planes: int, stride: int = 1, downsample: bool = False, **kwargs
    ) -> None:
        super().__init__(**kwargs)
        with self.name_scope():
            self.conv1 = _conv(planes, inplanes, 3, stride)
            self.bn1 = _bn(planes)
            self.conv2 = _conv(planes, planes, 3)
            self.bn2 = _bn(planes)
            self.downsample = None
            if downsample:
                self.downsample = nn.HybridSequential(prefix="downsample_")
                self.downsample.add(_conv(planes, inplanes, 1, stride), _bn(planes))

    def hybrid_forward(self, F, x):
        identity = x if self.downsample is None else self.downsample(x)
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + identity)


class Bottleneck(nn.HybridBlock):
    """1x1 reduce, 3x3 (strided, v1.5), 1x1 expand, with a residual connection."""

    expansion = 4

    def __init__(
        self, inplanes: int, planes: int, stride: int = 1, downsample: bool = False, **kwargs
    ) -> None:
        super().__init__(**kwargs)
        out = planes * self.expansion
        with self.name_scope():
            self.conv1 = _conv(planes, inplanes, 1)
            self.bn1 = _bn(planes)
            self.conv2 = _conv(planes, planes, 3, stride)
            self.bn2 = _bn(planes)
            self.conv3 = _conv(out, planes, 1)
            self.bn3 = _bn(out)
            self.downsample = None
            if downsample:
                self.downsample = nn.HybridSequential(prefix="downsample_")
                self.downsample.add(_conv(out, inplanes, 1, stride), _bn(out))

    def hybrid_forward(self, F, x):
        identity = x if self.downsample is None else self.downsample(x)
        out = F.relu(self.bn1(self.conv1(x)))
        out = F.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return F.relu(out + identity)


class ResNet(nn.HybridBlock):
    """ImageNet-style ResNet: 7x7 stem, max-pool, four stages, average pool, linear head."""

    def __init__(
        self, block, layers: list[int], num_classes: int = 1000, in_channels: int = 3, **kwargs
    ) -> None:
        super().__init__(**kwargs)
        self.inplanes = 64
        with self.name_scope():
            self.conv1 = nn.Conv2D(
                64,
                kernel_size=7,
                strides=2,
                padding=3,
                use_bias=False,
                in_channels=in_channels,
                weight_initializer=KAIMING_FAN_OUT,
            )
            self.bn1 = _bn(64)
            self.maxpool = nn.MaxPool2D(pool_size=3, strides=2, padding=1)
            self.layer1 = self._make_layer(block, 64, layers[0], 1, "layer1_")
            self.layer2 = self._make_layer(block, 128, layers[1], 2, "layer2_")
            self.layer3 = self._make_layer(block, 256, layers[2], 2, "layer3_")
            self.layer4 = self._make_layer(block, 512, layers[3], 2, "layer4_")
            self.avgpool = nn.GlobalAvgPool2D()
            self.fc = linear(num_classes, 512 * block.expansion, prefix="fc_")

    def _make_layer(self, block, planes: int, blocks: int, stride: int, prefix: str):
        """One stage; the first block projects the shortcut when the shape changes."""
        stage = nn.HybridSequential(prefix=prefix)
        downsample = stride != 1 or self.inplanes != planes * block.expansion
        with stage.name_scope():
            stage.add(block(self.inplanes, planes, stride, downsample, prefix="0_"))
            self.inplanes = planes * block.expansion
            for i in range(1, blocks):
                stage.add(block(self.inplanes, planes, prefix=f"{i}_"))
        return stage

    def hybrid_forward(self, F, x):
        """Map images ``(N, C, H, W)`` to logits ``(N, num_classes)``."""
        x = self.maxpool(F.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(F.flatten(self.avgpool(x)))


#: Residual block per ``arch_kwargs["block"]``.
BLOCKS = {"basic": BasicBlock, "bottleneck": Bottleneck}


def from_spec(spec: ModelSpec, *, block: str, layers: Sequence[int]) -> ResNet:
    """The ResNet of ``spec``: ``block`` ("basic" or "bottleneck") stages of ``layers`` blocks,
    parameter names prefixed ``<spec.name>_``."""
    if block not in BLOCKS:
        raise ValueError(f"unknown ResNet block {block!r}; allowed: {', '.join(BLOCKS)}")
    return ResNet(
        BLOCKS[block],
        list(layers),
        num_classes=spec.num_classes,
        in_channels=spec.input_shape[0],
        prefix=f"{spec.name}_",
    )

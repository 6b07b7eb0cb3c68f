"""Small CIFAR-size CNN (Gluon mirror of :mod:`dlscale.models.torch.cnn`)."""

from __future__ import annotations

from collections.abc import Sequence

from mxnet.gluon import nn

from dlscale.models import ModelSpec
from dlscale.models.mxnet.init import KAIMING_FAN_OUT, linear

__all__ = ["SmallCNN", "CHANNELS", "from_spec"]

#: Output channels of the conv blocks; each block halves the spatial size (32 -> 2).
CHANNELS: tuple[int, ...] = (32, 64, 128, 256)


class SmallCNN(nn.HybridBlock):
    """Four conv3x3(no bias)-BN-ReLU-maxpool blocks, global average pool and a linear head:
    391,466 trainable parameters with 3 input channels and 10 classes."""

    def __init__(
        self,
        in_channels: int = 3,
        num_classes: int = 10,
        channels: tuple[int, ...] = CHANNELS,
        **kwargs,
    ) -> None:
        super().__init__(**kwargs)
        with self.name_scope():
            self.features = nn.HybridSequential(prefix="features_")
            prev = in_channels
            with self.features.name_scope():
                for width in channels:
                    self.features.add(
                        nn.Conv2D(
                            width,
                            kernel_size=3,
                            padding=1,
                            use_bias=False,
                            in_channels=prev,
                            weight_initializer=KAIMING_FAN_OUT,
                        ),
                        nn.BatchNorm(in_channels=width, momentum=0.9, epsilon=1e-5),
                        nn.Activation("relu"),
                        nn.MaxPool2D(pool_size=2, strides=2),
                    )
                    prev = width
            self.pool = nn.GlobalAvgPool2D()
            self.head = linear(num_classes, prev, prefix="head_")

    def hybrid_forward(self, F, x):
        """Map images ``(N, C, H, W)`` to logits ``(N, num_classes)``."""
        return self.head(F.flatten(self.pool(self.features(x))))


def from_spec(spec: ModelSpec, *, channels: Sequence[int]) -> SmallCNN:
    """The CNN of ``spec`` (the registry's ``arch="cnn"``): one conv block per ``channels``."""
    return SmallCNN(
        in_channels=spec.input_shape[0], num_classes=spec.num_classes, channels=tuple(channels)
    )

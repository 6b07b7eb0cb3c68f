"""Small CIFAR-size CNN, cheap enough to train on a single CPU core."""

from __future__ import annotations

from collections.abc import Sequence

from torch import Tensor, nn

from dlscale.models import ModelSpec

__all__ = ["SmallCNN", "CHANNELS", "from_spec"]

#: Output channels of the conv blocks; each block halves the spatial size (32 -> 2).
CHANNELS: tuple[int, ...] = (32, 64, 128, 256)


class SmallCNN(nn.Module):
    """Four conv3x3-BN-ReLU-maxpool blocks, global average pool and a linear head.

    With the default :data:`CHANNELS`, 3 input channels and 10 classes the model has
    391,466 parameters.

    Args:
        in_channels: Number of input image channels.
        num_classes: Number of output logits.
        channels: Output channels of each conv block.
    """

    def __init__(
        self,
        in_channels: int = 3,
        num_classes: int = 10,
        channels: tuple[int, ...] = CHANNELS,
    ) -> None:
        super().__init__()
        blocks: list[nn.Module] = []
        prev = in_channels
        for width in channels:
            blocks += [
                nn.Conv2d(prev, width, kernel_size=3, padding=1, bias=False),
                nn.BatchNorm2d(width),
                nn.ReLU(inplace=True),
                nn.MaxPool2d(kernel_size=2),
            ]
            prev = width
        self.features = nn.Sequential(*blocks)
        self.pool = nn.AdaptiveAvgPool2d((1, 1))
        self.head = nn.Linear(prev, num_classes)

        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x: Tensor) -> Tensor:
        """Map images ``(N, C, H, W)`` to logits ``(N, num_classes)``."""
        return self.head(self.pool(self.features(x)).flatten(1))


def from_spec(spec: ModelSpec, *, channels: Sequence[int]) -> SmallCNN:
    """The CNN of ``spec`` (the registry's ``arch="cnn"``): one conv block per ``channels``."""
    return SmallCNN(
        in_channels=spec.input_shape[0], num_classes=spec.num_classes, channels=tuple(channels)
    )

"""PyTorch builders for the models registered in :mod:`dlscale.models`.

Usage::

    from dlscale.models import get_spec
    from dlscale.models.torch import build, example_batch

    model = build("resnet50")
    inputs, labels = example_batch(get_spec("resnet50"), batch_size=32)
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from dlscale.models import ModelSpec, get_spec
from dlscale.models.torch.cnn import SmallCNN
from dlscale.models.torch.resnet import resnet18, resnet50
from dlscale.models.torch.transformer import TransformerClassifier

__all__ = ["BUILDERS", "build", "example_batch"]

#: Builder per registered model name; each takes the model's spec and returns the module.
BUILDERS: dict[str, Callable[[ModelSpec], nn.Module]] = {
    "resnet50": lambda s: resnet50(num_classes=s.num_classes, in_channels=s.input_shape[0]),
    "resnet18": lambda s: resnet18(num_classes=s.num_classes, in_channels=s.input_shape[0]),
    "cnn_small": lambda s: SmallCNN(in_channels=s.input_shape[0], num_classes=s.num_classes),
    "transformer_small": lambda s: TransformerClassifier(
        vocab_size=s.vocab_size, seq_len=s.input_shape[0], num_classes=s.num_classes
    ),
}


def build(name: str) -> nn.Module:
    """Build a freshly initialised PyTorch model for the registered model ``name``.

    Raises:
        KeyError: ``name`` is unknown or has no PyTorch builder; the message lists the
            allowed names.
    """
    spec = get_spec(name)
    try:
        builder = BUILDERS[name]
    except KeyError:
        raise KeyError(
            f"model {name!r} has no PyTorch builder; allowed: {', '.join(BUILDERS)}"
        ) from None
    return builder(spec)


def example_batch(
    spec: ModelSpec, batch_size: int, device: str | torch.device = "cpu"
) -> tuple[Tensor, Tensor]:
    """Return a synthetic ``(inputs, labels)`` batch matching ``spec``.

    Vision inputs are standard-normal ``float32`` tensors of shape
    ``(batch_size, *spec.input_shape)`` (contiguous, channels-first); sequence inputs are
    uniform random ``int64`` token ids in ``[0, spec.vocab_size)``. Labels are ``int64``
    class indices in ``[0, spec.num_classes)`` of shape ``(batch_size,)``.
    """
    shape = (batch_size, *spec.input_shape)
    if spec.family == "vision":
        inputs = torch.randn(shape, dtype=torch.float32, device=device)
    elif spec.family == "sequence":
        inputs = torch.randint(0, spec.vocab_size, shape, dtype=torch.int64, device=device)
    else:
        raise ValueError(f"unknown model family {spec.family!r} for model {spec.name!r}")
    labels = torch.randint(0, spec.num_classes, (batch_size,), dtype=torch.int64, device=device)
    return inputs, labels

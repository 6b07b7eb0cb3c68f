"""PyTorch builders for the models registered in :mod:`dlscale.models`.

Usage::

    from dlscale.models import get_spec
    from dlscale.models.torch import build, example_batch

    model = build("resnet50")
    inputs, labels = example_batch(get_spec("resnet50"), batch_size=32)

A model is built by ``dlscale.models.torch.<spec.arch>.from_spec(spec, **spec.arch_kwargs)``
(found by convention, :func:`dlscale.models.find_builder`); there is no list to extend.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from dlscale.models import DECODER, ModelSpec, find_builder, supported

__all__ = ["build", "example_batch", "names"]


def names() -> list[str]:
    """Registered model names that have a PyTorch builder, in registry order."""
    return supported(__name__)


def build(name: str, seq_len: int | None = None) -> nn.Module:
    """Build a freshly initialised PyTorch model for the registered model ``name`` (a
    decoder at sequence length ``seq_len``; None: the registry's).

    Raises:
        KeyError: ``name`` is unknown or has no PyTorch builder; the message lists the
            allowed names.
    """
    return find_builder(__name__, "PyTorch", name, seq_len)()


def example_batch(
    spec: ModelSpec, batch_size: int, device: str | torch.device = "cpu"
) -> tuple[Tensor, Tensor]:
    """Return a synthetic ``(inputs, labels)`` batch matching ``spec``.

    Vision inputs are standard-normal ``float32`` tensors of shape
    ``(batch_size, *spec.input_shape)`` (contiguous, channels-first); sequence inputs are
    uniform random ``int64`` token ids in ``[0, spec.vocab_size)``. Labels are ``int64``
    class indices in ``[0, spec.num_classes)`` of shape ``(batch_size,)``. A decoder's
    (``family="decoder"``) inputs are the first ``seq_len`` of ``seq_len + 1`` random tokens
    per sequence and its labels the next tokens, flattened to ``(batch_size * seq_len,)`` (one
    label per position, as the decoder's flattened logits).
    """
    if spec.family == DECODER:
        seq_len = spec.input_shape[0]
        tokens = torch.randint(
            0, spec.vocab_size, (batch_size, seq_len + 1), dtype=torch.int64, device=device
        )
        return tokens[:, :-1].contiguous(), tokens[:, 1:].reshape(-1)
    shape = (batch_size, *spec.input_shape)
    if spec.family == "vision":
        inputs = torch.randn(shape, dtype=torch.float32, device=device)
    elif spec.family == "sequence":
        inputs = torch.randint(0, spec.vocab_size, shape, dtype=torch.int64, device=device)
    else:
        raise ValueError(f"unknown model family {spec.family!r} for model {spec.name!r}")
    labels = torch.randint(0, spec.num_classes, (batch_size,), dtype=torch.int64, device=device)
    return inputs, labels

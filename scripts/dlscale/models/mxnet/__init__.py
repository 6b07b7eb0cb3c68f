"""MXNet Gluon builders for the models registered in :mod:`dlscale.models`.

Each builder mirrors the PyTorch reference in :mod:`dlscale.models.torch` layer by layer:
the same layer order, the same biases (none on convolutions, affine BatchNorm/LayerNorm,
biased linear layers), the same activations (ReLU, exact erf GELU), the same dropout and the
PyTorch initialisation schemes, so the trainable parameter counts are identical (each
registry entry's ``param_count``).

Usage::

    from dlscale.models import get_spec
    from dlscale.models.mxnet import build, example_batch, param_count

    net = build("resnet50")          # initialised, shapes known (one forward pass was run)
    inputs, labels = example_batch(get_spec("resnet50"), batch_size=32)

A model is built by ``dlscale.models.mxnet.<spec.arch>.from_spec(spec, **spec.arch_kwargs)``
(found by convention, :func:`dlscale.models.find_builder`); there is no list to extend.

Gluon's BatchNorm also holds its running mean/variance as parameters with ``grad_req='null'``;
PyTorch keeps those as buffers, so :func:`param_count` counts only trainable parameters.
"""

from __future__ import annotations

import mxnet as mx
from mxnet import gluon

from dlscale.models import ModelSpec, find_builder, get_spec, supported

__all__ = ["build", "example_batch", "names", "param_count"]


def names() -> list[str]:
    """Registered model names that have an MXNet builder, in registry order."""
    return supported(__name__)


def build(name: str, ctx: mx.Context | None = None, initialize: bool = True) -> gluon.HybridBlock:
    """Build the Gluon block for the registered model ``name``.

    With ``initialize`` (the default) the parameters are initialised on ``ctx`` (CPU unless
    given) and one forward pass on a 1-sample batch completes Gluon's deferred shape
    inference, so every parameter has its final shape afterwards.

    Raises:
        KeyError: ``name`` is unknown or has no MXNet builder.
    """
    net = find_builder(__name__, "MXNet", name)()
    if initialize:
        ctx = ctx or mx.cpu()
        net.initialize(ctx=ctx)
        x, _ = example_batch(get_spec(name), 1, ctx=ctx)
        net(x).wait_to_read()
    return net


def param_count(net: gluon.Block) -> int:
    """Number of trainable scalars (parameters with a gradient), PyTorch's ``parameters()``."""
    total = 0
    for p in net.collect_params().values():
        if p.grad_req == "null":
            continue
        n = 1
        for d in p.shape:
            n *= d
        total += n
    return total


def example_batch(
    spec: ModelSpec, batch_size: int, ctx: mx.Context | None = None, seed: int | None = None
) -> tuple[mx.nd.NDArray, mx.nd.NDArray]:
    """Return a synthetic ``(inputs, labels)`` batch matching ``spec``, generated on ``ctx``.

    Vision inputs are standard-normal ``float32`` arrays of shape ``(batch_size, C, H, W)``
    (NCHW); sequence inputs are uniform random token ids in ``[0, vocab_size)`` of shape
    ``(batch_size, seq_len)``, held as ``float32`` (Gluon's Embedding takes float indices;
    every id below 2**24 is exact). Labels are class indices in ``[0, num_classes)`` of
    shape ``(batch_size,)`` as ``float32`` (what ``SoftmaxCrossEntropyLoss`` expects).
    ``seed``, if given, seeds MXNet's generator first.
    """
    ctx = ctx or mx.cpu()
    if seed is not None:
        mx.random.seed(seed, ctx=ctx)
    shape = (batch_size, *spec.input_shape)
    if spec.family == "vision":
        inputs = mx.nd.random.normal(0, 1, shape=shape, dtype="float32", ctx=ctx)
    elif spec.family == "sequence":
        inputs = mx.nd.random.randint(
            0, spec.vocab_size, shape=shape, dtype="int32", ctx=ctx
        ).astype("float32")
    else:
        raise ValueError(f"unknown model family {spec.family!r} for model {spec.name!r}")
    labels = mx.nd.random.randint(
        0, spec.num_classes, shape=(batch_size,), dtype="int32", ctx=ctx
    ).astype("float32")
    return inputs, labels

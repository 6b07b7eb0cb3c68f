"""Framework-neutral registry of the benchmark models.

Each entry describes *what* a model consumes and produces (per-sample input shape and
dtype, number of classes, vocabulary size, trainable parameter count) and *which*
architecture builds it (``arch`` and its hyperparameters ``arch_kwargs``), not how any
framework builds it.

Builders are found by convention, not listed: for a framework package ``P``
(``dlscale.models.torch``, ``dlscale.models.tf``, ``dlscale.models.mxnet``) the model
``name`` is built by ``P.<spec.arch>.from_spec(spec, **spec.arch_kwargs)`` (see
:func:`find_builder`). Adding a variant of an existing architecture is therefore one
registry entry; adding a new architecture is one module per framework plus one entry.

This module deliberately imports no deep-learning framework: importing it must stay cheap
and must work in every framework environment.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["BUILDER", "ModelSpec", "SPECS", "find_builder", "get_spec", "names", "supported"]

#: The function every architecture module ``dlscale.models.<framework>.<arch>`` defines:
#: ``from_spec(spec, **spec.arch_kwargs)`` returns that framework's model for ``spec``.
BUILDER = "from_spec"


@dataclass(frozen=True)
class ModelSpec:
    """Description of one benchmark model, independent of any framework.

    Attributes:
        name: Registry key, e.g. ``"resnet50"``.
        family: ``"vision"`` (image classifiers) or ``"sequence"`` (token classifiers).
        input_shape: Per-sample input shape without the batch dimension: ``(C, H, W)``
            (channels-first) for vision models, ``(seq_len,)`` for sequence models.
        input_dtype: ``"float32"`` for vision models, ``"int64"`` (token ids) for
            sequence models.
        num_classes: Number of output logits per sample.
        vocab_size: Token vocabulary size for sequence models, ``None`` for vision models.
        description: One-line human-readable description.
        param_count: Trainable parameters (PyTorch's ``parameters()``; BatchNorm running
            statistics excluded) that every framework's builder reproduces exactly.
        arch: Architecture module name inside each framework package, e.g. ``"resnet"``
            for ``dlscale.models.torch.resnet``.
        arch_kwargs: Architecture hyperparameters passed as keyword arguments to the
            module's ``from_spec`` (plain values: str, int, float, tuples of them).
    """

    name: str
    family: str
    input_shape: tuple[int, ...]
    input_dtype: str
    num_classes: int
    vocab_size: int | None
    description: str
    param_count: int
    arch: str
    arch_kwargs: Mapping[str, Any] = field(default_factory=dict, hash=False)


#: What every ImageNet-shaped classifier consumes and produces.
_IMAGENET = dict(
    family="vision",
    input_shape=(3, 224, 224),
    input_dtype="float32",
    num_classes=1000,
    vocab_size=None,
)

SPECS: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        ModelSpec(
            name="resnet50",
            **_IMAGENET,
            description=(
                "ResNet-50 v1.5 (He et al. 2016; stride on the 3x3 conv), "
                "ImageNet shape 3x224x224, 1000 classes"
            ),
            param_count=25_557_032,  # torchvision's published count
            arch="resnet",
            arch_kwargs={"block": "bottleneck", "layers": (3, 4, 6, 3)},
        ),
        ModelSpec(
            name="resnet18",
            **_IMAGENET,
            description="ResNet-18 (He et al. 2016), ImageNet shape 3x224x224, 1000 classes",
            param_count=11_689_512,  # torchvision's published count
            arch="resnet",
            arch_kwargs={"block": "basic", "layers": (2, 2, 2, 2)},
        ),
        ModelSpec(
            name="cnn_small",
            family="vision",
            input_shape=(3, 32, 32),
            input_dtype="float32",
            num_classes=10,
            vocab_size=None,
            description=(
                "Small CNN (4 conv-bn-relu-maxpool blocks, 32-64-128-256 channels, "
                "global average pool, linear head), CIFAR shape 3x32x32, 10 classes"
            ),
            param_count=391_466,
            arch="cnn",
            arch_kwargs={"channels": (32, 64, 128, 256)},
        ),
        ModelSpec(
            name="transformer_small",
            family="sequence",
            input_shape=(128,),
            input_dtype="int64",
            num_classes=2,
            vocab_size=8192,
            description=(
                "Pre-norm transformer encoder classifier (4 layers, d_model 256, 4 heads, "
                "FFN 1024, learned positions, mean pool), seq_len 128, vocab 8192, 2 classes"
            ),
            param_count=5_289_986,
            arch="transformer",
            arch_kwargs={
                "d_model": 256,
                "num_layers": 4,
                "num_heads": 4,
                "dim_feedforward": 1024,
                "dropout": 0.1,
            },
        ),
        ModelSpec(
            name="resnet34",
            **_IMAGENET,
            description="ResNet-34 (He et al. 2016), ImageNet shape 3x224x224, 1000 classes",
            param_count=21_797_672,  # torchvision's published count
            arch="resnet",
            arch_kwargs={"block": "basic", "layers": (3, 4, 6, 3)},
        ),
    )
}


def names() -> list[str]:
    """Return the registered model names in registry order."""
    return list(SPECS)


def get_spec(name: str) -> ModelSpec:
    """Return the spec registered under ``name``.

    Raises:
        KeyError: ``name`` is not registered; the message lists the allowed names.
    """
    try:
        return SPECS[name]
    except KeyError:
        raise KeyError(f"unknown model {name!r}; allowed: {', '.join(names())}") from None


def supported(package: str) -> list[str]:
    """Registered names, in registry order, whose architecture module exists in the
    framework package ``package`` (e.g. ``"dlscale.models.tf"``); imports no such module."""
    return [n for n, s in SPECS.items() if importlib.util.find_spec(f"{package}.{s.arch}")]


def find_builder(package: str, framework: str, name: str) -> Callable[[], Any]:
    """The zero-argument builder of model ``name`` in the framework package ``package``:
    ``<package>.<spec.arch>.from_spec`` bound to the spec and its ``arch_kwargs``.

    Args:
        package: The framework package, e.g. ``"dlscale.models.torch"``.
        framework: Its human-readable name for messages, e.g. ``"PyTorch"``.
        name: A registered model name.

    Raises:
        KeyError: ``name`` is unknown (the message lists the registered names), or the
            framework has no builder for it (the message names the framework, the missing
            module or function, and the names the framework does support).
    """
    spec = get_spec(name)
    module_name = f"{package}.{spec.arch}"
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name != module_name:  # the module exists but a dependency of it is missing
            raise
        module = None
    builder = getattr(module, BUILDER, None)
    if builder is None:
        raise KeyError(
            f"model {name!r} has no {framework} builder ({module_name}.{BUILDER} not found); "
            f"allowed: {', '.join(supported(package))}"
        )
    return functools.partial(builder, spec, **spec.arch_kwargs)

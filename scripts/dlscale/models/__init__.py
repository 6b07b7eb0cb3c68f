"""Framework-neutral registry of the benchmark models.

Each entry describes *what* a model consumes and produces (per-sample input shape and
dtype, number of classes, vocabulary size), not how it is built. The framework-specific
builders (``dlscale.models.torch`` and, later, TensorFlow/MXNet equivalents) look the
spec up here, so all frameworks agree on the same workloads.

This module deliberately imports no deep-learning framework: importing it must stay cheap
and must work in every framework environment.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ModelSpec", "SPECS", "names", "get_spec"]


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
    """

    name: str
    family: str
    input_shape: tuple[int, ...]
    input_dtype: str
    num_classes: int
    vocab_size: int | None
    description: str


SPECS: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        ModelSpec(
            name="resnet50",
            family="vision",
            input_shape=(3, 224, 224),
            input_dtype="float32",
            num_classes=1000,
            vocab_size=None,
            description=(
                "ResNet-50 v1.5 (He et al. 2016; stride on the 3x3 conv), "
                "ImageNet shape 3x224x224, 1000 classes"
            ),
        ),
        ModelSpec(
            name="resnet18",
            family="vision",
            input_shape=(3, 224, 224),
            input_dtype="float32",
            num_classes=1000,
            vocab_size=None,
            description="ResNet-18 (He et al. 2016), ImageNet shape 3x224x224, 1000 classes",
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
        raise KeyError(
            f"unknown model {name!r}; allowed: {', '.join(names())}"
        ) from None

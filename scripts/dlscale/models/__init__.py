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

import dataclasses
import functools
import importlib
import importlib.util
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dlscale.registry.frameworks import FRAMEWORKS

__all__ = [
    "BUILDER",
    "DECODER",
    "builds",
    "cell_seq_len",
    "ModelSpec",
    "SPECS",
    "decoder_param_count",
    "find_builder",
    "get_spec",
    "llama_ffn_dim",
    "llama_param_count",
    "names",
    "seq_len_of",
    "spec_for",
    "supported",
]

#: The family of decoder-only language models (next-token prediction over a token sequence):
#: the models whose sequence length is a study parameter (config ``seq_len``) and whose
#: throughput is also stated in tokens per second.
DECODER = "decoder"

#: The function every architecture module ``dlscale.models.<framework>.<arch>`` defines:
#: ``from_spec(spec, **spec.arch_kwargs)`` returns that framework's model for ``spec``.
BUILDER = "from_spec"


@dataclass(frozen=True)
class ModelSpec:
    """Description of one benchmark model, independent of any framework.

    Attributes:
        name: Registry key, e.g. ``"resnet50"``.
        family: ``"vision"`` (image classifiers), ``"sequence"`` (token classifiers) or
            ``"decoder"`` (decoder-only language models: one next-token label per position).
        input_shape: Per-sample input shape without the batch dimension: ``(C, H, W)``
            (channels-first) for vision models, ``(seq_len,)`` for sequence models.
        input_dtype: ``"float32"`` for vision models, ``"int64"`` (token ids) for
            sequence models.
        num_classes: Number of output logits per sample (per position for a decoder: the
            vocabulary).
        vocab_size: Token vocabulary size for sequence models, ``None`` for vision models.
        description: One-line human-readable description.
        param_count: Trainable parameters (PyTorch's ``parameters()``; BatchNorm running
            statistics excluded) that every framework's builder reproduces exactly.
        arch: Architecture module name inside each framework package, e.g. ``"resnet"``
            for ``dlscale.models.torch.resnet``.
        arch_kwargs: Architecture hyperparameters passed as keyword arguments to the
            module's ``from_spec`` (plain values: str, int, float, tuples of them).
        frameworks: The frameworks (dlscale.registry.frameworks names) that train it, where
            fewer than every framework whose model package has its architecture module; None:
            all of those.
        frameworks_why: Why only those (the refusal's message says it).
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
    frameworks: tuple[str, ...] | None = None
    frameworks_why: str = ""

    def __post_init__(self):
        unknown = [f for f in self.frameworks or () if f not in FRAMEWORKS]
        if unknown:
            raise ValueError(
                f"model {self.name!r}: frameworks names {', '.join(unknown)}; allowed: "
                f"{', '.join(FRAMEWORKS)}"
            )
        if self.frameworks is not None and not self.frameworks_why:
            raise ValueError(f"model {self.name!r}: frameworks without frameworks_why")


#: What every ImageNet-shaped classifier consumes and produces.
_IMAGENET = dict(
    family="vision",
    input_shape=(3, 224, 224),
    input_dtype="float32",
    num_classes=1000,
    vocab_size=None,
)


def decoder_param_count(
    vocab_size: int, seq_len: int, d_model: int, num_layers: int, dim_feedforward: int, **_
) -> int:
    """Trainable parameters of dlscale's GPT-2-class decoder (dlscale.models.torch.gpt): token
    and position embeddings, per layer four d x d attention projections and the two FFN
    matrices with their biases and two LayerNorms, a final LayerNorm; the head is tied to the
    token embedding and adds none."""
    d, f = d_model, dim_feedforward
    per_layer = 4 * d * d + 4 * d + 2 * d * f + f + d + 2 * 2 * d
    return vocab_size * d + seq_len * d + num_layers * per_layer + 2 * d


def _decoder(name: str, description: str, vocab_size: int, seq_len: int, **arch) -> ModelSpec:
    return ModelSpec(
        name=name,
        family=DECODER,
        input_shape=(seq_len,),
        input_dtype="int64",
        num_classes=vocab_size,
        vocab_size=vocab_size,
        description=description,
        param_count=decoder_param_count(vocab_size, seq_len, **arch),
        arch="gpt",
        arch_kwargs=arch,
    )


def llama_ffn_dim(d_model: int, multiple_of: int, ffn_dim_multiplier: float | None = None) -> int:
    """The SwiGLU width of a Llama (torchtitan's rule): int(2 x 4 d / 3), times
    ``ffn_dim_multiplier`` (truncated to an integer) where given, rounded up to a multiple of
    ``multiple_of``; Llama 3.1 8B: 4096 -> 10922 -> 14198 -> 14336."""
    hidden = int(2 * 4 * d_model / 3)
    if ffn_dim_multiplier is not None:
        hidden = int(ffn_dim_multiplier * hidden)
    return multiple_of * -(-hidden // multiple_of)


def llama_param_count(
    vocab_size: int,
    seq_len: int,
    d_model: int,
    num_layers: int,
    num_heads: int,
    num_kv_heads: int,
    multiple_of: int,
    ffn_dim_multiplier: float | None = None,
    tie_embeddings: bool = False,
    **_,
) -> int:
    """Trainable parameters of dlscale's Llama (dlscale.models.torch.llama): the token
    embedding, per layer wq and wo (d x d), wk and wv (d x KV heads x head dim), the SwiGLU's
    three d x f matrices and two RMSNorm weights, a final RMSNorm, and the output head (none
    where tied to the embedding). No biases; the sequence length adds none (RoPE is a buffer)."""
    d, f = d_model, llama_ffn_dim(d_model, multiple_of, ffn_dim_multiplier)
    kv = num_kv_heads * (d // num_heads)
    per_layer = 2 * d * d + 2 * d * kv + 3 * d * f + 2 * d
    head = 0 if tie_embeddings else vocab_size * d
    return vocab_size * d + num_layers * per_layer + d + head


#: Each decoder architecture's parameter count at a sequence length (spec_for).
_PARAM_COUNTS = {"gpt": decoder_param_count, "llama": llama_param_count}

#: Why the Llama family is refused outside the pytorch framework (ModelSpec.frameworks_why).
LLAMA_FRAMEWORKS_WHY = (
    "the Llama family trains as the field trains it, with the pytorch adapter's strategies "
    "(FSDP2, tensor parallel); Horovod's adapter, which builds the same PyTorch "
    "modules, runs ddp only"
)


def _llama(name: str, description: str, vocab_size: int, seq_len: int, **arch) -> ModelSpec:
    return ModelSpec(
        name=name,
        family=DECODER,
        input_shape=(seq_len,),
        input_dtype="int64",
        num_classes=vocab_size,
        vocab_size=vocab_size,
        description=description,
        param_count=llama_param_count(vocab_size, seq_len, **arch),
        arch="llama",
        arch_kwargs=arch,
        frameworks=("pytorch",),
        frameworks_why=LLAMA_FRAMEWORKS_WHY,
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
        # Decoder-only language models (GPT-2 class): seq_len is the default of config
        # `seq_len`; the parameter counts are checked against the built models in the tests.
        _decoder(
            "gpt2_tiny",
            "GPT-2-class decoder for CPU tests (2 layers, d_model 64, 2 heads, FFN 256, "
            "tied head), seq_len 32, vocab 4096",
            vocab_size=4096,
            seq_len=32,
            d_model=64,
            num_layers=2,
            num_heads=2,
            dim_feedforward=256,
        ),
        _decoder(
            "gpt2_124m",
            "GPT-2 small (Radford et al. 2019; 12 layers, d_model 768, 12 heads, FFN 3072, "
            "tied head), seq_len 1024, vocab 50304 (GPT-2's 50257 padded to a multiple of 64)",
            vocab_size=50304,
            seq_len=1024,
            d_model=768,
            num_layers=12,
            num_heads=12,
            dim_feedforward=3072,
        ),
        _decoder(
            "gpt2_350m",
            "GPT-2 medium (Radford et al. 2019; 24 layers, d_model 1024, 16 heads, FFN 4096, "
            "tied head), seq_len 1024, vocab 50304 (GPT-2's 50257 padded to a multiple of 64)",
            vocab_size=50304,
            seq_len=1024,
            d_model=1024,
            num_layers=24,
            num_heads=16,
            dim_feedforward=4096,
        ),
        # Llama 3 (RMSNorm, SwiGLU, RoPE theta 500,000, grouped-query attention; torchtitan's
        # torchtitan/models/llama3 shapes and init). seq_len is the default of config `seq_len`
        # (8,192: torchtitan's Llama 3 benchmarks); it changes no parameter count.
        _llama(
            "llama3_debug",
            "Llama-3-class decoder for CPU tests (2 layers, d_model 64, 4 heads, 2 KV heads, "
            "SwiGLU 192, untied head), seq_len 64, vocab 2048",
            vocab_size=2048,
            seq_len=64,
            d_model=64,
            num_layers=2,
            num_heads=4,
            num_kv_heads=2,
            multiple_of=32,
            rope_theta=500_000.0,
        ),
        # Llama 3.2 1B ties its output head to the token embedding (as torchtitan's llama3 1b,
        # enable_weight_tying): kept, so the count is the published 1.24 B (1,235,814,400; an
        # untied head would add 128256 x 2048 = 262,668,288). RoPE scaled as its
        # config.json (factor 32).
        _llama(
            "llama3_1b",
            "Llama 3.2 1B (16 layers, d_model 2048, 32 heads, 8 KV heads, SwiGLU 8192, head "
            "tied to the embedding as released), seq_len 8192, vocab 128256",
            vocab_size=128256,
            seq_len=8192,
            d_model=2048,
            num_layers=16,
            num_heads=32,
            num_kv_heads=8,
            multiple_of=1024,
            ffn_dim_multiplier=1.5,
            rope_theta=500_000.0,
            rope_scaling_factor=32.0,
            tie_embeddings=True,
        ),
        # Llama 3.1 8B: 8,030,261,248 parameters; 57.9 GFLOP per token at seq_len 8192 in
        # torchtitan's count (dlscale.models.flops.decoder_flops_per_token).
        _llama(
            "llama3_8b",
            "Llama 3.1 8B (32 layers, d_model 4096, 32 heads, 8 KV heads, SwiGLU 14336, "
            "untied head), seq_len 8192, vocab 128256",
            vocab_size=128256,
            seq_len=8192,
            d_model=4096,
            num_layers=32,
            num_heads=32,
            num_kv_heads=8,
            multiple_of=1024,
            ffn_dim_multiplier=1.3,
            rope_theta=500_000.0,
            rope_scaling_factor=8.0,
        ),
    )
}


def names() -> list[str]:
    """Return the registered model names in registry order."""
    return list(SPECS)


#: The models a study defines in its `models:` section (dlscale.models.zoo.register: from the
#: transformers library or a package's `dlscale.models` entry point), by their name in the
#: study, in this process: the registry's names stay SPECS' alone (names()).
STUDY_SPECS: dict[str, ModelSpec] = {}


def get_spec(name: str) -> ModelSpec:
    """Return the spec registered under ``name`` (a study's own model too: STUDY_SPECS).

    Raises:
        KeyError: ``name`` is not registered; the message lists the allowed names.
    """
    try:
        return SPECS[name]
    except KeyError:
        if name in STUDY_SPECS:
            return STUDY_SPECS[name]
        raise KeyError(f"unknown model {name!r}; allowed: {', '.join(names())}") from None


def spec_for(name: str, seq_len: int | None = None) -> ModelSpec:
    """The spec of model ``name`` at sequence length ``seq_len`` (a cell's ``seq_len``; None:
    the registry's). Only a decoder takes a sequence length: its input shape and its position
    table (and so its parameter count) follow it.

    Raises:
        KeyError: ``name`` is unknown.
        ValueError: a sequence length for a model that is not a decoder, or one below 1.
    """
    spec = get_spec(name)
    if seq_len is None or (seq_len == spec.input_shape[0] and spec.family == DECODER):
        return spec
    if name in STUDY_SPECS and spec.family == DECODER and isinstance(seq_len, int) and seq_len > 0:
        # a study's decoder: its parameters do not follow the sequence (its checks did)
        return dataclasses.replace(spec, input_shape=(seq_len,))
    if spec.family != DECODER:
        decoders = ", ".join(n for n, s in SPECS.items() if s.family == DECODER)
        raise ValueError(
            f"seq_len {seq_len}: model {name!r} ({spec.family}) takes no sequence length; "
            f"only decoder models do: {decoders}"
        )
    if not isinstance(seq_len, int) or seq_len < 1:
        raise ValueError(f"seq_len {seq_len!r}: must be an integer >= 1")
    return dataclasses.replace(
        spec,
        input_shape=(seq_len,),
        param_count=_PARAM_COUNTS[spec.arch](spec.vocab_size, seq_len, **spec.arch_kwargs),
    )


def seq_len_of(spec: ModelSpec) -> int | None:
    """Tokens per sample of a model that reads token sequences (decoder and sequence models),
    None for vision models."""
    return spec.input_shape[0] if spec.family in (DECODER, "sequence") else None


def cell_seq_len(name: str, seq_len: int | None) -> int | None:
    """A cell's ``seq_len`` (dlscale.study.cell.Cell): for a decoder the study's ``seq_len`` or,
    where
    that is null, the registry's; None for every other model (their cells keep their identity)."""
    spec = SPECS.get(name) or STUDY_SPECS.get(name)
    if spec is None or spec.family != DECODER:
        return None
    if name in STUDY_SPECS:  # its own sequence length (dlscale.models.zoo), else the study's
        return spec.input_shape[0]
    return seq_len if seq_len is not None else spec.input_shape[0]


def builds(framework: str, name: str) -> bool:
    """Whether ``framework`` has a builder for model ``name``: its model package (its record's
    ``model_package``, dlscale.registry.frameworks) has the spec's architecture module (looked
    up as a file: importing a framework package imports the framework), and the spec does not
    leave the framework out (ModelSpec.frameworks)."""
    record = FRAMEWORKS.get(framework)
    package = record.model_package if record else None
    spec = SPECS.get(name)
    if package is None or spec is None:
        return True  # unknown names are refused by the schema, with the allowed values
    if spec.frameworks is not None and framework not in spec.frameworks:
        return False
    return (Path(__file__).parent / package / f"{spec.arch}.py").is_file()


def supported(package: str) -> list[str]:
    """Registered names, in registry order, whose architecture module exists in the
    framework package ``package`` (e.g. ``"dlscale.models.tf"``); imports no such module."""
    return [n for n, s in SPECS.items() if importlib.util.find_spec(f"{package}.{s.arch}")]


def find_builder(
    package: str, framework: str, name: str, seq_len: int | None = None
) -> Callable[[], Any]:
    """The zero-argument builder of model ``name`` in the framework package ``package``:
    ``<package>.<spec.arch>.from_spec`` bound to the spec and its ``arch_kwargs``.

    Args:
        package: The framework package, e.g. ``"dlscale.models.torch"``.
        framework: Its human-readable name for messages, e.g. ``"PyTorch"``.
        name: A registered model name.
        seq_len: A decoder's sequence length (:func:`spec_for`); None: the registry's.

    Raises:
        KeyError: ``name`` is unknown (the message lists the registered names), or the
            framework has no builder for it (the message names the framework, the missing
            module or function, and the names the framework does support).
    """
    spec = spec_for(name, seq_len)
    # a study's own model: its arch is zoo.<name> (dlscale.models.zoo), built by <package>.zoo
    module_name = f"{package}.{spec.arch.split('.')[0]}"
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

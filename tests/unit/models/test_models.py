"""Tests for the framework-neutral model registry and its PyTorch builders."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import dlscale.models as models
import dlscale.models.torch as torch_models
from dlscale.models import ModelSpec, get_spec, names
from dlscale.models.torch import build, example_batch
from dlscale.registry.frameworks import FRAMEWORKS


def _num_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


# Models small enough to build and train on a CPU in a test (the GPU-sized decoders are built
# on the meta device only).
GPU_SIZED = ("gpt2_124m", "gpt2_350m", "llama3_1b", "llama3_8b")
CPU_NAMES = [n for n in names() if n not in GPU_SIZED]


def test_registry_names_and_order() -> None:
    assert names() == [
        "resnet50",
        "resnet18",
        "cnn_small",
        "transformer_small",
        "resnet34",
        "gpt2_tiny",
        "gpt2_124m",
        "gpt2_350m",
        "llama3_debug",
        "llama3_1b",
        "llama3_8b",
    ]


def test_every_model_has_a_builder_by_convention() -> None:
    """Each spec's ``arch`` names a module of every framework package defining ``from_spec``;
    PyTorch (and Horovod, which uses the PyTorch models) supports every registered model. The
    decoders are built by PyTorch only, and models.builds says so for every framework; the
    Llama family by the pytorch framework alone (its spec's ``frameworks``)."""
    assert torch_models.names() == names()
    for name in names():
        spec = get_spec(name)
        assert spec.arch.isidentifier() and spec.param_count > 0
        for package in ("torch", "tf", "mxnet"):
            path = Path(models.__file__).parent / package / f"{spec.arch}.py"
            if spec.family == models.DECODER and package != "torch":
                assert not path.exists(), path
                continue
            assert "\ndef from_spec(" in path.read_text(), path  # TF/MXNet are not importable here
        for framework, package in {f.name: f.model_package for f in FRAMEWORKS.values()}.items():
            expected = package == "torch" or spec.family != models.DECODER
            if spec.arch == "llama":
                expected = framework == "pytorch"
                assert spec.frameworks == ("pytorch",) and "Horovod" in spec.frameworks_why
            assert models.builds(framework, name) == expected


def test_missing_builder_names_the_framework(monkeypatch) -> None:
    spec = ModelSpec(
        name="fake",
        family="vision",
        input_shape=(3, 8, 8),
        input_dtype="float32",
        num_classes=2,
        vocab_size=None,
        description="no builder anywhere",
        param_count=1,
        arch="no_such_arch",
    )
    monkeypatch.setitem(models.SPECS, "fake", spec)
    with pytest.raises(KeyError) as excinfo:
        build("fake")
    message = excinfo.value.args[0]
    assert "'fake' has no PyTorch builder" in message
    assert "dlscale.models.torch.no_such_arch.from_spec" in message
    assert message.endswith("allowed: " + ", ".join(n for n in names() if n != "fake"))


@pytest.mark.parametrize("name", names())
def test_spec_is_consistent(name: str) -> None:
    spec = get_spec(name)
    assert spec.name == name
    assert spec.num_classes > 1
    assert spec.description and "\n" not in spec.description
    if spec.family == "vision":
        assert len(spec.input_shape) == 3
        assert spec.input_dtype == "float32"
        assert spec.vocab_size is None
    elif spec.family == models.DECODER:  # one next-token label per position
        assert len(spec.input_shape) == 1 and spec.input_dtype == "int64"
        assert spec.num_classes == spec.vocab_size
    else:
        assert spec.family == "sequence"
        assert len(spec.input_shape) == 1
        assert spec.input_dtype == "int64"
        assert spec.vocab_size is not None and spec.vocab_size > 0


def test_unknown_name_lists_allowed() -> None:
    for lookup in (get_spec, build):
        with pytest.raises(KeyError) as excinfo:
            lookup("resnet51")
        message = excinfo.value.args[0]
        assert "resnet51" in message
        for allowed in names():
            assert allowed in message


def test_spec_module_does_not_import_torch() -> None:
    # Locate the directory holding the dlscale package, whether installed or on PYTHONPATH.
    package_root = Path(models.__file__).resolve().parents[2]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(package_root), env.get("PYTHONPATH")]))
    subprocess.run(
        [sys.executable, "-c", "import dlscale.models, sys; assert 'torch' not in sys.modules"],
        check=True,
        env=env,
    )


@pytest.mark.parametrize("name", names())
def test_parameter_count(name: str) -> None:
    with torch.device("meta" if name in GPU_SIZED else "cpu"):
        model = build(name)
    assert _num_params(model) == get_spec(name).param_count


def test_published_gpt2_parameter_counts() -> None:
    """GPT-2 small and medium with the vocabulary padded to 50304 (nanoGPT's choice): the
    published 124,439,808 and 354,823,168 (vocabulary 50257) plus 47 x d_model."""
    assert get_spec("gpt2_124m").param_count == 124_439_808 + 47 * 768 == 124_475_904
    assert get_spec("gpt2_350m").param_count == 354_823_168 + 47 * 1024 == 354_871_296


def test_resnet50_is_v1_5() -> None:
    """ResNet-50 v1.5 downsamples on the bottleneck's 3x3 conv, not on the first 1x1."""
    block = build("resnet50").layer2[0]
    assert block.conv1.stride == (1, 1)
    assert block.conv2.stride == (2, 2)


@pytest.mark.parametrize("name", CPU_NAMES)
def test_example_batch(name: str) -> None:
    spec = get_spec(name)
    torch.manual_seed(0)
    inputs, labels = example_batch(spec, 4)
    assert tuple(inputs.shape) == (4, *spec.input_shape)
    assert inputs.dtype == getattr(torch, spec.input_dtype)
    rows = 4 * spec.input_shape[0] if spec.family == models.DECODER else 4
    assert labels.shape == (rows,) and labels.dtype == torch.int64
    if spec.family == models.DECODER:  # the labels are the next tokens
        assert torch.equal(labels.view(4, -1)[:, :-1], inputs[:, 1:])
    assert 0 <= labels.min() and labels.max() < spec.num_classes
    if spec.family == "sequence":
        assert 0 <= inputs.min() and inputs.max() < spec.vocab_size


@pytest.mark.parametrize("name", CPU_NAMES)
def test_forward_backward(name: str) -> None:
    """Forward+backward at batch 2 (ResNet-50 at 224x224 takes a few seconds on CPU)."""
    spec = get_spec(name)
    torch.manual_seed(0)
    model = build(name).train()
    inputs, labels = example_batch(spec, 2)
    logits = model(inputs)
    assert logits.shape == (len(labels), spec.num_classes)
    torch.nn.functional.cross_entropy(logits, labels).backward()
    for pname, param in model.named_parameters():
        assert param.grad is not None, pname
        assert torch.isfinite(param.grad).all(), pname


@pytest.mark.parametrize("name", CPU_NAMES)
def test_channels_last_and_bf16_autocast(name: str) -> None:
    spec = get_spec(name)
    torch.manual_seed(0)
    model = build(name).train()
    inputs, labels = example_batch(spec, 2)
    if spec.family == "vision":
        model = model.to(memory_format=torch.channels_last)
        inputs = inputs.contiguous(memory_format=torch.channels_last)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(inputs)
    assert logits.shape == (len(labels), spec.num_classes)
    assert logits.dtype == torch.bfloat16
    loss = torch.nn.functional.cross_entropy(logits.float(), labels)
    loss.backward()
    assert torch.isfinite(loss)

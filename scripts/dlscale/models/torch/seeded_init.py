"""Initial weights that do not depend on where a model lives: each parameter drawn from its own
generator, seeded by the cell's seed and the parameter's name.

A model that has ``init_weights()`` (GPT-2's and Llama's decoders) is built on the meta device
(no memory, no random draws) and materialised on its device by :func:`materialize`: under
fsdp and hsdp after ``fully_shard``, so no rank ever holds the whole model on its device; under
every other strategy and on one device before the model is wrapped. Either way every parameter
gets the values a single process gets from the same seed, so the strategies' losses agree
step for step (tests/unit/frameworks/test_torch_parallel_ranks.py).

How a parameter's values are drawn (:func:`full_values`): a second, meta-device copy of the
model (its *twin*) gets one real, NaN-filled CPU tensor in place of that parameter, torch's
default CPU generator is seeded with :func:`parameter_seed` (the seed and the parameter's
fully qualified name, through SHA-256), and the twin's ``init_weights()`` runs: on meta
tensors an initialiser draws nothing, so the one real tensor gets exactly the first draws of
its own seed, whatever the order or the number of the other parameters. A value left NaN
means ``init_weights()`` did not set that parameter: refused, naming it. Buffers (a rotary
table) are computed the same way once, every buffer real and no parameter.

Identity: the decoders' initial values changed with this (each parameter from its own seed,
where one stream in construction order drew them before), on one device and under ddp too. What
a throughput cell measures (shapes, operations, time, memory) does not depend on the values, and
no convergence cell trains a decoder, so this alone gives no cell a new identity; the decoder
cells that now train with AdamW have one anyway (dlscale.registry.optimizers).

The contract for a model (the decoders follow it): ``init_weights()`` with no arguments sets
every parameter and buffer, drawing random numbers only from torch's default generator.

Cost: every rank computes each parameter's full tensor on the host, one at a time, and keeps
its shard (``distribute_tensor(..., src_data_rank=None)``: no communication). Host memory: the
largest parameter (Llama 3 8B's 128,256 x 4,096 embedding: 2.1 GB in float32, per rank on the
node at once); time: drawing every parameter once per rank (about 8 x 10^9 normal draws for
8B). That is fine for the CPU test models and the 1B shape; for 8B on 8 GPUs of a node it
costs ~17 GB of host memory and tens of seconds at start-up, outside every measurement (setup).
The random DTensor operations that would draw only the local shard
(torch.distributed.tensor._random's offset-based generator) are not used: they do not
reproduce a single process's values, and the loss-match test needs exactly those.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator

import torch
from torch import nn

# The integer buffers' placeholder while their values are computed (no NaN for integers).
_INT_SENTINEL = -(2**31) + 7


def has_init_weights(model: nn.Module) -> bool:
    """Whether the model initialises itself by ``init_weights()`` (the meta-device path)."""
    return callable(getattr(model, "init_weights", None))


def builds_with_init_weights(name: str) -> bool:
    """Whether registered model `name` is initialised by ``init_weights()``: read from its
    builder's return annotation (``from_spec(...) -> GPT``) without building it, else from a
    meta-device build. (Building on the meta device imports torch._dynamo, seconds, through
    the meta initialisers: the models without init_weights() never pay for it.)"""
    import typing

    from dlscale.models.torch import find_builder

    builder = find_builder("dlscale.models.torch", "PyTorch", name)
    try:
        cls = typing.get_type_hints(builder.func).get("return")
    except Exception:  # noqa: BLE001 - an annotation that does not resolve: build and look
        cls = None
    if isinstance(cls, type) and issubclass(cls, nn.Module):
        return callable(getattr(cls, "init_weights", None))
    with torch.device("meta"):
        return has_init_weights(builder())


def parameter_seed(seed: int, name: str) -> int:
    """The seed of one parameter's generator: SHA-256 of the cell's seed and the parameter's
    fully qualified name, as a non-negative 63-bit integer (stable across runs and Python
    versions, unlike hash())."""
    digest = hashlib.sha256(f"{int(seed)}/{name}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2**63 - 1)


def _owners(model: nn.Module, tensor: torch.Tensor, kind: str) -> list[tuple[nn.Module, str]]:
    """Every (module, attribute) under which `tensor` is registered (a tied parameter has
    several)."""
    return [
        (module, attr)
        for module in model.modules()
        for attr, t in getattr(module, kind).items()
        if t is tensor
    ]


def _placeholder(like: torch.Tensor) -> torch.Tensor:
    """A host tensor of `like`'s shape and dtype that no initialiser leaves as it is."""
    if like.dtype.is_floating_point or like.dtype.is_complex:
        return torch.full(like.shape, float("nan"), dtype=like.dtype)
    return torch.full(like.shape, _INT_SENTINEL, dtype=like.dtype)


def _unset(value: torch.Tensor) -> bool:
    if value.dtype.is_floating_point or value.dtype.is_complex:
        return bool(torch.isnan(value).any())
    return value.numel() > 0 and bool((value == _INT_SENTINEL).all())


def _init(twin: nn.Module, seed: int | None) -> None:
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        if seed is not None:
            torch.manual_seed(seed)
        twin.init_weights()


def full_values(twin: nn.Module, seed: int) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, its full host tensor) for each parameter of the meta-device model `twin`, one at a
    time (named_parameters' order and names: a tied parameter once), drawn from its own
    generator (parameter_seed). The twin is left as it was."""
    if not has_init_weights(twin):
        raise TypeError(f"{type(twin).__name__} has no init_weights(): no seeded initialisation")
    for name, param in list(twin.named_parameters()):
        value = _placeholder(param)
        owners = _owners(twin, param, "_parameters")
        real = nn.Parameter(value, requires_grad=param.requires_grad)
        for module, attr in owners:
            module._parameters[attr] = real
        try:
            _init(twin, parameter_seed(seed, name))
        finally:
            for module, attr in owners:
                module._parameters[attr] = param
        if _unset(value):
            raise ValueError(
                f"{type(twin).__name__}.init_weights() left parameter {name} (partly) unset: "
                "a model initialised on the meta device must set every parameter there"
            )
        yield name, value


def buffer_values(twin: nn.Module) -> dict[str, torch.Tensor]:
    """Every buffer of the meta-device model `twin` as init_weights() computes it on the host
    (its parameters stay on meta). The twin is left as it was."""
    saved = {}
    for module in twin.modules():
        for attr, buf in list(module._buffers.items()):
            if buf is not None:
                saved[module, attr] = buf
                module._buffers[attr] = _placeholder(buf)
    if not saved:
        return {}
    try:
        _init(twin, None)  # buffers are computed, not drawn
        values = {name: buf for name, buf in twin.named_buffers()}
    finally:
        for (module, attr), buf in saved.items():
            module._buffers[attr] = buf
    unset = [name for name, value in values.items() if _unset(value)]
    if unset:
        raise ValueError(
            f"{type(twin).__name__}.init_weights() left buffer(s) {', '.join(unset)} unset: a "
            "model initialised on the meta device must compute its buffers there"
        )
    return values


def _copy_into(target: torch.Tensor, full: torch.Tensor) -> None:
    """Copy `full` (a whole parameter, on the host) into `target`: a plain tensor whole, a
    DTensor's local shard as its placements cut it (no communication: every rank has `full`)."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    if isinstance(target, DTensor):
        shard = distribute_tensor(
            full, target.device_mesh, target.placements, src_data_rank=None
        ).to_local()
        target.to_local().copy_(shard)
    else:
        target.copy_(full)


def seeded_init(model: nn.Module, twin: nn.Module, seed: int) -> None:
    """Set the parameters (a DTensor's local shard) and buffers of a model that has storage to
    the seeded values (full_values, buffer_values); `twin` is a meta-device build of the same
    model, used to draw them."""
    with torch.no_grad():
        params = dict(model.named_parameters())
        for name, full in full_values(twin, seed):
            _copy_into(params[name], full)
        buffers = dict(model.named_buffers())
        for name, value in buffer_values(twin).items():
            buffers[name].copy_(value)


def _tied(model: nn.Module) -> list[list[tuple[nn.Module, str]]]:
    """The parameters registered under more than one (module, attribute): GPT-2's head and
    token embedding."""
    where: dict[int, list[tuple[nn.Module, str]]] = {}
    for module in model.modules():
        for attr, p in module._parameters.items():
            if p is not None:
                where.setdefault(id(p), []).append((module, attr))
    return [places for places in where.values() if len(places) > 1]


def materialize(model: nn.Module, twin: nn.Module, device: torch.device, seed: int) -> None:
    """Give the meta-device `model` (plain, or wrapped by fully_shard: its shards only)
    storage on `device`, then the seeded initial values (seeded_init). A tied parameter stays
    one: to_empty gives a plain module's meta parameters new Parameter objects, one per place
    it is registered (fully_shard's DTensor parameters keep theirs), so the ties are restored."""
    ties = _tied(model)
    model.to_empty(device=device)
    for places in ties:
        (first_module, first_attr), *rest = places
        shared = first_module._parameters[first_attr]
        for module, attr in rest:
            if module._parameters[attr] is not shared:
                module._parameters[attr] = shared
    seeded_init(model, twin, seed)

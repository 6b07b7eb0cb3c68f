"""Framework adapters, found by name. Each adapter module is imported only by the rank that
uses it, so a framework's environment never needs the other frameworks installed."""

from __future__ import annotations

import importlib

# name -> module path; every module defines `Adapter`, a subclass of base.Adapter.
ADAPTERS = {
    "pytorch": "dlscale.frameworks.pytorch",
    "tensorflow": "dlscale.frameworks.tensorflow",
    "keras": "dlscale.frameworks.keras",
    "horovod": "dlscale.frameworks.horovod",
    "mxnet": "dlscale.frameworks.mxnet",
}

# name -> the venv (.venvs/<name>, built from envs/<name>.txt by scripts/setup.sh) its ranks run
# in; None: the driver environment (.venv), which carries PyTorch.
ENVIRONMENTS = {
    "pytorch": None,
    "tensorflow": "tensorflow",
    "keras": "tensorflow",
    "horovod": "horovod",
    "mxnet": "mxnet",
}

# The environment variants a hardware entry can ask for (hardware.yaml `environment_variant`):
# `cpu` (the environments above) or `cuda` (each framework's CUDA build, .venvs/<env>-cuda from
# envs/<env>-cuda.txt; scripts/setup.sh <env>-cuda builds it on a GPU site).
VARIANTS = ("cpu", "cuda")


def environment_name(framework: str, variant: str = "cpu") -> str | None:
    """The venv a framework's ranks run in for an environment variant: None for the driver
    environment (.venv: PyTorch's CPU build), else the name under .venvs/."""
    env = ENVIRONMENTS[framework]
    if variant == "cpu":
        return env
    return f"{env or 'pytorch'}-{variant}"


# What each framework's CUDA build can drive, where it cannot drive every GPU: the highest
# compute capability it was built for, and why. Cells beyond it are refused before any job.
CUDA_LIMITS = {
    "mxnet": (
        8.6,
        "MXNet 1.9.1 (the last release) has CUDA builds for CUDA 11.2 and 11.7 only "
        "(mxnet-cu112, mxnet-cu117); CUDA 11.7 cannot build for compute capability 9.0 "
        "(Hopper) or newer",
    ),
}

# name -> the workloads (dlscale.cell.WORKLOADS) its adapter runs: the adapter's declared
# capability (base.Adapter.convergence_method), stated here as well so that the workflow refuses
# a study before any job without importing a framework (tests/unit/test_convergence.py checks
# that both agree).
WORKLOADS = {
    "pytorch": ("throughput", "convergence"),
    "tensorflow": ("throughput", "convergence"),
    "keras": ("throughput", "convergence"),
    "horovod": ("throughput", "convergence"),
    "mxnet": ("throughput", "convergence"),
}


# name -> the parallelisms (dlscale.cell.PARALLELISMS) its adapter runs, stated here so the
# workflow refuses any other combination before any job without importing a framework
# (base.Adapter.strategies declares the same; tests/unit/test_parallelism.py checks both agree).
STRATEGIES = {
    "pytorch": ("ddp", "fsdp", "hsdp", "tp", "fsdp+tp", "pp"),
    "tensorflow": ("ddp",),
    "keras": ("ddp",),
    "horovod": ("ddp",),
    "mxnet": ("ddp",),
}


def supporting(workload: str) -> list[str]:
    """The frameworks whose adapters run `workload`."""
    return [name for name, workloads in WORKLOADS.items() if workload in workloads]


def names() -> list[str]:
    return list(ADAPTERS)


def get_adapter(name: str):
    try:
        module = ADAPTERS[name]
    except KeyError:
        raise KeyError(
            f"unknown framework {name!r}; allowed values: {', '.join(ADAPTERS)}"
        ) from None
    return importlib.import_module(module).Adapter

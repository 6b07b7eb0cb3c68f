"""Framework adapters, found by name: one registry record per framework (`FRAMEWORKS`).

Each record says, without importing the framework, what the workflow checks before any job: the
adapter module, the environment its ranks run in, the workloads and parallelisms its adapter
runs, and the highest CUDA compute capability its CUDA build can drive. Each adapter module is
imported only by the rank that uses it, so a framework's environment never needs the other
frameworks installed. Adding a framework: docs/pages/extending.md.

Beside the adapter modules (named after their frameworks): `base` (the adapter contract and
kit), `timing` (run_timed, the one timing loop, and its probes), `torch_model` (what the pytorch
and horovod adapters share) and `torch_parallel` (PyTorch's strategies beyond ddp).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

# The environment variants a hardware entry can ask for (hardware.yaml `environment_variant`):
# `cpu` (each framework's CPU environment) or `cuda` (its CUDA build, .venvs/<env>-cuda from
# envs/<env>-cuda.txt; scripts/setup.sh <env>-cuda builds it on a GPU site).
VARIANTS = ("cpu", "cuda")


@dataclass(frozen=True)
class Framework:
    """One framework as the workflow knows it before any job.

    - adapter: the module defining `Adapter` (a subclass of dlscale.frameworks.base.Adapter);
    - environment: the venv its ranks run in (.venvs/<environment>, built from
      envs/<environment>.txt by scripts/setup.sh); None: the driver environment (.venv), which
      carries PyTorch;
    - workloads: the workloads (dlscale.study.cell.WORKLOADS) its adapter runs; the adapter
      declares the same (base.Adapter.convergence_method; tests/unit/test_convergence.py checks
      both agree);
    - strategies: the parallelisms (dlscale.study.cell.PARALLELISMS) its adapter runs; the
      adapter declares the same (base.Adapter.strategies; tests/unit/test_parallelism.py);
    - cuda_limit: (highest compute capability, why) where its CUDA build cannot drive every GPU;
      cells beyond it are refused before any job (dlscale.workflow.capability).
    """

    name: str
    adapter: str
    environment: str | None
    workloads: tuple[str, ...] = ("throughput", "convergence")
    strategies: tuple[str, ...] = ("ddp",)
    cuda_limit: tuple[float, str] | None = None


FRAMEWORKS = {
    f.name: f
    for f in (
        Framework(
            "pytorch",
            "dlscale.frameworks.pytorch",
            environment=None,
            strategies=("ddp", "fsdp", "hsdp", "tp", "fsdp+tp", "pp"),
        ),
        Framework("tensorflow", "dlscale.frameworks.tensorflow", environment="tensorflow"),
        Framework("keras", "dlscale.frameworks.keras", environment="tensorflow"),
        Framework("horovod", "dlscale.frameworks.horovod", environment="horovod"),
        Framework(
            "mxnet",
            "dlscale.frameworks.mxnet",
            environment="mxnet",
            cuda_limit=(
                8.6,
                "MXNet 1.9.1 (the last release) has CUDA builds for CUDA 11.2 and 11.7 only "
                "(mxnet-cu112, mxnet-cu117); CUDA 11.7 cannot build for compute capability 9.0 "
                "(Hopper) or newer",
            ),
        ),
    )
}


def get(name: str) -> Framework:
    """The registry record of `name`; an unknown name is refused with the allowed values."""
    try:
        return FRAMEWORKS[name]
    except KeyError:
        raise KeyError(
            f"unknown framework {name!r}; allowed values: {', '.join(FRAMEWORKS)}"
        ) from None


def names() -> list[str]:
    return list(FRAMEWORKS)


def supporting(workload: str) -> list[str]:
    """The frameworks whose adapters run `workload`."""
    return [f.name for f in FRAMEWORKS.values() if workload in f.workloads]


def environment_name(framework: str, variant: str = "cpu") -> str | None:
    """The venv a framework's ranks run in for an environment variant: None for the driver
    environment (.venv: PyTorch's CPU build), else the name under .venvs/."""
    env = get(framework).environment
    if variant == "cpu":
        return env
    return f"{env or 'pytorch'}-{variant}"


def get_adapter(name: str):
    return importlib.import_module(get(name).adapter).Adapter

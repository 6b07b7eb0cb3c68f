"""What a framework is: one `Framework` record each, everything the project asks about it.

The rest of the project reads these records and restates none of their facts: the schema's
framework enum, the matrix (environments, strategies, workloads), the models (which model
package builds a framework's models), the capability check (its CUDA probe and limit), the
report (the host synchronisations inside its step, how its weights and data order are set),
the benchmarks, scripts/setup.sh's list of environments (`python -m dlscale.registry`) and the
tests' parametrisations. A record missing a fact fails at import, naming the record and the fact.

Adding a framework: docs/pages/extending.md ("A framework").
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from dlscale.registry import cuda_probes
from dlscale.registry.cuda_drivers import fitting_lines, table
from dlscale.registry.optimizers import DEFAULT_OPTIMIZER, OPTIMIZERS
from dlscale.registry.strategies import DEFAULT_STRATEGY, STRATEGIES, RegistryError

# The environment variants a hardware entry can ask for (hardware.yaml `environment_variant`):
# `cpu` (each framework's CPU environment) or `cuda` (its CUDA build, .venvs/<env>-cuda from
# envs/<env>-cuda.txt; scripts/setup.sh <env>-cuda builds it on a GPU site).
VARIANTS = ("cpu", "cuda")
# The workloads a framework's adapter may run (dlscale.study.cell.WORKLOADS reads this).
WORKLOADS = ("throughput", "convergence")
# What only some adapters run (a framework record's `capabilities`), and what each one is.
CAPABILITIES = {
    "llm_step": "the LLM step's keys: attention, compile_loss, single_device",
    "float8": "the precision float8 (torchao's float8 linears, in an environment beside the "
    "framework's: dlscale.study.matrix.float8_environment)",
    "activation_checkpointing": "activation_checkpointing other than none (checkpointed blocks)",
    "block_compile": "mode compiled compiles each block a model names (torchtitan's per-block "
    "compile) rather than the whole model",
}
DEFAULT_WORKLOAD = "throughput"
# The driver's own environment (.venv), which carries PyTorch's CPU build.
DRIVER_ENVIRONMENT = "pytorch"
ENVS_DIR = Path(__file__).resolve().parents[3] / "envs"


@dataclass(frozen=True)
class Framework:
    """One framework as the project knows it before any job.

    - adapter: the module defining `Adapter` (a subclass of dlscale.frameworks.base.Adapter);
      imported only by the rank that uses it;
    - environment: the venv its ranks run in on CPUs (.venvs/<environment>, built from
      envs/<environment>.txt by scripts/setup.sh); None: the driver environment (.venv);
      its CUDA variant is `<environment or pytorch>-cuda` (envs/<that>.txt);
    - model_package: the package under dlscale.models its models are built from (torch, tf,
      mxnet): a model exists for it where that package has the model's architecture module;
    - workloads: the workloads (WORKLOADS) its adapter runs; the adapter declares the same
      (base.Adapter.convergence_method; tests check both agree);
    - strategies (read, not stated): the parallel strategies whose records name it
      (dlscale.registry.strategies, Strategy.frameworks); its adapter reads them from here
      (base.Adapter.strategies);
    - cuda_probe: reads an environment's files and says whether its build drives CUDA
      (dlscale.registry.cuda_probes; dlscale.workflow.capability runs it);
    - cuda_limit: (highest compute capability, why) where its CUDA build cannot drive every
      GPU; cells beyond it are refused before any job;
    - host_sync_per_step: where its step waits for the device or its collectives on the host
      inside the timed window, on GPUs (the report's "host synchronisations" paragraph);
      host_sync_per_step_cpu: the same where its cells ran on CPUs only (None: as on GPUs);
    - initialisation_and_data_order: how its ranks' weights and data order are set (the
      time-to-accuracy section states it per framework);
    - ptx_only_from: (compute capability, why) from which its CUDA build carries no machine
      code, only PTX the driver compiles at start: the driver must then support the build's
      CUDA version in full (dlscale.registry.cuda_drivers.driver_jits), not only its major;
    - cuda_lines: the CUDA lines its CUDA environment comes in (PyTorch's cu130, cu128, ...;
      dlscale.registry.cuda_drivers), the first being `<env>-cuda`'s, each other one an
      environment of its own, `<env>-<line>` (envs/<env>-<line>.txt); a hardware entry that
      states its driver gets the newest line that driver runs (`environment_for`);
    - imports: the modules that are the framework itself (torch, tensorflow, ...), which the
      preflight imports on a compute node before any cell runs (dlscale.run.preflight_job);
    - optimizers: the optimizers its adapter builds (dlscale.registry.optimizers); a cell with
      another is refused before any job, and by the adapter when it is made;
    - env_prefixes: the prefixes of the environment variables the framework itself reads
      (TF_, HOROVOD_, ...): every rank records them (dlscale.rank.provenance) and the report's
      Systems table shows them, beside the system's own (SLURM_, NCCL_, OMP_, ...);
    - comm_env: those of them that decide how its ranks find each other and which network they
      use: a failed cell's diagnosis shows them (dlscale.run.diagnosis);
    - reserved_env: (variable or prefix, why) its adapter sets for every rank, which a hardware
      entry's `env:` may therefore not set (dlscale.study.env_names);
    - capabilities: what only some adapters run (CAPABILITIES: the LLM step's keys, float8,
      activation checkpointing, the per-block compile); a study asking another framework for
      one is refused before any job (dlscale.study.matrix_checks).
    """

    name: str
    adapter: str
    environment: str | None
    model_package: str
    cuda_probe: Callable[[Path], tuple[bool, str]]
    host_sync_per_step: str
    initialisation_and_data_order: str
    host_sync_per_step_cpu: str | None = None
    workloads: tuple[str, ...] = WORKLOADS
    cuda_limit: tuple[float, str] | None = None
    ptx_only_from: tuple[float, str] | None = None
    cuda_lines: tuple[str, ...] = ()
    imports: tuple[str, ...] = ()
    optimizers: tuple[str, ...] = (DEFAULT_OPTIMIZER,)
    env_prefixes: tuple[str, ...] = ()
    comm_env: tuple[str, ...] = ()
    reserved_env: tuple[tuple[str, str], ...] = ()
    capabilities: tuple[str, ...] = ()

    def __post_init__(self):
        where = f"framework record {self.name!r} (dlscale.registry.frameworks)"
        required = ("name", "adapter", "model_package", "cuda_probe", "host_sync_per_step")
        for f in (*required, "initialisation_and_data_order", "workloads", "imports"):
            if not getattr(self, f):
                raise RegistryError(f"{where}: fact {f!r} is missing")
        bad = [w for w in self.workloads if w not in WORKLOADS]
        if bad:
            raise RegistryError(
                f"{where}: fact 'workloads' names {', '.join(bad)}; allowed: {', '.join(WORKLOADS)}"
            )
        bad = [o for o in self.optimizers if o not in OPTIMIZERS]
        if bad or DEFAULT_OPTIMIZER not in self.optimizers:
            raise RegistryError(
                f"{where}: fact 'optimizers' is {', '.join(self.optimizers)}; allowed: "
                f"{', '.join(OPTIMIZERS)}, {DEFAULT_OPTIMIZER} among them"
            )
        bad = [c for c in self.capabilities if c not in CAPABILITIES]
        if bad:
            raise RegistryError(
                f"{where}: fact 'capabilities' names {', '.join(bad)}; allowed: "
                f"{', '.join(CAPABILITIES)}"
            )
        bad = [p for p in self.comm_env if not p.startswith(self.env_prefixes)]
        if bad:
            raise RegistryError(
                f"{where}: fact 'comm_env' names {', '.join(bad)}, under none of its env_prefixes"
            )
        unknown = [line for line in self.cuda_lines if line not in table()["pytorch_lines"]]
        if unknown:
            raise RegistryError(
                f"{where}: fact 'cuda_lines' names {', '.join(unknown)}; allowed: "
                f"{', '.join(table()['pytorch_lines'])} (dlscale/registry/cuda_drivers.json)"
            )
        named = [
            ("environment", f"the {v} environment", self.environment_name(v) or DRIVER_ENVIRONMENT)
            for v in VARIANTS
        ] + [("cuda_lines", "the environment", env) for env in self.line_environments()]
        for fact, what, env in named:
            if ENVS_DIR.is_dir() and not (ENVS_DIR / f"{env}.txt").is_file():
                raise RegistryError(
                    f"{where}: fact {fact!r} gives {what} {env!r}, and envs/{env}.txt does not "
                    "exist"
                )

    @property
    def strategies(self) -> tuple[str, ...]:
        """The strategies whose records say this framework runs them, in record order."""
        return tuple(
            s.name for s in STRATEGIES.values() if s.frameworks is None or self.name in s.frameworks
        )

    def line_environments(self) -> list[str]:
        """The environments of its CUDA lines beyond the first (`<env>-<line>`)."""
        return [f"{self.environment or DRIVER_ENVIRONMENT}-{line}" for line in self.cuda_lines[1:]]

    def line_for(self, variant: str, entry: dict) -> str | None:
        """The CUDA line a hardware entry's cells use where it is not `<env>-cuda`'s: on the
        cuda variant of a framework with lines, the newest line the entry's stated driver runs
        (dlscale.registry.cuda_drivers.fitting_lines); None where the entry states no driver,
        where the first line fits, or where none does (the capability check refuses those)."""
        if variant != "cuda" or len(self.cuda_lines) < 2:
            return None
        if entry.get("nvidia_driver") is None and entry.get("max_cuda") is None:
            return None
        fit = [line for line in fitting_lines(entry) if line in self.cuda_lines]
        return fit[0] if fit and fit[0] != self.cuda_lines[0] else None

    def environment_for(self, variant: str, entry: dict) -> str | None:
        """The venv a hardware entry's cells run in: the variant's, or its CUDA line's."""
        line = self.line_for(variant, entry)
        if line is None:
            return self.environment_name(variant)
        return f"{self.environment or DRIVER_ENVIRONMENT}-{line}"

    def environment_name(self, variant: str = "cpu") -> str | None:
        """The venv its ranks run in for an environment variant: None for the driver
        environment (.venv: PyTorch's CPU build), else the name under .venvs/."""
        if variant not in VARIANTS:
            raise ValueError(f"unknown environment variant {variant!r}; allowed: {VARIANTS}")
        if variant == "cpu":
            return self.environment
        return f"{self.environment or DRIVER_ENVIRONMENT}-{variant}"


# TensorFlow's and Keras' one CUDA build (both run in the tensorflow environments)
TENSORFLOW_PTX_ONLY = (
    9.0,
    "TensorFlow's CUDA 12 wheels carry machine code up to compute capability 8.x; for 9.0 "
    "(Hopper) and newer their targets end at compute_90 PTX, which the driver compiles when "
    "each rank starts",
)

FRAMEWORKS = {
    f.name: f
    for f in (
        Framework(
            "pytorch",
            "dlscale.frameworks.pytorch",
            imports=("torch",),
            environment=None,
            model_package="torch",
            cuda_probe=cuda_probes.torch_cuda,
            cuda_lines=("cu130", "cu128", "cu126"),
            optimizers=("sgd", "adamw"),
            env_prefixes=("TORCH_", "PYTORCH_", "GLOO_"),
            comm_env=("GLOO_", "TORCH_NCCL_", "TORCH_DISTRIBUTED_"),
            capabilities=tuple(CAPABILITIES),
            host_sync_per_step=(
                "none inside the timed window: CUDA events around each step, one "
                "synchronisation after the window; DDP's runtime statistics (which synchronise "
                "on their sampled iterations) are sampled only before the window; fp16 uses the "
                "fused SGD, with which the gradient scaler does not read its inf check on the "
                "host; AdamW is the fused one (its step counters on the device) and the "
                "gradient clipping's norm stays a device tensor"
            ),
            host_sync_per_step_cpu=(
                "none beyond the step itself: on CPUs the step runs on the host (no device to "
                "wait for); DDP's runtime statistics are sampled only before the window; "
                "AdamW's foreach step reads its per-parameter step counters as Python numbers "
                "(Tensor.item on host values: nothing to wait for)"
            ),
            initialisation_and_data_order=(
                "weights from torch.manual_seed(seed + rank), rank 0's on every rank (DDP's "
                "broadcast at wrap; a model with init_weights(), the decoders: each parameter "
                "from its own generator, seeded by the seed and its name, the same on every "
                "rank and under every strategy); data in DistributedSampler's order: the whole "
                "training split reshuffled every epoch and dealt across the ranks"
            ),
        ),
        Framework(
            "tensorflow",
            "dlscale.frameworks.tensorflow",
            imports=("tensorflow",),
            environment="tensorflow",
            model_package="tf",
            cuda_probe=cuda_probes.tensorflow_cuda,
            ptx_only_from=TENSORFLOW_PTX_ONLY,
            env_prefixes=("TF_",),
            reserved_env=(("TF_CONFIG", "the TensorFlow adapter sets each rank's cluster"),),
            host_sync_per_step="one per step: the step fetches its loss to the host (.numpy())",
            initialisation_and_data_order=(
                "weights from Keras 3's initializers after keras.utils.set_random_seed(seed + "
                "rank), worker 0's on every worker (MultiWorkerMirroredStrategy); data by "
                "tf.data: each rank a fixed part of the split (positions rank, rank + world "
                "size, ...), reshuffled within the part every epoch"
            ),
        ),
        Framework(
            "keras",
            "dlscale.frameworks.keras",
            imports=("tensorflow", "tf_keras"),
            environment="tensorflow",
            model_package="tf",
            cuda_probe=cuda_probes.tensorflow_cuda,
            ptx_only_from=TENSORFLOW_PTX_ONLY,
            env_prefixes=("TF_",),
            reserved_env=(("TF_CONFIG", "the Keras adapter sets each rank's cluster"),),
            host_sync_per_step="one per step: the step fetches its loss to the host",
            initialisation_and_data_order=(
                "weights from tf_keras' initializers after set_random_seed(seed + rank), "
                "worker 0's on every worker (MultiWorkerMirroredStrategy); data by tf.data, as "
                "TensorFlow"
            ),
        ),
        Framework(
            "horovod",
            "dlscale.frameworks.horovod",
            imports=("torch", "horovod.torch"),
            environment="horovod",
            model_package="torch",
            cuda_probe=cuda_probes.horovod_cuda,
            env_prefixes=("HOROVOD_",),
            comm_env=("HOROVOD_",),
            host_sync_per_step=(
                "one per step: hvd.DistributedOptimizer's synchronize() waits on the host for "
                "every gradient allreduce before the update (and under fp16 GradScaler reads its "
                "inf check on the host: Horovod's optimizer is not the fused SGD)"
            ),
            host_sync_per_step_cpu=(
                "one per step: hvd.DistributedOptimizer's synchronize() waits on the host for "
                "every gradient allreduce before the update"
            ),
            initialisation_and_data_order=(
                "weights from torch.manual_seed(seed + rank), rank 0's broadcast by "
                "hvd.broadcast_parameters; data in DistributedSampler's order, as PyTorch"
            ),
        ),
        Framework(
            "mxnet",
            "dlscale.frameworks.mxnet",
            imports=("mxnet",),
            environment="mxnet",
            model_package="mxnet",
            cuda_probe=cuda_probes.mxnet_cuda,
            env_prefixes=("MXNET_", "DMLC_"),
            comm_env=("DMLC_",),
            reserved_env=(("DMLC_", "the MXNet adapter's parameter-server settings"),),
            host_sync_per_step="one per step: mx.nd.waitall() after the kvstore push and pull",
            initialisation_and_data_order=(
                "weights from mx.random.seed(seed) on every rank (the same draw), rank 0's "
                "broadcast through the kvstore before the first epoch; data by a Gluon "
                "DataLoader in DistributedSampler's order, as PyTorch"
            ),
            cuda_limit=(
                8.6,
                "MXNet 1.9.1 (the last release) has CUDA builds for CUDA 11.2 and 11.7 only "
                "(mxnet-cu112, mxnet-cu117); CUDA 11.7 cannot build for compute capability 9.0 "
                "(Hopper) or newer",
            ),
        ),
    )
}


def _check_strategy_records() -> None:
    """Each strategy record names registered frameworks, and the default strategy is every
    framework's (its record names none)."""
    for record in STRATEGIES.values():
        unknown = [f for f in record.frameworks or () if f not in FRAMEWORKS]
        if unknown:
            raise RegistryError(
                f"strategy record {record.name!r} (dlscale.registry.strategies): fact "
                f"'frameworks' names {', '.join(unknown)}; allowed: {', '.join(FRAMEWORKS)}"
            )
    if STRATEGIES[DEFAULT_STRATEGY].frameworks is not None:
        raise RegistryError(
            f"strategy record {DEFAULT_STRATEGY!r}: the default strategy is every framework's "
            "(fact 'frameworks' must be None)"
        )


_check_strategy_records()


def get(name: str) -> Framework:
    """The record of `name`; an unknown name is refused with the allowed values."""
    try:
        return FRAMEWORKS[name]
    except KeyError:
        raise KeyError(
            f"unknown framework {name!r}; allowed values: {', '.join(FRAMEWORKS)}"
        ) from None


def with_capability(capability: str) -> list[str]:
    """The frameworks whose adapters run `capability` (CAPABILITIES), in record order."""
    if capability not in CAPABILITIES:
        raise RegistryError(f"capability {capability!r}; allowed: {', '.join(CAPABILITIES)}")
    return [n for n, r in FRAMEWORKS.items() if capability in r.capabilities]


def env_prefixes() -> tuple[str, ...]:
    """Every framework's own environment-variable prefixes (Framework.env_prefixes), once each."""
    return tuple(dict.fromkeys(p for r in FRAMEWORKS.values() for p in r.env_prefixes))


def comm_env() -> tuple[str, ...]:
    """Every framework's communication prefixes (Framework.comm_env), once each."""
    return tuple(dict.fromkeys(p for r in FRAMEWORKS.values() for p in r.comm_env))


def reserved_env() -> dict[str, str]:
    """The variables (or prefixes) some adapter sets for every rank, with why (the first
    framework's reason where two set the same)."""
    out: dict[str, str] = {}
    for record in FRAMEWORKS.values():
        for name, why in record.reserved_env:
            out.setdefault(name, why)
    return out


def names() -> list[str]:
    return list(FRAMEWORKS)


def supporting(workload: str) -> list[str]:
    """The frameworks whose adapters run `workload`."""
    return [f.name for f in FRAMEWORKS.values() if workload in f.workloads]


def offering(strategy: str) -> list[str]:
    """The frameworks whose adapters run `strategy`."""
    return [f.name for f in FRAMEWORKS.values() if strategy in f.strategies]


def environment_name(framework: str, variant: str = "cpu") -> str | None:
    """The venv a framework's ranks run in for a variant (Framework.environment_name)."""
    return get(framework).environment_name(variant)


def environments(variant: str = "cpu") -> list[str]:
    """Every venv under .venvs/ the frameworks need for a variant, once each, in record order
    (the driver's own .venv is not one): what scripts/setup.sh builds by default."""
    out = []
    for f in FRAMEWORKS.values():
        env = f.environment_name(variant)
        if env is not None and env not in out:
            out.append(env)
    if variant == "cuda":
        out += [e for f in FRAMEWORKS.values() for e in f.line_environments() if e not in out]
    return out


# Where the framework environments live: .venvs/ in the checkout, or the folder this variable
# names (project or scratch space; a relative path is taken from the checkout). scripts/setup.sh
# builds them there and the workflow runs cells from there; no identity includes the folder.
# The driver's own .venv stays in the checkout.
ENVS_DIR_VARIABLE = "DLSCALE_ENVS_DIR"


def environments_folder(environ=None) -> str:
    """The environments' folder as the user names it: .venvs, or $DLSCALE_ENVS_DIR."""
    return (os.environ if environ is None else environ).get(ENVS_DIR_VARIABLE) or ".venvs"


def environments_dir(checkout: str | Path, environ=None) -> Path:
    """The environments' folder of the checkout at `checkout`, absolute."""
    folder = Path(environments_folder(environ)).expanduser()
    return Path(os.path.abspath(Path(checkout) / folder))


def get_adapter(name: str):
    """The framework's Adapter class (imports the adapter module, and so the framework)."""
    return importlib.import_module(get(name).adapter).Adapter

"""The hardware file's checks beyond its schema: a CUDA entry needs GPUs, a GRES type must be one,
GPU binding and CPU builds only where they fit (a binding map: one GPU and NUMA node or CPU list
per GPU of the node, on whole nodes), dense peaks only (peak_tflops, for MFU), no `env:`
variable and no Slurm option (sbatch_options, srun_options: dlscale.study.site_options) the
project sets itself; and the environment variant an entry's cells run in. Every problem is
reported before any job, at once.
"""

from __future__ import annotations

import re

from dlscale.registry.cuda_drivers import highest_cuda_major, version_tuple
from dlscale.registry.gpu_bindings import binding_of, map_problems
from dlscale.registry.gpu_bindings import canonical as canonical_binding
from dlscale.study.config import apply_defaults, schema_problems
from dlscale.study.container_image import container_problems
from dlscale.study.env_names import env_name_problem
from dlscale.study.errors import ConfigError
from dlscale.study.site_options import KEYS as SITE_OPTION_KEYS
from dlscale.study.site_options import check_options

# The precisions a dense peak may be given for (hardware file `peak_tflops`): the precision axis
# and tf32 (fp32 cells whose math ran on TF32 tensor cores, per the cell's recorded fast paths).
PEAK_PRECISIONS = ("fp32", "tf32", "bf16", "fp16", "fp8")  # fp8: the float8 cells' peak


PEAK_KEY = "peak_tflops"


def env_problems(key: str, env) -> list[str]:
    """Every `env:` name of a hardware entry that is refused, as `<entry>.env.<name>: why`."""
    if not isinstance(env, dict):
        return []  # the schema says what it must be
    return [f"{key}.env.{name}: {why}" for name in env if (why := env_name_problem(name))]


def _binds_cpus(entry: dict) -> bool:
    """Whether the entry's gpu_binding states a --cpu-bind in the ranks' srun (closest, maps)."""
    if entry.get("device") != "cuda" or "gpu_binding" not in entry:
        return False
    try:
        binding = binding_of(canonical_binding(entry["gpu_binding"]))
    except (KeyError, TypeError, ValueError):
        return False  # not a binding: refused with its own message
    return any(o.startswith("--cpu-bind") for o in binding.srun_options(1, 1))


def site_options(key: str, entry: dict) -> tuple[dict, list[str]]:
    """The entry's `sbatch_options` and `srun_options` as normalised token lists (a string is
    split as a shell splits it; dlscale.study.site_options), and every refused token as
    `<entry>.<option key>: why`."""
    tokens, problems = {}, []
    for option_key in SITE_OPTION_KEYS:
        value = entry.get(option_key)
        if not isinstance(value, str) and not (
            isinstance(value, list) and all(isinstance(token, str) for token in value)
        ):
            continue  # absent (the default: none), or the schema says what it must be
        tokens[option_key], found = check_options(
            value, option_key, entry.get("device"), _binds_cpus(entry)
        )
        problems += [f"{key}.{option_key}: {why}" for why in found]
    return tokens, problems


def peak_problems(key: str, peak) -> list[str]:
    """What is wrong with a hardware entry's ``peak_tflops`` beyond its schema: sparse peaks
    are refused (a key or a value that names sparsity), with the reason."""
    if not isinstance(peak, dict):
        return []
    problems = []
    for name, value in peak.items():
        flagged = "sparse" in str(name).lower() or (
            not isinstance(value, (int, float)) and "sparse" in str(value).lower()
        )
        if name == "source":
            flagged = "sparse" in str(value).lower() and "dense" not in str(value).lower()
        if flagged:
            problems.append(
                f"{key}.{PEAK_KEY}.{name}: sparse peaks are refused: MFU is measured against "
                "the dense peak (the datasheet's figure without structured sparsity, e.g. H100 "
                f"SXM bf16 989.4, not 1,979); allowed keys: {', '.join(PEAK_PRECISIONS)}, source"
            )
    return problems


def validate_hardware(hardware: dict, schema: dict, source: str = "hardware file") -> dict:
    if not isinstance(hardware, dict):
        raise ConfigError(source, ["(top level): must be a mapping of hardware keys"])
    problems = schema_problems(hardware, schema)
    options = {}  # the entries' site options, normalised
    for key, entry in hardware.items():
        if not isinstance(entry, dict):
            continue
        device, gpus = entry.get("device"), entry.get("gpus_per_node", 0)
        if device == "cuda" and not gpus:
            problems.append(f"{key}.gpus_per_node: device 'cuda' needs gpus_per_node >= 1")
        if device == "cpu" and gpus and entry.get("gpus_allocated_only") is not True:
            problems.append(
                f"{key}.gpus_per_node: {gpus} GPUs on a 'cpu' hardware key; "
                "set device: cuda, gpus_per_node: 0, or gpus_allocated_only: true "
                "(allocate the GPUs, compute on the CPU)"
            )
        gpu_type = entry.get("gpu_type")
        if (
            gpus
            and entry.get("gpu_request", "gres") == "gres"
            and isinstance(gpu_type, str)
            and not re.fullmatch(r"[A-Za-z0-9_.]+", gpu_type)
        ):
            # the Slurm plugin's `gres` resource takes letters, digits, `_` and `.` only
            problems.append(
                f"{key}.gpu_type: {gpu_type!r} cannot be a GRES type (letters, digits, _ and . "
                "only); rename it or use gpu_request: gpus"
            )
        if device == "cuda" and entry.get("environment_variant") == "cpu":
            problems.append(
                f"{key}.environment_variant: 'cpu' on a device 'cuda' entry: its ranks would "
                "run in CPU builds of the frameworks (allowed: cuda, or null for the device's "
                "default)"
            )
        driver_keys = [k for k in ("nvidia_driver", "max_cuda") if entry.get(k) is not None]
        if driver_keys and device != "cuda":
            problems.append(
                f"{key}.{driver_keys[0]}: only for device 'cuda' (a '{device}' entry's ranks "
                "use no GPU driver)"
            )
        elif len(driver_keys) == 2:
            problems += _driver_agreement(key, entry["nvidia_driver"], entry["max_cuda"])
        if "gpu_binding" in entry and device != "cuda":
            problems.append(
                f"{key}.gpu_binding: only for device 'cuda' (the ranks of a '{device}' entry "
                "use no GPU)"
            )
        elif isinstance(entry.get("gpu_binding"), dict):
            problems += map_problems(key, entry["gpu_binding"], gpus, entry.get("exclusive"))
        problems += peak_problems(key, entry.get(PEAK_KEY))
        problems += env_problems(key, entry.get("env"))
        options[key], found = site_options(key, entry)
        problems += found
        problems += container_problems(key, entry)
        limit = entry.get("max_time_min")
        if limit is not None and entry.get("runtime_min", 30) > limit:
            problems.append(
                f"{key}.runtime_min: {entry.get('runtime_min', 30)} minutes exceeds the "
                f"partition's maximum time ({key}.max_time_min: {limit}); allowed: 1 to {limit}"
            )
        if entry.get("gpus_allocated_only") is True and (device != "cpu" or not gpus):
            problems.append(
                f"{key}.gpus_allocated_only: only for device 'cpu' with gpus_per_node >= 1"
            )
    if problems:
        raise ConfigError(source, problems)
    validated = apply_defaults(schema, hardware)
    for key, tokens in options.items():
        validated[key].update(tokens)
    return validated


def environment_variant(entry: dict) -> str:
    """The environment variant (dlscale.registry.frameworks.VARIANTS) a hardware entry's cells
    run in: its `environment_variant`, else `cuda` for device cuda and `cpu` otherwise."""
    return entry.get("environment_variant") or ("cuda" if entry["device"] == "cuda" else "cpu")


def _driver_agreement(key: str, driver: str, max_cuda: str) -> list[str]:
    """nvidia_driver and max_cuda both stated: the driver table must give the driver that CUDA
    major (nvidia-smi prints both; a copy from two different nodes would disagree)."""
    major = highest_cuda_major(driver)
    if major is not None and major != version_tuple(max_cuda)[0]:
        return [
            f"{key}.max_cuda: {max_cuda} disagrees with {key}.nvidia_driver {driver}, whose "
            f"highest CUDA major is {major} (the driver table, dlscale/registry/"
            "cuda_drivers.json); state one of the two, as nvidia-smi prints it on a node"
        ]
    return []

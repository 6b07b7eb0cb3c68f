"""What a measurement depends on, hashed: the part of a hardware entry a cell's hardware hash covers
(hashed_hardware; the keys no hash includes, each set with its reason) and the study's config hash
(config_hash: the validated config and the hardware entries it uses, less what changes no
measurement). Editing what these leave out re-measures nothing."""

from __future__ import annotations

import hashlib
import json

from dlscale.registry.gpu_bindings import DEFAULT_GPU_BINDING
from dlscale.registry.parallel_dims import DEFAULT_PIPELINE_SCHEDULE
from dlscale.study.cell import DEFAULT_PARALLELISM

# Hardware keys only the planner reads (dlscale.decisions.planner): they change no measurement, so
# neither
# the config hash nor a cell's hardware hash includes them.
# `memory_headroom_gib`: what a rank's device holds outside the peak the planner compares
# (dlscale.study.partitions).
PLANNING_KEYS = (
    "nodes_available",
    "node_hour_cost",
    "node_power_w",
    "device_memory_gib",
    "memory_headroom_gib",
)


# Hardware keys that say where, not what: a convergence cell carries them (Cell.stage_dir), no
# hash includes them (moving the staging folder re-measures nothing).
CELL_HARDWARE_KEYS = ("stage_dir",)


# Hardware keys that say who pays and where and how long a job queues (account, QoS,
# reservation, the partition's maximum time): the Slurm plugin's resources of the cell's job
# (dlscale.study.resources), part of no hash.
SCHEDULING_KEYS = ("account", "qos", "reservation", "max_time_min")


# Hardware keys that choose or check the cell's environment: the cell's environment identity
# (name and hash of its pinned requirements, or a container image's digest:
# dlscale.study.container_image) covers the variant and the container, and compute_capability
# and the driver keys only refuse cells before any job; no hardware hash includes them.
ENVIRONMENT_KEYS = (
    "environment_variant",
    "container",
    "compute_capability",
    "nvidia_driver",
    "max_cuda",
    "cuda_forward_compat",
)


# Hardware keys only the analysis reads: the dense peak (dlscale.analysis.mfu, MFU); part of no
# hash.
ANALYSIS_KEYS = ("peak_tflops",)


# Hardware keys added after studies were measured, hashed only away from their default: at the
# default they ask exactly what an entry without them asked, so existing cells stay measured.
# `modules` and `env` (the job's software, dlscale.run.site_env): none loaded, none set;
# `sbatch_options` and `srun_options` (the site's own Slurm options, dlscale.study.site_options,
# normalised to token lists by the hardware file's checks): none.
LATER_DEFAULTS = {
    "gpus_allocated_only": False,
    "gpu_binding": DEFAULT_GPU_BINDING,
    "modules": [],
    "env": {},
    "sbatch_options": [],
    "srun_options": [],
}


# config keys added after studies were measured, with the value every study had before them:
# at it a study hashes as it did (a cell that differs has it in its own identity, Cell)
# - workloads: throughput only, as before the convergence workload;
# - the parallelism's degrees unset (every cell ddp) and the pipeline's schedule at its default;
# - activation checkpointing, the attention kernel, the compiled loss, what world size 1 runs
#   and each decoder's sequence length, at their defaults.
LATER_CONFIG_DEFAULTS = {
    "workloads": ["throughput"],
    "tp_degree": None,
    "pp_degree": None,
    "microbatches": None,
    "pp_schedule": DEFAULT_PIPELINE_SCHEDULE,
    "activation_checkpointing": "none",
    "attention": None,
    "compile_loss": False,
    "single_device": "plain",
    "seq_len": None,
}
# the axes added later, at the value every cell had before them: every cell ddp, and its
# hardware's ranks per node
LATER_AXIS_DEFAULTS = {"parallelism": [DEFAULT_PARALLELISM], "ranks_per_node": None}


# config `optimizer` keys added after studies were measured, with their defaults: at these the
# study hashes as before they existed. What a cell trains with is in its own identity
# (Cell.optimizer and its settings: dlscale.registry.optimizers), where `auto` gives the
# decoder cells AdamW, a new identity; the study's hash only summarises the config.
LATER_OPTIMIZER_DEFAULTS = {
    "name": "auto",
    "betas": [0.9, 0.95],
    "eps": 1e-08,
    "weight_decay": 0.1,
    "grad_clip_norm": 1.0,
}


def hashed_hardware(entry: dict) -> dict:
    """The part of a hardware entry that a measurement depends on (config and cell hashes)."""
    return {
        k: v
        for k, v in entry.items()
        if k not in PLANNING_KEYS
        and k not in CELL_HARDWARE_KEYS
        and k not in SCHEDULING_KEYS
        and k not in ENVIRONMENT_KEYS
        and k not in ANALYSIS_KEYS
        and not (k in LATER_DEFAULTS and v == LATER_DEFAULTS[k])
    }


def config_hash(config: dict, hardware: dict) -> str:
    """Short, stable hash of the validated config and the hardware entries it uses."""
    used = {k: hashed_hardware(hardware[k]) for k in config["axes"]["hardware"] if k in hardware}
    # Presentation settings and the flags of one run do not change what is measured; the
    # launcher does (local processes on one host or srun over the allocation's nodes).
    measured = {
        k: v
        for k, v in config.items()
        if k
        not in (
            "report",
            "remeasure",
            "restart",
            "max_cells",
            "study_file",
            "references_file",
            "plan",
            "first_step_timeout_s",  # a deadline, in no cell's identity either
            "preflight",  # a check before the cells, not what they measure
            "preflight_max_age_h",
            "pack",  # how cells share allocations, not what they measure
            "pack_steps",  # whether a pack's cells run side by side, not what they measure
            "database",  # where the results are kept (dlscale.store.database), a scheduling setting
            "history",  # how the results are judged against their history, not measured
            "trace",  # a trace re-measures nothing (Cell.trace_steps is in no identity)
        )
    }
    # keys added later count only where they ask for something: at their LATER_CONFIG_DEFAULTS
    # (LATER_AXIS_DEFAULTS, LATER_OPTIMIZER_DEFAULTS) a study hashes as before the key existed
    for key, default in LATER_CONFIG_DEFAULTS.items():
        if key in measured and measured[key] == default:
            del measured[key]
    axes = measured.get("axes", {})
    if any(k in axes and axes[k] == v for k, v in LATER_AXIS_DEFAULTS.items()):
        measured["axes"] = {
            k: v
            for k, v in axes.items()
            if not (k in LATER_AXIS_DEFAULTS and v == LATER_AXIS_DEFAULTS[k])
        }
    if "optimizer" in measured:
        measured["optimizer"] = {
            k: v
            for k, v in measured["optimizer"].items()
            if not (k in LATER_OPTIMIZER_DEFAULTS and v == LATER_OPTIMIZER_DEFAULTS[k])
        }
    if not measured.get("models"):  # no models of the study's own: as before the key
        measured.pop("models", None)
    if "convergence" not in config.get("workloads", ["throughput"]):
        measured.pop("convergence", None)
    elif "convergence" in measured:  # the validity band's tolerance: analysis, not measurement
        measured["convergence"] = {
            k: v for k, v in measured["convergence"].items() if k != "validity_tolerance"
        }
    if "script" not in config.get("workloads", ["throughput"]):  # a study without scripts
        measured.pop("script", None)
    blob = json.dumps({"config": measured, "hardware": used}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]

"""The resources of a cell's Slurm job (and its local threads), from its hardware entry in
config/hardware.yaml (site facts). Names follow snakemake-executor-plugin-slurm.

A cell's resources depend on its hardware and node count only, so the workflow computes them
once per resource class (one train rule each, rules/train.smk) at parse time: a 10,000-cell
study evaluates this a few dozen times, not once per resource per job.
"""

from __future__ import annotations

import shlex

from .matrix import ranks_per_node


def class_resources(config: dict, hw: dict, nodes: int) -> dict:
    """threads and the Slurm resources of every cell of one (hardware, nodes) class."""
    per_node = ranks_per_node(config, hw)
    world = nodes * per_node
    return {
        # local profile: the cores a cell occupies (all its ranks), so cells never share a core
        "threads": world * hw["cpus_per_rank"],
        "nodes": nodes,
        "tasks": world,
        "cpus_per_task": hw["cpus_per_rank"],
        "mem_mb": per_node * hw["mem_mb_per_rank"],  # per node: the ranks of one node
        "runtime": retried_runtime(hw["runtime_min"]),
        "slurm_partition": hw["partition"] or "",
        "slurm_extra": slurm_extra(hw, per_node),
        # No `mpi` resource, although the launcher calls srun itself: with one, the plugin's
        # job step (slurm-jobstep 0.6.1) runs the first cell of a job array in every array task
        # (it checks `mpi` before the array dispatch). Without it a single job runs inside an
        # `srun -n1` step, and the launcher's srun shares that step (--overlap, dlscale.launch).
    }


def retried_runtime(minutes: int):
    """Minutes; a retried cell (profile `retries`) gets twice the time per attempt."""

    def runtime(wildcards, attempt):
        return minutes * 2 ** (attempt - 1)

    return runtime


def slurm_extra_args(hw: dict, per_node: int) -> list[str]:
    """sbatch flags with no resource of their own (GPUs, exclusivity, constraint, tasks per
    node), one argument each: flag and value joined by `=`, so no value can start a flag."""
    args = [f"--ntasks-per-node={int(per_node)}"]
    if hw["constraint"]:
        args.append(f"--constraint={hw['constraint']}")
    if hw["gpus_per_node"]:
        gpu = f"{hw['gpu_type']}:" if hw["gpu_type"] else ""
        if hw["gpu_request"] == "gres":
            args.append(f"--gres=gpu:{gpu}{int(hw['gpus_per_node'])}")
        else:
            args.append(f"--gpus-per-node={gpu}{int(hw['gpus_per_node'])}")
    if hw["exclusive"]:
        args.append("--exclusive")
    return args


def slurm_extra(hw: dict, per_node: int) -> str:
    """slurm_extra_args as the one string the Slurm plugin appends to its sbatch command line
    (which a shell runs): every argument shell-quoted (shlex.join), so a value is one argument
    whatever it holds (a constraint's `|`, `&`, `*`, `[ ]` included). Values are also checked
    against safe patterns first (config/schemas/hardware.schema.json)."""
    return shlex.join(slurm_extra_args(hw, per_node))

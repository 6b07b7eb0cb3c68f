# Resource callables only. Every Slurm resource of a cell is derived from its hardware entry in
# config/hardware.yaml (site facts); nothing partition- or sbatch-specific is typed in a rule.
# Names follow snakemake-executor-plugin-slurm; on the local profile only `threads` matters.


def _hw(wildcards):
    return STUDY.hardware[cell_of(wildcards).hardware]


def cell_threads(wildcards):
    """Local profile: cores a cell occupies (all its ranks), so cells never share a core."""
    cell = cell_of(wildcards)
    return cell.world_size * cell.cpus_per_rank


def cell_nodes(wildcards):
    return cell_of(wildcards).nodes


def cell_tasks(wildcards):
    return cell_of(wildcards).world_size


def cell_cpus_per_task(wildcards):
    return cell_of(wildcards).cpus_per_rank


def cell_mem_mb(wildcards):
    """Memory per node: the ranks of one node."""
    cell = cell_of(wildcards)
    return cell.ranks_per_node * _hw(wildcards)["mem_mb_per_rank"]


def cell_runtime(wildcards, attempt):
    """Minutes; a retried cell (profile `retries`) gets twice the time per attempt."""
    return _hw(wildcards)["runtime_min"] * 2 ** (attempt - 1)


def cell_partition(wildcards):
    return _hw(wildcards)["partition"] or ""


def cell_slurm_extra(wildcards):
    """sbatch flags with no resource of their own: GPUs, exclusivity, constraint, tasks per node.
    Every value is schema-checked against a safe pattern (config/schemas/hardware.schema.json)."""
    cell, hw = cell_of(wildcards), _hw(wildcards)
    flags = [f"--ntasks-per-node={cell.ranks_per_node}"]
    if hw["constraint"]:
        flags.append(f"--constraint={hw['constraint']}")
    if hw["gpus_per_node"]:
        gpu = f"{hw['gpu_type']}:" if hw["gpu_type"] else ""
        if hw["gpu_request"] == "gres":
            flags.append(f"--gres=gpu:{gpu}{hw['gpus_per_node']}")
        else:
            flags.append(f"--gpus-per-node={gpu}{hw['gpus_per_node']}")
    if hw["exclusive"]:
        flags.append("--exclusive")
    return " ".join(flags)


def cell_mpi(wildcards):
    """The plugin runs a job with an `mpi` resource as-is (our launcher calls srun itself);
    without it, it wraps the job in `srun -n1`. It accepts `mpi` only for more than one task."""
    return "srun" if cell_of(wildcards).world_size > 1 else ""

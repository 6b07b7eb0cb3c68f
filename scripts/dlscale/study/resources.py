"""The resources of a cell's Slurm job (and its local threads), from its hardware entry in
config/hardware.yaml (site facts). Names follow snakemake-executor-plugin-slurm.

A cell's resources depend on its hardware, node count and ranks per node only, so the workflow
computes them once per resource class (one train rule each, rules/train.smk) at parse time: a
10,000-cell study evaluates this a few dozen times, not once per resource per job.
"""

from __future__ import annotations

import shlex

from dlscale.study.workloads import ranks_per_node


def class_resources(
    config: dict, hw: dict, nodes: int, per_node: int | None = None
) -> tuple[int, dict]:
    """(threads, resources) of every cell of one (hardware, nodes, ranks per node) class: the
    rule's `threads` (local profile: the cores a cell occupies, all its ranks, so cells never
    share a core) and its `resources`, the Slurm plugin's names. `per_node`: the class's ranks
    per node (config axes.ranks_per_node), else the hardware's default (one per GPU); a GPU
    class asks for one GPU per rank, so a 1-GPU cell holds one GPU of its node, not four.

    Every option the executor plugin manages itself is one of its resources (it refuses them in
    `slurm_extra`, snakemake-executor-plugin-slurm 2.8 `validate_slurm_extra`): partition,
    constraint, GPUs as GRES. Only options it has no resource for go to `slurm_extra`."""
    per_node = per_node or ranks_per_node(config, hw)
    world = nodes * per_node
    return world * hw["cpus_per_rank"], {
        "nodes": nodes,
        "tasks": world,
        "cpus_per_task": hw["cpus_per_rank"],
        "mem_mb": per_node * hw["mem_mb_per_rank"],  # per node: the ranks of one node
        "runtime": retried_runtime(hw["runtime_min"], hw.get("max_time_min")),
        "slurm_partition": hw["partition"] or "",
        **plugin_owned(hw, per_node),
        "slurm_extra": slurm_extra(hw, per_node),
        # No `mpi` resource, although the launcher calls srun itself: with one, the plugin's
        # job step (slurm-jobstep 0.6.1) runs the first cell of a job array in every array task
        # (it checks `mpi` before the array dispatch). Without it a single job runs inside an
        # `srun -n1` step, and the launcher's srun shares that step (--overlap, dlscale.run.launch).
        # Every cell counts 1 against the profile's `resources: dlscale_cell=N` limit; the
        # local profile sets N=1 so no cell is measured while another one runs.
        "dlscale_cell": 1,
        # the partition's maximum time, read by a packed study (dlscale.workflow.packing)
        **({"dlscale_max_time_min": hw["max_time_min"]} if hw.get("max_time_min") else {}),
        # the nodes a pack may take at once (else the partition's node count)
        **(
            {"dlscale_pack_nodes": hw.get("nodes_available") or hw["max_nodes"]}
            if hw.get("nodes_available") or hw.get("max_nodes")
            else {}
        ),
    }


def plugin_owned(hw: dict, per_node: int | None = None) -> dict:
    """The plugin's own resources for what a hardware entry asks beyond cores and memory.

    - `slurm_account` and `qos` of the entry's `account` and `qos` (sbatch --account, --qos);
    - `constraint` (sbatch -C, quoted by the plugin);
    - `gres` for `gpu_request: gres`: `gpu[:type]:N`, per node, as Slurm counts GRES (N: the
      class's ranks per node on GPU hardware, `per_node`, else every GPU of the node). A GRES
      job makes the plugin add `--ntasks-per-gpu=<tasks>` (the job's total task count per
      GPU, which would multiply the ranks) unless `tasks_per_gpu` is 0 (plugin 2.8's
      submit_string adds the flag only for values >= 1;
      snakemake/snakemake-executor-plugin-slurm#316). The task geometry is then
      `--ntasks-per-node` (slurm_extra), as for every other class, one rank per GPU on GPU
      hardware. The plugin's GRES pattern has no `-` in a type: dlscale.study.config refuses
      such a gpu_type for `gres` requests before any job.
    `gpu_request: gpus` has no plugin resource: the plugin's `gpu` is `--gpus`, a count for the
    whole job that Slurm may split unevenly across nodes; `--gpus-per-node` (which the plugin
    does not manage or refuse) stays in slurm_extra."""
    owned = {}
    # per-entry scheduling (hardware.yaml account, qos): the plugin's slurm_account and qos
    # resources, so a site with per-partition accounts needs no edit of a rule or profile
    if hw.get("account"):
        owned["slurm_account"] = hw["account"]
    if hw.get("qos"):
        owned["qos"] = hw["qos"]
    if hw["constraint"]:
        owned["constraint"] = hw["constraint"]
    if hw["gpus_per_node"] and hw["gpu_request"] == "gres":
        owned["gres"] = f"gpu:{gpu_spec(hw, per_node)}"
        owned["tasks_per_gpu"] = 0
    return owned


def gpu_spec(hw: dict, per_node: int | None = None) -> str:
    """`[type:]count` of the GPUs a job asks of each node: one per rank (`per_node`) on GPU
    hardware, else (a CPU entry's allocated GPUs) all the node's."""
    gpu = f"{hw['gpu_type']}:" if hw["gpu_type"] else ""
    count = per_node if per_node and hw["device"] == "cuda" else hw["gpus_per_node"]
    return f"{gpu}{int(count)}"


def retried_runtime(minutes: int, limit: int | None = None):
    """Minutes; a retried cell (profile `retries`) gets twice the time per attempt, at most the
    partition's maximum time (`max_time_min`, where the entry states it)."""

    def runtime(wildcards, attempt):
        doubled = minutes * 2 ** (attempt - 1)
        return doubled if limit is None else min(doubled, limit)

    return runtime


def slurm_extra_args(hw: dict, per_node: int) -> list[str]:
    """sbatch flags the plugin has no resource for: the entry's own `sbatch_options` (the site's
    options, checked and normalised by dlscale.study.site_options: none that dlscale sets), then
    tasks per node, GPUs per node, exclusivity and reservation, one argument each: flag and
    value joined by `=`, so no value can start a flag."""
    args = [*hw.get("sbatch_options", ()), f"--ntasks-per-node={int(per_node)}"]
    if hw["gpus_per_node"] and hw["gpu_request"] == "gpus":
        args.append(f"--gpus-per-node={gpu_spec(hw, per_node)}")
    if hw["exclusive"]:
        args.append("--exclusive")
    if hw.get("reservation"):  # the plugin's reservation is one setting for every job
        args.append(f"--reservation={hw['reservation']}")
    return args


def slurm_extra(hw: dict, per_node: int) -> str:
    """slurm_extra_args as the one string the Slurm plugin appends to its sbatch command line
    (which a shell runs): every argument shell-quoted (shlex.join), so a value is one argument
    whatever it holds. Values are also checked against safe patterns first
    (config/schemas/hardware.schema.json)."""
    return shlex.join(slurm_extra_args(hw, per_node))


def preflight_sbatch_args(
    config: dict, hw: dict, nodes: int, per_node: int, minutes: int
) -> list[str]:
    """The sbatch flags of an entry's preflight job (dlscale.workflow.preflight): the resources
    of the entry's cells with `per_node` ranks on `nodes` nodes (class_resources, as the Slurm
    plugin turns them into flags), with a time limit of `minutes`, and the entry's own
    `sbatch_options` (slurm_extra_args) as the cells' jobs have them."""
    _, res = class_resources(config, hw, nodes, per_node)
    flags = {
        "slurm_partition": "--partition",
        "slurm_account": "--account",
        "qos": "--qos",
        "constraint": "--constraint",
        "gres": "--gres",
        "nodes": "--nodes",
        "tasks": "--ntasks",
        "cpus_per_task": "--cpus-per-task",
        "mem_mb": "--mem",
    }
    args = [f"{flag}={res[name]}" for name, flag in flags.items() if res.get(name)]
    return [*args, f"--time={int(minutes)}", *slurm_extra_args(hw, per_node)]

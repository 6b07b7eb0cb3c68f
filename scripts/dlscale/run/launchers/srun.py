"""The `srun` launcher: one srun step with every rank inside the cell's Slurm allocation (its
record: dlscale.registry.launchers): the nodes, the rendezvous port seeded by the job id, the
binding it states for a cuda cell, the site's srun_options, a packed cell's exact nodes."""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Mapping
from pathlib import Path

from dlscale.rank.node_probes import job_allocation
from dlscale.registry.containers import ENGINES
from dlscale.registry.gpu_bindings import SRUN_BINDING_INPUTS, binding_of
from dlscale.run.diagnosis import with_nccl_debug
from dlscale.run.launchers.launcher_base import Launcher, Ranks, in_container, register
from dlscale.run.launchers.local import LocalLauncher
from dlscale.run.launchers.ports import PORT_PROBES, port_free, ports_per_host, rendezvous_port
from dlscale.study.cell import Cell


def allocation_nodes(env=os.environ) -> list[str]:
    """Host names of the job's allocation. The executor plugin strips SLURM_JOB_NODELIST from
    the job's environment, so ask Slurm by job id when it is gone."""
    nodelist = (
        env.get("SLURM_JOB_NODELIST")
        or subprocess.run(
            ["squeue", "--noheader", "--jobs", env["SLURM_JOB_ID"], "--format", "%N"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
    )
    return subprocess.run(
        ["scontrol", "show", "hostnames", nodelist], check=True, capture_output=True, text=True
    ).stdout.split()


def pack_nodes(env=os.environ) -> list[str]:
    """The nodes a packed cell's step runs on (DLSCALE_PACK_NODES, set by
    dlscale.workflow.pack_runner inside the pack's allocation), or [] for a cell's own job."""
    return [n for n in env.get("DLSCALE_PACK_NODES", "").split(",") if n]


def choose_slurm_port(env=os.environ, ranks_here: int = 1, is_free=port_free) -> int:
    """The job's base port (port_block of its job id; a packed cell's: of its job id and its
    slot, so consecutive cells of a pack do not meet the last one's ports in TIME_WAIT), with
    the ports of the `ranks_here` ranks on this host (the allocation's first node, where the
    launcher runs) free; the next blocks when not."""
    job = int(env["SLURM_JOB_ID"]) + PORT_PROBES * int(env.get("DLSCALE_PACK_SLOT", 0))
    seeds = (job + probe for probe in range(PORT_PROBES))
    return rendezvous_port(seeds, ports_per_host(ranks_here), f"Slurm job {job}", is_free)


def gpu_step_options(cell: Cell, job_gpus: int | None = None) -> list[str]:
    """The binding the launcher states for a cuda cell's ranks: its hardware entry's gpu_binding
    (a record or a map of dlscale.registry.gpu_bindings, which says what each form states and
    why node and task leave the CPUs to the partition's configuration) gives the srun options;
    the rank then takes its device from what it sees (dlscale.rank.devices.pick_gpu). Nothing
    for a CPU cell. Stated explicitly, with the inherited binding variables removed
    (binding_free_env), so no site default decides silently. `job_gpus`: the GPUs the job holds
    on a node (job_gpus_per_node), for a binding whose step takes them all (closest)."""
    if cell.device != "cuda":
        return []
    return binding_of(cell.gpu_binding).srun_options(cell.ranks_per_node, job_gpus)


def job_gpus_per_node(env: Mapping[str, str]) -> int | None:
    """How many GPUs the job holds on its first node, as `scontrol show job -d` allocates them
    (`GRES=gpu:h100:4(IDX:0-3)`: 4; an exclusive job holds every GPU of its nodes, more than
    it asked for); None where Slurm does not say."""
    allocation = job_allocation(env["SLURM_JOB_ID"]) if env.get("SLURM_JOB_ID") else None
    nodes = (allocation or {}).get("per_node") or [{}]
    counts = re.findall(r"(?:^|,)gpu(?::[^:(),]+)?:(\d+)", nodes[0].get("gres") or "")
    return sum(map(int, counts)) or None


def binding_free_env(env: Mapping[str, str]) -> tuple[dict, dict]:
    """`env` without srun's input variables that bind tasks (SRUN_BINDING_INPUTS: a site
    profile's or the user's SLURM_CPU_BIND, SLURM_GPU_BIND, ...), and those it removed: the
    ranks' step binds as gpu_binding states (or, for a CPU cell, as the partition is
    configured), as it does inside the executor plugin's job step, which keeps none of them."""
    kept = {k: v for k, v in env.items() if k not in SRUN_BINDING_INPUTS}
    return kept, {k: env[k] for k in SRUN_BINDING_INPUTS if k in env}


SLURM_IDENTITY = {
    "SLURM_JOB_ID",
    "SLURM_JOBID",
    "SLURM_CONF",
    "SLURM_ARRAY_JOB_ID",
    "SLURM_ARRAY_TASK_ID",
    "SLURM_CLUSTER_NAME",
}


def srun_command(
    cell: Cell,
    argv: list[str],
    rank_dir: Path,
    overlap: bool = False,
    container_options: list[str] | tuple[str, ...] = (),
    job_gpus: int | None = None,
) -> list[str]:
    """The ranks' srun step: the entry's own `srun_options` first (the site's, checked by
    dlscale.study.site_options: none that dlscale sets), then the launcher's, so where Slurm
    takes the last of an option, the launcher's stated one wins. `overlap`: the launcher runs
    inside the executor plugin's step, whose resources the ranks' step shares.
    `container_options`: a container engine's srun options (pyxis: in_container); `job_gpus`:
    the GPUs the job holds per node, where the binding takes them all (closest, maps). A 1-rank cell
    inside the plugin's step (group jobs, --sdm conda or apptainer: dlscale.workflow.jobstep)
    starts no srun of its own (_run_ranks): its srun_options reach no step."""
    return [
        "srun",
        *cell.srun_options,
        *(["--overlap"] if overlap else []),
        *container_options,
        f"--nodes={cell.nodes}",
        f"--ntasks={cell.world_size}",
        f"--ntasks-per-node={cell.ranks_per_node}",
        f"--cpus-per-task={cell.cpus_per_rank}",
        *gpu_step_options(cell, job_gpus),
        "--kill-on-bad-exit=1",
        "--output",
        str(rank_dir / "rank%t.log"),
        *argv,
    ]


def start_srun(
    cell: Cell, argv: list[str], rank_dir: Path, base: Mapping[str, str] = os.environ
) -> Ranks:
    """Inside a Slurm allocation: one srun step with every rank (srun_command, the entry's
    srun_options included); counts passed explicitly because the executor plugin strips most
    SLURM_* variables from the job's environment, the binding stated (gpu_step_options) and
    inherited binding variables removed (binding_free_env, named at the top of srun.log).
    `base`: the ranks' environment before the launcher's variables (srun passes it on to every
    rank)."""
    env, overlap = dict(base), False
    if "SLURM_STEP_ID" in env:
        # The executor plugin's job step runs the launcher inside an `srun -n1` step. That step's
        # SLURM_* (node list included) describe one task on one node, not the allocation: keep
        # only the job's identity (as the plugin does for its own steps), ask Slurm for the
        # allocation's nodes, and let the ranks' step share the resources the launcher's step
        # holds (--overlap, Slurm >= 20.11).
        env = {
            k: v
            for k, v in env.items()
            if not k.startswith(("SLURM_", "SRUN_", "SBATCH_")) or k in SLURM_IDENTITY
        }
        overlap = True
    env, removed = binding_free_env(env)
    job_gpus = None
    if cell.device == "cuda" and binding_of(cell.gpu_binding).needs_job_gpus:
        job_gpus = job_gpus_per_node(env)
    hosts = pack_nodes(env) or allocation_nodes(env)
    addr, port = hosts[0], choose_slurm_port(env, cell.ranks_per_node)
    env.update(
        MASTER_ADDR=addr,
        MASTER_PORT=str(port),
        DLSCALE_HOSTS=",".join(hosts),
        OMP_NUM_THREADS=str(cell.cpus_per_rank),
        PYTHONUNBUFFERED="1",
    )
    if cell.device == "cuda":
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"  # CUDA numbers GPUs as NVML and nvidia-smi do
    with_nccl_debug(env)
    container_options, argv = in_container(cell, argv, rank_dir, env)
    cmd = srun_command(cell, argv, rank_dir, overlap, container_options, job_gpus)
    if pack_nodes(env):  # a packed cell's step: exactly the nodes its pack runner gave it
        cmd[1:1] = [f"--nodelist={','.join(hosts)}"]
    log = (rank_dir / "srun.log").open("w")
    if removed:
        shown = " ".join(f"{k}={v}" for k, v in removed.items())
        log.write(
            f"dlscale: removed from the ranks' srun environment (it binds as stated): {shown}\n"
        )
        log.flush()
    return [
        (
            -1,
            subprocess.Popen(
                cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            ),
        )
    ]


@register
class SrunLauncher(Launcher):
    name = "srun"
    watches_step = True

    def start(
        self, cell: Cell, argv: list[str], rank_dir: Path, base: Mapping[str, str] = os.environ
    ) -> Ranks:
        return start_srun(cell, argv, rank_dir, base)

    def for_cell(self, cell: Cell, env: Mapping[str, str]) -> Launcher:
        """A 1-rank cell already inside the job step the executor plugin made for it (`srun
        -n1`; not the project's executor's path, dlscale.workflow.jobstep) starts its rank
        here: a nested srun would wait for CPUs that step holds, so the entry's srun_options
        have no srun to go to. A pyxis container, which starts only through srun, gets its own
        overlapping step all the same (start_srun)."""
        needs_srun = bool(cell.container) and ENGINES[dict(cell.container)["engine"]].needs_srun
        if cell.world_size == 1 and "SLURM_STEP_ID" in env and not needs_srun:
            return LocalLauncher()
        return self

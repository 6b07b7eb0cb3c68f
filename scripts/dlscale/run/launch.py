"""Where ranks start.

`python -m dlscale.run.launch --cell-json CELL --output metrics.jsonl` runs one cell (CELL is
`dlscale.study.cell.Cell.to_json()`):
  1. loads the hardware entry's modules and sets its env (dlscale.run.site_env, once: the ranks
     start with that environment), writes the cell for its ranks (.ranks/cell.json) and starts
     nodes x ranks_per_node ranks of `python -m dlscale.run.train --cell .ranks/cell.json`,
     either as local processes (launcher `local`: the embedded default, one simulated node per
     group of ranks) or with `srun` inside the cell's Slurm allocation (launcher `srun`);
  2. waits for all of them; if one fails, the others are stopped and the cell fails with the
     rank, its exit code and the last lines of its log; communicator set-up and the first step
     are bounded from outside the ranks (dlscale.run.first_contact), and a failed cell's record
     and log end with the communication libraries' diagnosis (dlscale.run.diagnosis);
  3. merges the ranks' part files into the cell's metrics file (dlscale.store.metrics),
     validated and renamed into place only when complete, in a folder of its own that keeps
     this measurement with its logs (measurements/<time>-<job>/, dlscale.store.measurements);
     the cell's metrics.jsonl is a hard link to it.

The other half, inside a rank, is dlscale.rank.rank_context (`discover()` reads who-am-I from the
launcher's environment: dlscale's local launcher, srun, or torchrun).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

import dlscale
from dlscale.rank.node_probes import job_allocation
from dlscale.rank.provenance import git_commit
from dlscale.registry.containers import ENGINES
from dlscale.registry.gpu_bindings import SRUN_BINDING_INPUTS, binding_of
from dlscale.run import first_contact
from dlscale.run.diagnosis import diagnosis, render, with_nccl_debug
from dlscale.run.site_env import SiteEnvError, job_environment
from dlscale.store import metrics
from dlscale.store.does_not_fit import DOES_NOT_FIT
from dlscale.store.does_not_fit import rank_records as fit_records
from dlscale.store.does_not_fit import reason as fit_reason
from dlscale.store.measurements import keep_measurement
from dlscale.study.cell import (
    CELL_SPEC_FILE,
    ENVIRONMENTS_DIR,
    FAILURE_FILE,
    RANK_DIR,
    SITE_ENV_FILE,
    SLURM_JOB_FILE,
    Cell,
    study_dir_of,
    tail_lines,
)
from dlscale.study.container_image import needed_binds
from dlscale.study.protocol import RANK_END


# ----------------------------------------------------------------------------- the cell's launcher
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


# Rendezvous ports of Slurm cells: a block of PORT_BLOCK ports per job, below the kernel's
# ephemeral range (where outgoing connections take their local ports, so a fixed port there can
# be taken by any client), from PORT_FLOOR up.
PORT_BLOCK = 64  # frameworks that need more ports use the next few above the base (< 64)
PORT_FLOOR = 10000
PORT_PROBES = 8  # blocks tried, from the job's own, before the launcher gives up
EPHEMERAL_RANGE_FILE = "/proc/sys/net/ipv4/ip_local_port_range"


def ephemeral_range(path: str = EPHEMERAL_RANGE_FILE) -> tuple[int, int]:
    """The kernel's ephemeral port range (Linux's default 32768..60999 where unreadable)."""
    try:
        low, high = (int(v) for v in Path(path).read_text().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 60999


def port_block(seed: int, ephemeral: tuple[int, int]) -> int:
    """The base port of block number `seed` (modulo the block count): the blocks of PORT_BLOCK
    ports between PORT_FLOOR and the start of the ephemeral range (352 blocks at Linux's
    default). A Slurm cell's seed is its job id (then the next ids when that block is taken), so
    concurrent cells differ unless their job ids differ by a multiple of the block count; a
    local cell's seed is drawn at random."""
    low, _ = ephemeral
    floor = PORT_FLOOR if low - PORT_FLOOR >= PORT_BLOCK else 1024
    blocks = max(1, (low - floor) // PORT_BLOCK)
    return floor + (seed % blocks) * PORT_BLOCK


def port_free(port: int) -> bool:
    """Whether this host can listen on `port` now (what rank 0 will do)."""
    with socket.socket() as s:
        try:
            s.bind(("", port))
        except OSError:
            return False
    return True


def rendezvous_port(seeds, ports: int, where: str, is_free=port_free) -> int:
    """The base of the first block (port_block of each seed, at most PORT_PROBES tried)
    whose ports base .. base + ports - 1 are all free on this host, where rank 0 and the ranks
    beside it listen; a clear error naming the blocks when each has a port in use. The one port
    chooser of both launchers (choose_slurm_port, local_port)."""
    tried, ephemeral = [], ephemeral_range()
    for seed in itertools.islice(seeds, PORT_PROBES):
        port = port_block(seed, ephemeral)
        if all(is_free(port + k) for k in range(ports)):
            return port
        tried.append(port)
    raise RuntimeError(
        f"rendezvous ports: blocks at {tried} all in use on {socket.gethostname()} ({where}): "
        f"another program holds a port of each (base .. base + {ports - 1}). Free them, or "
        f"raise the start of the ephemeral range ({EPHEMERAL_RANGE_FILE}) to widen the blocks "
        f"above {PORT_FLOOR}"
    )


def ports_per_host(ranks: int) -> int:
    """Ports a cell's ranks listen on on one host: the base (rank 0's rendezvous), one per rank
    there (TensorFlow's workers listen on base + 1 + rank) and one spare."""
    return ranks + 2


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


class ContainerError(RuntimeError):
    """The container cannot see what its ranks need (a Charliecloud image without the mount
    point of a path the ranks read): the cell fails before any rank starts."""


def package_root() -> Path:
    """The folder the dlscale package is imported from (scripts/ of the checkout)."""
    return Path(dlscale.__file__).resolve().parent.parent


def in_container(
    cell: Cell, argv: list[str], rank_dir: Path, env: dict
) -> tuple[list[str], list[str]]:
    """(srun options, the rank's command) for a cell whose hardware entry names a container
    (hardware.yaml `container`; the engines' command lines: dlscale.registry.containers): the
    rank's interpreter is the image's (`container.python`) and the engine's program goes first;
    the dlscale package's folder, the working directory (the checkout), the cell's folder (its
    ranks' files) and a convergence cell's dataset are bound at the same paths, with the site's
    binds, the rank starts in the same working directory, and PYTHONPATH names the package
    inside. Without a container: no options and `argv` as it is. `env` (the ranks'
    environment) gains PYTHONPATH."""
    if not cell.container:
        return [], argv
    c = dict(cell.container)
    engine = ENGINES[c["engine"]]
    root, cwd = str(package_root()), os.getcwd()
    paths = [root, cwd, str(rank_dir.resolve().parent)]
    if cell.data_path:
        paths.append(str(Path(cell.data_path).resolve()))
    binds, problems = needed_binds(paths, c)
    if problems:
        raise ContainerError(
            f"hardware {cell.hardware!r}: the {engine.name} container cannot see what the "
            f"ranks read: {'; '.join(problems)}"
        )
    env["PYTHONPATH"] = root
    prefix = engine.prefix(c["image"], list(binds), cell.device == "cuda", cwd)
    python = c.get("python", "python3")
    return engine.srun_options(c["image"], list(binds), cwd), [*prefix, python, *argv[1:]]


def train_argv(rank_dir: Path, python: str) -> list[str]:
    """The one CLI contract every framework's rank obeys (dlscale.run.train): the cell, serialised
    whole in the rank folder (write_cell_spec), and the folder the rank writes its part file to."""
    return [
        python,
        "-m",
        "dlscale.run.train",
        "--cell",
        str(rank_dir / CELL_SPEC_FILE),
        "--rank-dir",
        str(rank_dir),
    ]


def write_cell_spec(cell: Cell, rank_dir: Path) -> Path:
    """The cell as its ranks read it (dlscale.run.train: Cell.read)."""
    path = rank_dir / CELL_SPEC_FILE
    path.write_text(cell.to_json())
    return path


def local_rank_env(
    rank: int,
    world_size: int,
    ranks_per_node: int,
    port: int,
    threads: int = 1,
    base: Mapping[str, str] = os.environ,
) -> dict:
    """The environment of one rank on the local launcher: `base` (the cell's, run.site_env),
    simulated node rank // ranks_per_node, rendezvous on loopback (what
    dlscale.rank.rank_context.discover reads back)."""
    nodes = world_size // ranks_per_node
    env = dict(
        base,
        DLSCALE_LAUNCHER="local",
        DLSCALE_RANK=str(rank),
        DLSCALE_WORLD_SIZE=str(world_size),
        DLSCALE_LOCAL_RANK=str(rank % ranks_per_node),
        DLSCALE_LOCAL_WORLD_SIZE=str(ranks_per_node),
        DLSCALE_NODE_INDEX=str(rank // ranks_per_node),
        DLSCALE_HOSTS=",".join(["127.0.0.1"] * nodes),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        OMP_NUM_THREADS=str(threads),
        PYTHONUNBUFFERED="1",
    )
    return with_nccl_debug(env)


def local_port(world_size: int, is_free=port_free, draw=None) -> int:
    """Base port of a local cell: a random one of the blocks below the ephemeral range
    with the ports of all its ranks free (every rank runs on this machine). Not a kernel-chosen
    ephemeral port: base + 1 + rank would then lie in the range the kernel hands to other
    programs' connections (a test run of 4 workers met "Could not start gRPC server ...
    0.0.0.0:52734")."""
    import random

    draw = draw or random.randrange
    seeds = (draw(1 << 30) for _ in range(PORT_PROBES))
    return rendezvous_port(seeds, ports_per_host(world_size), "local cell", is_free)


def start_local(
    cell: Cell, argv: list[str], rank_dir: Path, base: Mapping[str, str] = os.environ
) -> list[tuple[int, subprocess.Popen]]:
    """Embedded default: nodes x ranks_per_node processes on this machine, rendezvous on
    loopback; `base`: the ranks' environment before the launcher's variables. A container
    cell's ranks start inside its container (in_container)."""
    port = local_port(cell.world_size)
    base = dict(base)
    _, argv = in_container(cell, argv, rank_dir, base)
    procs = []
    for rank in range(cell.world_size):
        env = local_rank_env(
            rank, cell.world_size, cell.ranks_per_node, port, cell.cpus_per_rank, base
        )
        log = (rank_dir / f"rank{rank}.log").open("w")
        procs.append(
            (
                rank,
                subprocess.Popen(
                    argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
                ),
            )
        )
    return procs


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
) -> list[tuple[int, subprocess.Popen]]:
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


def _stop(procs, grace: float = 10.0) -> None:
    for _, p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGTERM)
    deadline = time.time() + grace
    for _, p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.time()))
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


FIRST_CONTACT_FAILED = (-3, 124)  # wait_all's failure when the first-contact deadline passed
# wait_all's failure when srun reported a rank's failure but could not end the step: a node of
# the step is unreachable (its ranks' ends never reach srun), and srun would wait for it until
# Slurm declares the node down (SlurmdTimeout, minutes) or the job's time limit
STEP_STUCK = (-4, 124)
STEP_END_GRACE_S = 10.0  # from srun's report of a failed rank to the step's end, at most
# what srun prints once a rank failed and it ends the step (srun.log)
_STEP_FAILING = re.compile(
    r"tasks? [\d,-]+: (?:Exited with exit code [1-9]|Killed)|Terminating Step"
)


class StepWatch:
    """srun's own log of the ranks' step (srun.log): once srun reports a failed rank, the step
    must end within STEP_END_GRACE_S (srun stops the other ranks, Slurm's KillWait); a step
    still running then waits on a node srun cannot reach (expired)."""

    def __init__(self, log: Path, grace_s: float | None = None):
        self.log = log
        self.grace_s = STEP_END_GRACE_S if grace_s is None else grace_s
        self.failing_since: float | None = None
        self._checked = 0.0

    def expired(self) -> bool:
        now = time.monotonic()
        if self.failing_since is None and now - self._checked >= 0.5:
            self._checked = now
            try:
                text = self.log.read_text(errors="replace")
            except OSError:
                text = ""
            if _STEP_FAILING.search(text):
                self.failing_since = now
        return self.failing_since is not None and now - self.failing_since > self.grace_s


def _task_ids(spec: str) -> set[int]:
    """srun's task list (`0`, `0-3`, `0,2-3`)."""
    ids: set[int] = set()
    for part in spec.split(","):
        low, _, high = part.partition("-")
        ids.update(range(int(low), int(high or low) + 1))
    return ids


def unreported_nodes(srun_text: str, hosts: list[str], ranks_per_node: int, world: int) -> dict:
    """node -> its ranks whose end srun never reported (srun.log: `n1: task 0: Exited with exit
    code 1`), ranks placed node-major as the launcher places them: the nodes srun could not
    reach."""
    reported: set[int] = set()
    for spec in re.findall(r"tasks? ([\d,-]+):", srun_text):
        reported |= _task_ids(spec)
    nodes: dict[str, list[int]] = {}
    for rank in range(world):
        if rank not in reported and rank // ranks_per_node < len(hosts):
            nodes.setdefault(hosts[rank // ranks_per_node], []).append(rank)
    return nodes


def wait_all(
    procs,
    timeout: float | None = None,
    watch: first_contact.Watch | None = None,
    step: StepWatch | None = None,
) -> tuple[int, int] | None:
    """Wait for every rank; on the first failure stop the rest. Returns (rank, code) of a
    failure. With `timeout` (s; the launcher has none, Slurm's time limit bounds a job) the
    ranks still running then are stopped too, and the first of them is the failure. With
    `watch` (the launcher's), all are stopped when not every rank completed its first step by
    the first-contact deadline: FIRST_CONTACT_FAILED. With `step` (an srun step's), the step is
    stopped when srun reported a failed rank and could not end the step within its grace:
    STEP_STUCK."""
    pending = dict((p.pid, (r, p)) for r, p in procs)
    deadline = None if timeout is None else time.monotonic() + timeout
    while pending:
        if deadline is not None and time.monotonic() > deadline:
            rank, p = next(iter(pending.values()))
            _stop(list(pending.values()))
            return rank, p.returncode
        if watch is not None and watch.expired():
            _stop(list(pending.values()))
            return FIRST_CONTACT_FAILED
        if step is not None and step.expired():
            _stop(list(pending.values()), grace=2.0)
            return STEP_STUCK
        for pid, (rank, p) in list(pending.items()):
            code = p.poll()
            if code is None:
                continue
            del pending[pid]
            if code != 0:
                _stop([rp for rp in pending.values()])
                return rank, code
        time.sleep(0.05)
    return None


def record_slurm_job(output: Path) -> None:
    """slurm_job.json beside the cell's metrics (kept with its measurement): the job measuring
    the cell and what Slurm allocated it (partition, nodes, TRES, GRES per node and GPU indices,
    as `scontrol show job -d` reports them), and the GPUs the job's environment names."""
    if "SLURM_JOB_ID" not in os.environ:
        return
    job = {
        "slurm_job_id": os.environ["SLURM_JOB_ID"],
        "array_job_id": os.environ.get("SLURM_ARRAY_JOB_ID"),
        "array_task_id": os.environ.get("SLURM_ARRAY_TASK_ID"),
        "host": socket.gethostname(),
        "time": time.time(),
        "allocation": job_allocation(os.environ["SLURM_JOB_ID"]),
        # a packed cell (dlscale.workflow.packing): its pack, slot and the nodes of its step
        "pack": {
            "id": os.environ["DLSCALE_PACK"],
            "slot": int(os.environ.get("DLSCALE_PACK_SLOT", 0)),
            "nodes": pack_nodes(),
        }
        if os.environ.get("DLSCALE_PACK")
        else None,
        "gpus": {
            k.lower(): os.environ[k]
            for k in ("SLURM_JOB_GPUS", "SLURM_GPUS_ON_NODE", "CUDA_VISIBLE_DEVICES")
            if k in os.environ
        },
    }
    _write_beside(output, SLURM_JOB_FILE, job)


def _write_beside(output: Path, name: str, record: dict) -> None:
    """A JSON side file in the cell's folder, renamed into place whole."""
    tmp = output.parent / f".{name}.tmp"
    tmp.write_text(json.dumps(record, indent=1, sort_keys=True))
    os.replace(tmp, output.parent / name)


class Terminated(Exception):
    """SIGTERM reached the launcher: Slurm cancelled the job, its time limit passed, or its
    node is going away (Slurm sends SIGTERM, then SIGKILL after KillWait)."""


def _on_sigterm(signum, frame):
    raise Terminated()


def record_failure(
    output: Path,
    rank_dir: Path,
    cell: Cell,
    *,
    reason: str,
    rank: int | None,
    exit_code: int | None,
    suspects: list[int] | None = None,
) -> dict:
    """failure.json beside the cell's (absent) metrics file: what failed, where, the last lines,
    and the diagnosis (dlscale.run.diagnosis) of the failing ranks: the one that failed, else
    `suspects` (the ranks the others waited for), else the first unfinished ones (ranks that
    never wrote rank_end); their log tails are kept."""
    unfinished = []
    for r in range(cell.world_size):
        part = metrics.rank_file(rank_dir, r)
        if not part.exists() or f'"{RANK_END}"' not in part.read_text(errors="replace"):
            unfinished.append(r)
    known = rank is not None and rank >= 0
    failing = [rank] if known else (suspects or unfinished)[:4]
    tails = {str(r): tail_lines(rank_dir / f"rank{r}.log") for r in failing}
    # A rank is blamed only when one failed: the launcher saw it exit, or srun named it below;
    # when the whole job was terminated (rank -2) no rank is at fault.
    record = {
        "status": "failed",
        "reason": reason,
        "rank": rank if known else None,
        "exit_code": exit_code,
        "unfinished_ranks": unfinished,
        "log_tail": tails,
        "time": time.time(),
        "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
        "host": socket.gethostname(),
    }
    if (rank_dir / "srun.log").exists():
        record["srun_tail"] = tail_lines(rank_dir / "srun.log")
        # srun names the first task that failed: "srun: error: n2: task 1: Exited with exit code 3"
        first = re.search(r"task (\d+): Exited with exit code (\d+)", record["srun_tail"])
        if first and not known:
            record["rank"], record["exit_code"] = int(first.group(1)), int(first.group(2))
            failed_log = rank_dir / f"rank{first.group(1)}.log"
            record["log_tail"] = {first.group(1): tail_lines(failed_log)}
    fit = fit_records(
        rank_dir
    )  # out of memory: a result, "does not fit" (dlscale.store.does_not_fit)
    if fit:
        record.update(status=DOES_NOT_FIT, reason=fit_reason(fit), does_not_fit=fit)
    failing = [int(r) for r in record["log_tail"]]
    failing += [r for r in unfinished if r not in failing]  # the peers' view of it too
    record["diagnosis"] = diagnosis(rank_dir, cell, failing, study_dir_of(output))
    _write_beside(output, FAILURE_FILE, record)
    return record


def keep_package_lists(rank_dir: Path, environments: Path) -> None:
    """The nodes' package lists (dlscale.rank.node_probes.PACKAGES_FILE), once per study: a list is
    named by its sha256, so one already kept is the same list."""
    for path in sorted(rank_dir.glob("packages-*.txt")):
        target = environments / path.name.removeprefix("packages-")
        if target.exists():
            continue
        try:
            environments.mkdir(parents=True, exist_ok=True)
            tmp = environments / f".{target.name}.{os.getpid()}.tmp"
            shutil.copyfile(path, tmp)
            os.replace(tmp, target)
        except OSError as exc:  # the hash is in the metrics all the same
            print(f"[dlscale.run.launch] package list not kept: {exc}", file=sys.stderr)


def _run_ranks(
    cell: Cell, argv: list[str], rank_dir: Path, base: Mapping[str, str]
) -> tuple[int, int] | None:
    """Start the cell's ranks (srun or local processes) in environment `base` and wait for all
    of them; a SIGTERM stops them. Returns (rank, exit code) of the failure (wait_all), or
    None. A 1-rank srun cell inside the executor plugin's step (not the project's executor's
    path, dlscale.workflow.jobstep) runs its rank here, with no srun of its own, so the entry's
    srun_options do not apply to it (a pyxis container, which starts only through srun, gets
    its own overlapping step all the same: start_srun)."""
    needs_srun = bool(cell.container) and ENGINES[dict(cell.container)["engine"]].needs_srun
    if (
        cell.launcher == "srun"
        and cell.world_size == 1
        and "SLURM_STEP_ID" in os.environ
        and not needs_srun
    ):
        # A 1-rank cell already runs inside the job step the executor plugin made for it
        # (`srun -n1`): a nested srun would wait for CPUs that step holds. Start the rank here;
        # the entry's srun_options have no srun to go to (the plugin's step is not ours).
        start = start_local
    else:
        start = start_srun if cell.launcher == "srun" else start_local
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    procs = []
    seconds = first_contact.deadline_s(cell)
    watch = first_contact.Watch(rank_dir, cell.world_size, seconds) if seconds else None
    step = StepWatch(rank_dir / "srun.log") if start is start_srun else None
    try:
        procs = start(cell, argv, rank_dir, base)
        failed = wait_all(procs, watch=watch, step=step)
    except ContainerError as exc:
        print(f"[dlscale.run.launch] {exc}", file=sys.stderr)
        (rank_dir / "srun.log").write_text(f"{exc}\n")
        failed = (-1, 1)
    except Terminated:
        _stop(procs, grace=2.0)
        failed = (-2, 143)
    finally:
        signal.signal(signal.SIGTERM, previous)
    return failed


def stuck_step_reason(rank_dir: Path, cell: Cell) -> tuple[str, list[int]]:
    """Why a step that srun could not end failed, naming the nodes srun heard nothing from
    (unreachable: down, cut off or hung) and their ranks; those ranks are the suspects."""
    text = (rank_dir / "srun.log").read_text(errors="replace")
    try:
        hosts = pack_nodes() or allocation_nodes()
    except (OSError, KeyError, subprocess.CalledProcessError):
        hosts = []
    silent = unreported_nodes(text, hosts, cell.ranks_per_node, cell.world_size)
    failed = re.search(r"task (\d+): Exited with exit code (\d+)", text)
    first = (
        f"rank {failed.group(1)} exited with code {failed.group(2)}" if failed else "a rank failed"
    )
    where = "; ".join(f"node {n} (rank(s) {', '.join(map(str, r))})" for n, r in silent.items())
    reason = (
        f"{first}, and srun could not end the step within {STEP_END_GRACE_S:.0f} s: no word "
        f"from {where or 'some of its nodes'}, unreachable from {socket.gethostname()} (its "
        "network or its slurmd down) or hung"
    )
    return reason, [r for ranks in silent.values() for r in ranks]


def _cell_failed(
    output: Path, rank_dir: Path, cell: Cell, failed: tuple[int, int], reason: str | None = None
) -> int:
    """Record and report a failed rank (or srun step, SIGTERM, the first-contact deadline, or
    invalid metrics: `reason`); the cell's log ends with the diagnosis. Returns the cell's exit
    code."""
    rank, code = failed
    suspects = None
    if failed == FIRST_CONTACT_FAILED:
        reason, suspects = first_contact.failure_reason(
            rank_dir, cell.world_size, first_contact.deadline_s(cell)
        )
    elif failed == STEP_STUCK:
        reason, suspects = stuck_step_reason(rank_dir, cell)
    reason = reason or {
        -2: "terminated by SIGTERM (job cancelled, time limit, or node failure)",
        -1: f"srun step exited with code {code}",
    }.get(rank, f"rank {rank} exited with code {code}")
    rec = record_failure(
        output, rank_dir, cell, reason=reason, rank=rank, exit_code=code, suspects=suspects
    )
    print(
        f"[dlscale.run.launch] cell FAILED: {reason}; unfinished ranks {rec['unfinished_ranks']}"
        f"\n{render(rec['diagnosis'])}",
        file=sys.stderr,
    )
    return code or 1


def run_cell(
    cell: Cell, output: Path, *, git_commit: str | None, python: str = sys.executable
) -> int:
    launcher = cell.launcher
    rank_dir = output.parent / RANK_DIR
    shutil.rmtree(rank_dir, ignore_errors=True)
    rank_dir.mkdir(parents=True)
    (output.parent / FAILURE_FILE).unlink(missing_ok=True)
    record_slurm_job(output)
    write_cell_spec(cell, rank_dir)
    try:  # the hardware entry's modules and env (dlscale.run.site_env), once for all ranks
        site = job_environment(cell.modules, dict(cell.env))
    except SiteEnvError as exc:
        record_failure(output, rank_dir, cell, reason=str(exc), rank=None, exit_code=None)
        print(f"[dlscale.run.launch] cell FAILED: {exc}", file=sys.stderr)
        return 1
    if cell.modules or cell.env:  # what each rank records (dlscale.rank.provenance)
        (rank_dir / SITE_ENV_FILE).write_text(json.dumps(site.record()))
        print(
            f"[dlscale.run.launch] modules {list(cell.modules)} ({site.module_init}), env "
            f"{list(site.env)}",
            file=sys.stderr,
        )
    if cell.workload == "script":  # a user's training script (dlscale.run.script_cell)
        from dlscale.run.script_cell import run_script

        return run_script(
            cell,
            output,
            rank_dir,
            site.environment,
            git_commit=git_commit,
            python=python,
            launch=sys.modules[__name__],  # its ranks start and fail as every cell's
        )
    argv = train_argv(rank_dir, python)
    print(
        f"[dlscale.run.launch] {launcher}: {cell.nodes} node(s) x {cell.ranks_per_node} "
        f"rank(s): {' '.join(argv)}",
        file=sys.stderr,
        flush=True,
    )
    started = time.time()
    failed = _run_ranks(cell, argv, rank_dir, site.environment)
    wall = time.time() - started
    for log in sorted(rank_dir.glob("*.log")):
        print(f"----- {log.name} -----\n{log.read_text(errors='replace')}", file=sys.stderr)
    if failed is not None:
        return _cell_failed(output, rank_dir, cell, failed)
    try:
        rank_records = metrics.read_rank_files(rank_dir, cell.world_size)
        records = metrics.assemble(
            cell=cell,
            git_commit=git_commit,
            slurm_job_id=os.environ.get("SLURM_JOB_ID"),
            rank_records=rank_records,
            wall_seconds=wall,
            started=started,
        )
        folder = keep_measurement(
            output,
            records,
            metrics.write_atomic,
            slurm_job_id=os.environ.get("SLURM_JOB_ID"),
            extra_files=[*sorted(rank_dir.glob("*.log")), output.parent / SLURM_JOB_FILE],
        )
    except metrics.MetricsError as exc:
        return _cell_failed(output, rank_dir, cell, (None, None), f"invalid metrics: {exc}")
    study_dir = study_dir_of(output)  # a metrics file outside a study keeps them beside it
    keep_package_lists(rank_dir, (study_dir or output.parent) / ENVIRONMENTS_DIR)
    shutil.rmtree(rank_dir, ignore_errors=True)
    summary = records[-1]["value"]
    print(
        f"[dlscale.run.launch] ok: {summary['throughput_samples_per_s']:.1f} samples/s over "
        f"{summary['world_size']} rank(s) on {summary['nodes_seen']} in {wall:.1f} s; kept in "
        f"{folder}",
        file=sys.stderr,
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="dlscale-launch", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--cell-json", required=True, help="the cell (dlscale.study.cell.Cell.to_json)"
    )
    parser.add_argument("--output", required=True, type=Path, help="the cell's metrics.jsonl")
    # not a workflow param: a new commit must not make every cell rerun
    parser.add_argument(
        "--git-commit",
        default=None,
        help="the commit of the code that runs (default: that of the project this dlscale "
        "package is part of, or 'not a git checkout' with a hash of the workflow sources)",
    )
    parser.add_argument(
        "--python", default=sys.executable, help="interpreter of the cell's framework environment"
    )
    args = parser.parse_args(argv)
    try:
        cell = Cell.from_json(args.cell_json)
    except (ValueError, TypeError) as exc:
        parser.error(f"--cell-json: {exc}")
    commit = args.git_commit or git_commit()
    return run_cell(cell, args.output, git_commit=commit, python=args.python)


if __name__ == "__main__":
    sys.exit(main())

"""Inside a rank: who this rank is (RankContext), read from the launcher's environment by
`discover()`: dlscale's local launcher (DLSCALE_*), srun (SLURM_*) or torchrun. The other half
of dlscale.run.launch, which starts the ranks and sets that environment."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass


def _env_int(*names: str) -> int | None:
    for name in names:
        if os.environ.get(name, "").strip():
            return int(os.environ[name])
    return None


@dataclass(frozen=True)
class RankContext:
    """Who this rank is, discovered from the launcher's environment
    (dlscale.rank.rank_context.discover)."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_index: int
    node: str
    master_addr: str
    master_port: int
    launcher: str
    hosts: tuple[str, ...] = ()  # address of each node, in node order (rank r is on node r // R)

    def rank_address(self, rank: int, base_port: int) -> str:
        """host:port of a rank for frameworks that need every peer's address (TF_CONFIG):
        ranks are placed node-major, so rank r sits on node r // ranks_per_node; the port is
        base_port + rank, unique even when simulated nodes share one host."""
        return f"{self.hosts[rank // self.local_world_size]}:{base_port + rank}"


def discover() -> RankContext:
    """Rank and world from the environment: DLSCALE_* (local launcher), SLURM_* (srun), torchrun."""
    env = os.environ
    if "DLSCALE_RANK" in env:
        launcher = env.get("DLSCALE_LAUNCHER", "local")
        rank, world = int(env["DLSCALE_RANK"]), int(env["DLSCALE_WORLD_SIZE"])
        local_rank = int(env["DLSCALE_LOCAL_RANK"])
        local_world = int(env["DLSCALE_LOCAL_WORLD_SIZE"])
        node_index = int(env["DLSCALE_NODE_INDEX"])
    elif "SLURM_PROCID" in env:
        launcher = "srun"
        rank, world = int(env["SLURM_PROCID"]), int(env["SLURM_NTASKS"])
        local_rank = int(env["SLURM_LOCALID"])
        # SLURM_TASKS_PER_NODE looks like "2(x3),1"; the per-node count of this node is what matters
        local_world = _env_int("SLURM_NTASKS_PER_NODE") or _tasks_on_this_node(env)
        node_index = int(env["SLURM_NODEID"])
    elif "RANK" in env and "WORLD_SIZE" in env:
        launcher = "torchrun"
        rank, world = int(env["RANK"]), int(env["WORLD_SIZE"])
        local_rank = _env_int("LOCAL_RANK") or 0
        local_world = _env_int("LOCAL_WORLD_SIZE") or 1
        node_index = _env_int("GROUP_RANK", "NODE_RANK") or 0
    else:
        launcher, rank, world, local_rank, local_world, node_index = "none", 0, 1, 0, 1, 0
    master_addr = env.get("MASTER_ADDR", "127.0.0.1")
    hosts = tuple(h for h in env.get("DLSCALE_HOSTS", "").split(",") if h) or (master_addr,)
    return RankContext(
        rank=rank,
        world_size=world,
        local_rank=local_rank,
        local_world_size=local_world,
        node_index=node_index,
        node=socket.gethostname(),
        master_addr=master_addr,
        master_port=int(env.get("MASTER_PORT", "29500")),
        launcher=launcher,
        hosts=hosts,
    )


def _tasks_on_this_node(env) -> int:
    spec = env.get("SLURM_TASKS_PER_NODE", "1")
    node = int(env.get("SLURM_NODEID", "0"))
    counts = []
    for part in spec.split(","):
        if "(x" in part:
            n, rep = part.rstrip(")").split("(x")
            counts += [int(n)] * int(rep)
        else:
            counts.append(int(part))
    return counts[node] if node < len(counts) else counts[-1]

"""The `local` launcher: nodes x ranks_per_node processes on this machine, one simulated node per
group of ranks, rendezvous on loopback (the embedded default; its record:
dlscale.registry.launchers)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping
from pathlib import Path

from dlscale.run.diagnosis import with_nccl_debug
from dlscale.run.launchers.launcher_base import Launcher, Ranks, in_container, register
from dlscale.run.launchers.ports import local_port
from dlscale.study.cell import Cell


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
        DLSCALE_LAUNCHER=LocalLauncher.name,
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


def start_local(
    cell: Cell, argv: list[str], rank_dir: Path, base: Mapping[str, str] = os.environ
) -> Ranks:
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


@register
class LocalLauncher(Launcher):
    name = "local"

    def start(
        self, cell: Cell, argv: list[str], rank_dir: Path, base: Mapping[str, str] = os.environ
    ) -> Ranks:
        return start_local(cell, argv, rank_dir, base)

"""The rendezvous port of a cell's ranks, one chooser for both launchers: a block of ports below
the kernel's ephemeral range, seeded by the Slurm job id (dlscale.run.launchers.srun) or drawn at
random (dlscale.run.launchers.local), whose ports are all free on the host where rank 0
listens."""

from __future__ import annotations

import itertools
import socket
from pathlib import Path

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
    chooser of both launchers (dlscale.run.launchers.srun.choose_slurm_port, local_port)."""
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

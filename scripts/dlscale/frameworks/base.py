"""The adapter contract and the one timing loop every framework shares.

Timing method (the same for every framework, recorded in each metrics file):
  - `warmup_steps` untimed steps, then a device synchronisation and a barrier over all ranks;
  - an idle probe: for IDLE_PROBE_SECONDS every rank waits and samples what else keeps its host
    busy (dlscale.provenance.host_activity); more than COMPETING_BUSY_CPUS busy CPUs flags the
    cell as measured under competition; then a second barrier;
  - each of `steps` timed steps is bracketed by time.perf_counter() after a device
    synchronisation (`Adapter.sync`), so queued device work is inside the step it belongs to;
  - a rank's throughput = per_rank_batch * steps / sum(step times); the cell's throughput is the
    sum over ranks (dlscale.metrics.summarize), never rank 0 x world size.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from ..provenance import gpu_activity, host_activity

TIMER = "time.perf_counter"
IDLE_PROBE_SECONDS = 0.5
COMPETING_BUSY_CPUS = 0.5


@dataclass(frozen=True)
class TrainSpec:
    """What one rank trains. Frozen and explicit: an unknown argument is a TypeError."""
    framework: str
    model: str
    per_rank_batch: int
    warmup_steps: int
    steps: int
    precision: str
    device: str
    threads: int
    seed: int = 0


@dataclass(frozen=True)
class RankContext:
    """Who this rank is, discovered from the launcher's environment (dlscale.launch.discover)."""
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_index: int
    node: str
    master_addr: str
    master_port: int
    launcher: str
    hosts: tuple[str, ...] = ()    # address of each node, in node order (rank r is on node r // R)

    def rank_address(self, rank: int, base_port: int) -> str:
        """host:port of a rank for frameworks that need every peer's address (TF_CONFIG):
        ranks are placed node-major, so rank r sits on node r // ranks_per_node; the port is
        base_port + rank, unique even when simulated nodes share one host."""
        return f"{self.hosts[rank // self.local_world_size]}:{base_port + rank}"


class Adapter:
    """One framework's data-parallel training step. Subclasses implement every method."""

    name: str = ""
    sync_method: str = "none"

    def __init__(self, spec: TrainSpec, ctx: RankContext):
        if not isinstance(spec, TrainSpec) or not isinstance(ctx, RankContext):
            raise TypeError("Adapter(spec: TrainSpec, ctx: RankContext)")
        self.spec, self.ctx = spec, ctx

    def setup(self) -> None:          # init the process group, build model, optimizer, data
        raise NotImplementedError

    def step(self) -> None:           # one forward + backward + gradient allreduce + update
        raise NotImplementedError

    def sync(self) -> None:           # wait for queued device work
        raise NotImplementedError

    def barrier(self) -> None:        # all ranks meet
        raise NotImplementedError

    def teardown(self) -> None:
        raise NotImplementedError

    def describe(self) -> dict:
        """Library versions, device model, data layout, input shape, parameter count."""
        raise NotImplementedError


def run_timed(adapter: Adapter, before_step=None) -> tuple[list[float], dict]:
    """Warm up, probe the host while idle, then time each step with device synchronisation.
    Returns per-step seconds and the probe. `before_step(i)`, if given, runs before every step
    outside the timer (fault injection)."""
    spec = adapter.spec
    for i in range(spec.warmup_steps):
        if before_step:
            before_step(i)
        adapter.step()
    adapter.sync()
    adapter.barrier()
    probe = host_activity(IDLE_PROBE_SECONDS)
    if adapter.spec.device == "cuda":
        probe["gpus"] = gpu_activity()
    probe["competing"] = (probe["busy_cpus"] or 0.0) > COMPETING_BUSY_CPUS
    adapter.barrier()
    times = []
    for i in range(spec.warmup_steps, spec.warmup_steps + spec.steps):
        if before_step:
            before_step(i)
        t0 = time.perf_counter()
        adapter.step()
        adapter.sync()
        times.append(time.perf_counter() - t0)
    adapter.barrier()
    return times, probe

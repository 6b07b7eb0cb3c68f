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

from ..energy import EnergyMeter
from ..provenance import gpu_activity, host_activity

TIMER = "time.perf_counter"
IDLE_PROBE_SECONDS = 0.5
COMPETING_BUSY_CPUS = 0.5
BREAKDOWN_STEPS = 10                        # compute-only steps after the timed window
ALLREDUCE_BYTES = (1 << 20, 16 << 20)       # probe message sizes (float32 buffers)
ALLREDUCE_REPEATS = 5                       # timed repeats per size, after one warm-up


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

    # Optional: where a framework exposes them, the breakdown and the bandwidth probe.
    breakdown_method: str = ""

    def step_without_allreduce(self) -> None:
        """The same step with the gradient allreduce skipped (compute only)."""
        raise NotImplementedError

    def allreduce(self, numel: int) -> None:
        """Blocking allreduce (sum) of a float32 buffer of `numel` elements over all ranks."""
        raise NotImplementedError

    def peak_device_memory_mb(self) -> float | None:
        return None


def run_timed(adapter: Adapter, before_step=None) -> dict:
    """Warm up, probe the host while idle, time each step with device synchronisation, then
    (outside the timed window) a compute-only breakdown and an allreduce bandwidth probe.
    `before_step(i)`, if given, runs before every step outside the timer (fault injection).
    Returns {"step_seconds", "idle_probe", "energy", "breakdown", "allreduce"}."""
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
    meter = EnergyMeter(spec.device, adapter.ctx.local_rank)
    adapter.barrier()
    times = []
    meter.start()
    for i in range(spec.warmup_steps, spec.warmup_steps + spec.steps):
        if before_step:
            before_step(i)
        t0 = time.perf_counter()
        adapter.step()
        adapter.sync()
        times.append(time.perf_counter() - t0)
    energy = meter.stop(samples=spec.per_rank_batch * spec.steps)
    adapter.barrier()
    return {"step_seconds": times, "idle_probe": probe, "energy": energy,
            "breakdown": _breakdown(adapter), "allreduce": _allreduce_probe(adapter)}


def _breakdown(adapter: Adapter) -> dict:
    """Compute-only step times (allreduce skipped); communication = step - compute."""
    compute = []
    try:
        adapter.step_without_allreduce()      # untimed: graph frameworks build it on first call
        adapter.sync()
        for _ in range(min(adapter.spec.steps, BREAKDOWN_STEPS)):
            t0 = time.perf_counter()
            adapter.step_without_allreduce()
            adapter.sync()
            compute.append(time.perf_counter() - t0)
    except NotImplementedError:
        return {"available": False, "reason": f"{adapter.name}: no compute-only step"}
    adapter.barrier()
    return {"available": True, "method": adapter.breakdown_method, "compute_seconds": compute}


def _allreduce_probe(adapter: Adapter) -> dict:
    """Median time of an allreduce per message size, in the cell's own process group."""
    if adapter.ctx.world_size == 1:
        return {"available": False, "reason": "a single rank has no peer to reduce with"}
    results = []
    try:
        for nbytes in ALLREDUCE_BYTES:
            numel = nbytes // 4
            adapter.allreduce(numel)                      # warm-up
            samples = []
            for _ in range(ALLREDUCE_REPEATS):
                adapter.barrier()
                t0 = time.perf_counter()
                adapter.allreduce(numel)
                samples.append(time.perf_counter() - t0)
            results.append({"bytes": nbytes, "seconds": samples})
    except NotImplementedError:
        return {"available": False, "reason": f"{adapter.name}: no allreduce probe"}
    return {"available": True, "sizes": results, "repeats": ALLREDUCE_REPEATS}

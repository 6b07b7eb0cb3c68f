"""The one timing loop every framework shares (run_timed), its probes and the sync audit.

Timing method (the same for every framework, recorded in each metrics file):
  - `warmup_steps` untimed steps, then a device synchronisation and a barrier over all ranks;
  - an idle probe: for IDLE_PROBE_SECONDS every rank waits and samples what else keeps its host
    busy (dlscale.rank.provenance.host_activity); more than COMPETING_BUSY_CPUS busy CPUs flags the
    cell as measured under competition; then a second barrier;
  - REWARM_STEPS untimed re-warm steps (more where Adapter.steps_before_window asks), so the
    window does not start on a device that idled through the probe;
  - the device's peak memory statistics are reset right before the window and read right after
    it (Adapter.reset_peak_memory, read_peak_memory): the peak of the training steps alone;
  - the window is wall clock between two device synchronisations; each of its `steps` steps is
    timed by the adapter's step timer (StepTimer: time.perf_counter() and a synchronisation per
    step; CUDA events with no host synchronisation inside the window where the framework has
    them), and so are the breakdown's compute-only steps (one clock for both);
  - the first warm-up step runs under its own deadline (spec.first_step_timeout_s, at least
    COLLECTIVE_TIMEOUT_S): compilation on ranks that compile at different speeds;
  - a rank's throughput = per_rank_batch * steps / sum(step times); the cell's throughput is the
    sum over ranks (dlscale.store.metrics_summary.summarize), never rank 0 x world size.
The method's constants (TIMER, IDLE_PROBE_SECONDS, ...) are defined in dlscale.study.protocol,
the collective timeout (COLLECTIVE_TIMEOUT_S) here; the adapter contract it drives (and
StepTimer) in dlscale.frameworks.base, a floor above that this module never imports (an adapter
calls down into the rank's floor, nothing calls back up). Outside the window: the compute-only
breakdown and the allreduce bandwidth probe, where the adapter declares them, and SyncAudit,
which counts host synchronisations inside and outside the window (tests).
"""

from __future__ import annotations

import contextlib
import os
import time

from dlscale.rank.energy import EnergyMeter
from dlscale.rank.provenance import gpu_activity, host_activity
from dlscale.rank.telemetry import Telemetry
from dlscale.study.protocol import (
    ALLREDUCE_BYTES,
    ALLREDUCE_REPEATS,
    BREAKDOWN_STEPS,
    COMPETING_BUSY_CPUS,
    IDLE_PROBE_SECONDS,
    REWARM_STEPS,
)

# Bounded collectives, the same bound in every framework: read once, here. A collective (or a
# blocking call that waits for the peers) that has not finished after this many seconds fails
# the rank, so a dead or stuck peer fails the cell instead of hanging it.
COLLECTIVE_TIMEOUT_ENV = "DLSCALE_COLLECTIVE_TIMEOUT_S"
COLLECTIVE_TIMEOUT_S = int(os.environ.get(COLLECTIVE_TIMEOUT_ENV, "300"))

SYNC_AUDIT_ENV = "DLSCALE_SYNC_AUDIT"  # "1": a rank counts its host synchronisations (tests)
ADAPTER_SYNC_HOOKS = ("sync", "barrier", "to_host", "allreduce_sum", "allreduce_max")


class SyncAudit:
    """Counts a rank's host synchronisations inside and outside the timed window: calls of the
    adapter's own hooks (ADAPTER_SYNC_HOOKS) and of the framework's calls that wait for the
    device (Adapter.host_sync_points), each wrapped in place while the audit is installed. For
    tests (DLSCALE_SYNC_AUDIT=1 makes dlscale.run.train install one): the wrappers cost a Python
    call each, so no measurement runs with them."""

    def __init__(self, adapter):
        self.adapter = adapter
        self.inside: dict[str, int] = {}
        self.outside: dict[str, int] = {}
        self.facts: dict[str, dict] = {}
        self.active = False
        self._restore: list[tuple[object, str, object, bool]] = []
        for name in ADAPTER_SYNC_HOOKS:
            self._wrap(adapter, name, f"adapter.{name}")
        for owner, name in adapter.host_sync_points():
            label = f"{getattr(owner, '__name__', type(owner).__name__)}.{name}"
            self._wrap(owner, name, label)

    def _wrap(self, owner, name: str, label: str) -> None:
        original = getattr(owner, name, None)
        if original is None:
            return
        own = name in vars(owner) if hasattr(owner, "__dict__") else False
        audit = self

        def counted(*args, **kwargs):
            counts = audit.inside if audit.active else audit.outside
            counts[label] = counts.get(label, 0) + 1
            return original(*args, **kwargs)

        self._restore.append((owner, name, vars(owner).get(name) if own else None, own))
        setattr(owner, name, counted)

    @contextlib.contextmanager
    def window(self):
        """The timed window: calls inside count as `inside`."""
        self.facts["open"] = self.adapter.window_facts()
        self.active = True
        try:
            yield
        finally:
            self.active = False
            self.facts["close"] = self.adapter.window_facts()

    def uninstall(self) -> None:
        for owner, name, original, own in reversed(self._restore):
            if own:
                setattr(owner, name, original)
            else:
                delattr(owner, name)
        self._restore.clear()

    def record(self) -> dict:
        return {
            "inside_window": dict(self.inside),
            "outside_window": dict(self.outside),
            "window_facts": dict(self.facts),
        }


def run_timed(adapter, before_step=None, audit: SyncAudit | None = None) -> dict:
    """Warm up (the first step timed on its own, under its own, longer deadline: compilation,
    tracing, autotuning), probe the host while idle, re-warm, run the timed window, then
    (outside it) a compute-only breakdown and an allreduce bandwidth probe. The window is timed
    by wall clock between two device synchronisations (throughput = samples / window); per-step
    times come from the adapter's step timer (StepTimer, or device events), and so do the
    breakdown's compute-only steps. `before_step(i)`, if given, runs before every warm-up and
    timed step (fault injection); `audit` counts host synchronisations in the window (tests).
    Returns {"step_seconds", "window_seconds", "first_step_seconds", "warmup_seconds", "timer",
    "rewarm_steps", "first_step_deadline", "idle_probe", "energy", "telemetry"
    (dlscale.rank.telemetry),
    "breakdown", "allreduce", "after_window" (the adapter's own, outside the window), "phases"
    (seconds of each part)} and "sync_audit" where audited."""
    spec = adapter.spec
    first_step_s = max(COLLECTIVE_TIMEOUT_S, spec.first_step_timeout_s)
    phases, clock = {}, [time.perf_counter()]

    def phase(name: str) -> None:  # seconds since the previous phase ended
        now = time.perf_counter()
        phases[name] = round(now - clock[0], 4)
        clock[0] = now

    warmup = _warm_up(adapter, first_step_s, before_step)
    adapter.barrier()
    phase("warmup")
    probe = _idle_probe(adapter)
    meter = EnergyMeter(spec.device, adapter.gpu)
    telemetry = Telemetry(spec.device, adapter.gpu)
    adapter.barrier()
    # re-warm: the device idled through the probe; untimed steps right before the window
    rewarm = max(REWARM_STEPS, adapter.steps_before_window() - spec.warmup_steps)
    phase("idle_probe")
    for _ in range(rewarm):
        adapter.step()
    phase("rewarm")
    timer = adapter.step_timer()
    # the window opens at a device synchronisation: the re-warm steps still queued on the device
    # finish before it, so neither the window's time nor its energy and telemetry count them;
    # the peak memory statistics restart there, so the peak read after it is the steps'
    adapter.sync()
    adapter.reset_peak_memory()
    meter.start()
    telemetry.start()  # sampled by a background thread, off the step's path
    window_start = time.perf_counter()
    with audit.window() if audit else contextlib.nullcontext():
        for i in range(spec.warmup_steps, spec.warmup_steps + spec.steps):
            if before_step:
                before_step(i)
            timer.start()
            adapter.step()
            timer.stop()
    adapter.sync()
    window = time.perf_counter() - window_start
    adapter.read_peak_memory()  # before the breakdown and the probe allocate anything
    energy = meter.stop(samples=spec.per_rank_batch * spec.steps)
    telemetry_record = telemetry.stop()
    times = timer.step_seconds()
    adapter.barrier()
    phase("timed_window")  # with the energy meter's and telemetry's reads at its ends
    run = {
        "step_seconds": times,
        "window_seconds": window,
        "first_step_seconds": warmup[0] if warmup else None,
        "warmup_seconds": warmup,
        "timer": timer.method,
        "rewarm_steps": rewarm,
        "first_step_deadline": _first_step_deadline(adapter, first_step_s),
        "idle_probe": probe,
        "energy": energy,
        "telemetry": telemetry_record,
        "breakdown": _breakdown(adapter, times),
    }
    phase("breakdown")
    run["allreduce"] = _allreduce_probe(adapter)
    phase("allreduce_probe")
    # the adapter's own measurements after the window (the attention kernel, a trace)
    run["after_window"] = adapter.after_window() if hasattr(adapter, "after_window") else {}
    if run["after_window"]:
        phase("after_window")
    run["phases"] = phases
    if audit:
        run["sync_audit"] = audit.record()
    return run


def _warm_up(adapter, first_step_s: float, before_step) -> list[float]:
    """The untimed warm-up steps, each with its device synchronisation; the first runs under
    its own deadline (`first_step_s`). Returns each step's seconds."""
    warmup = []
    for i in range(adapter.spec.warmup_steps):
        deadline = adapter.first_step_deadline(first_step_s) if i == 0 else None
        with deadline or contextlib.nullcontext():
            if before_step:
                before_step(i)
            t0 = time.perf_counter()
            adapter.step()
            adapter.sync()
            warmup.append(time.perf_counter() - t0)
    return warmup


def _idle_probe(adapter) -> dict:
    """What else keeps the host (and, on a GPU, the GPUs) busy while this rank idles, and
    whether that counts as competition (more than COMPETING_BUSY_CPUS busy CPUs)."""
    probe = host_activity(IDLE_PROBE_SECONDS)
    if adapter.spec.device == "cuda":
        probe["gpus"] = gpu_activity()
    probe["competing"] = (probe["busy_cpus"] or 0.0) > COMPETING_BUSY_CPUS
    return probe


def _first_step_deadline(adapter, first_step_s: float) -> dict:
    """The first warm-up step's deadline as recorded: its seconds and what enforces it."""
    return {
        "seconds": first_step_s if adapter.spec.warmup_steps else None,
        "method": "none needed: a single rank waits for no peer"
        if adapter.ctx.world_size == 1
        else adapter.first_step_deadline_method
        or "none: this framework's collectives keep their one timeout",
    }


SINGLE_RANK_BREAKDOWN = (
    "world size 1: the step has no gradient allreduce (no data-parallel wrapper), so "
    "communication is zero by construction; compute = the timed steps"
)


def _breakdown(adapter, step_seconds: list[float]) -> dict:
    """Compute-only step times (allreduce skipped); communication = step - compute. At world
    size 1 there is nothing to skip: compute is the timed step itself (communication 0)."""
    if adapter.ctx.world_size == 1:
        return {
            "available": True,
            "method": SINGLE_RANK_BREAKDOWN,
            "compute_seconds": list(step_seconds),
            "single_rank": True,
        }
    if not adapter.has_breakdown(adapter.spec):
        return {"available": False, "reason": f"{adapter.name}: no compute-only step"}
    adapter.step_without_allreduce()  # untimed: graph frameworks build it on first call
    adapter.sync()
    # one clock: the compute-only steps are timed by the same step timer as the timed steps
    timer = adapter.step_timer()
    for _ in range(min(adapter.spec.steps, BREAKDOWN_STEPS)):
        timer.start()
        adapter.step_without_allreduce()
        timer.stop()
    adapter.sync()
    compute = timer.step_seconds()
    adapter.barrier()
    return {
        "available": True,
        "method": adapter.breakdown_method,
        "timer": timer.method,
        "compute_seconds": compute,
    }


def _allreduce_probe(adapter) -> dict:
    """Median time of an allreduce per message size, in the cell's own process group."""
    if adapter.ctx.world_size == 1:
        return {"available": False, "reason": "a single rank has no peer to reduce with"}
    if not adapter.has_allreduce_probe:
        return {"available": False, "reason": f"{adapter.name}: no allreduce probe"}
    results = []
    for nbytes in ALLREDUCE_BYTES:
        numel = nbytes // 4
        adapter.allreduce(numel)  # warm-up
        samples = []
        for _ in range(ALLREDUCE_REPEATS):
            adapter.barrier()
            t0 = time.perf_counter()
            adapter.allreduce(numel)
            samples.append(time.perf_counter() - t0)
        results.append({"bytes": nbytes, "seconds": samples})
    return {"available": True, "sizes": results, "repeats": ALLREDUCE_REPEATS}

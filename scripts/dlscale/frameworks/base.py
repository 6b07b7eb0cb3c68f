"""The adapter contract every framework implements, and the kit every adapter shares.

The shared timing loop that drives an adapter (run_timed), its probes and the sync audit live in
dlscale.rank.timing; the step timers an adapter hands it (StepTimer, HostTimer) live here.

The adapter kit: what every framework needs besides its own step lives here, so that a framework
module holds only what differs:
  - TrainSpec, the rank-side subset of a cell, optimizer settings included, that an adapter is
    made with (dlscale.frameworks.train_spec);
  - the precision check: each adapter maps precision -> its dtype or policy (Adapter.precisions)
    and names the precisions it runs on GPU only (Adapter.cuda_only) or only on CPUs with
    given features (Adapter.cpu_needs); anything else is refused when the adapter is made,
    naming the allowed values;
  - seeding: Adapter.seed() seeds the framework (seed_framework) with spec.seed + rank;
  - the collective timeout COLLECTIVE_TIMEOUT_S, read once from DLSCALE_COLLECTIVE_TIMEOUT_S, and
    a Watchdog for frameworks whose collectives can wait forever;
  - declared capabilities (has_breakdown, has_allreduce_probe, can_compile), which run_timed
    reads before it measures: a missing one is an "available": False record with its reason.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time

from dlscale.frameworks.train_spec import TrainSpec
from dlscale.rank.devices import gpu_identity, pick_gpu
from dlscale.rank.rank_context import RankContext
from dlscale.rank.timing import COLLECTIVE_TIMEOUT_ENV, COLLECTIVE_TIMEOUT_S
from dlscale.registry import frameworks
from dlscale.registry.optimizers import DEFAULT_OPTIMIZER
from dlscale.registry.strategies import DEFAULT_STRATEGY
from dlscale.study.protocol import TIMER

WATCHDOG_EXIT_CODE = 124  # a rank ended by its watchdog (as timeout(1) exits)

DEVICE_NAMES = {"cpu": "CPU", "cuda": "GPU"}


class _FromRecord:
    """A class attribute read from the adapter's framework record (by its `name`), so an adapter
    never restates a fact of dlscale.registry.frameworks. An adapter with no record (a test's)
    gets `default`."""

    def __init__(self, fact: str, default):
        self.fact, self.default = fact, default

    def __get__(self, _obj, cls):
        record = frameworks.FRAMEWORKS.get(cls.name)
        return self.default if record is None else getattr(record, self.fact)


def peak_rss_mb() -> float:
    """This process's peak resident set (VmHWM) in MiB (getrusage where /proc is missing)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def cpu_flags(path: str = "/proc/cpuinfo") -> set[str]:
    """The CPU's feature flags (Linux /proc/cpuinfo; empty where it cannot be read)."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


class Adapter:
    """One framework's data-parallel training step. What every framework shares lives here
    (checking the precision, seeding, the collective timeout, the watchdog, the timing loop);
    a subclass implements the contract's methods and declares its capabilities."""

    name: str = ""
    title: str = ""  # the framework as refusals name it ("TensorFlow")
    sync_method: str = "none"
    # The physical GPU this rank uses (dlscale.rank.devices.gpu_identity; None on a CPU): recorded
    # in rank_start, read by the energy meter, checked across ranks (two ranks on one board
    # are flagged in the cell's summary).
    gpu: dict | None = None

    # Precision: precision -> this framework's dtype or mixed-precision policy for it (None:
    # plain fp32). A precision missing here is refused; so is one named in `cuda_only` (with
    # the reason) on a CPU. Checked once, when the adapter is made (check_precision).
    precisions: dict[str, object] = {}
    cuda_only: dict[str, str] = {}
    # precision -> (the CPU flags it needs on a CPU, why): refused on a CPU without them
    cpu_needs: dict[str, tuple[tuple[str, ...], str]] = {}

    # Capabilities, declared: run_timed reads them before it measures (nothing is found out by
    # calling a method and catching NotImplementedError).
    breakdown_method: str = ""  # how step_without_allreduce skips the allreduce ("": none)
    has_allreduce_probe: bool = False  # allreduce(numel) is implemented
    # How mode "compiled" compiles the step ("": this framework has no compiled mode, and a
    # compiled cell is refused when the adapter is made).
    compile_method: str = ""
    # How the convergence workload trains on real data to a target accuracy ("": not supported,
    # and a convergence cell is refused when the adapter is made; the workflow refuses it before
    # any job from the framework's registry record, dlscale.registry.frameworks.FRAMEWORKS,
    # which states the same). Where it is declared, the adapter implements the convergence
    # contract below (data_loaders ... allreduce_sum).
    convergence_method: str = ""
    # How the ranks may share the model: the framework record's `strategies`
    # (dlscale.registry.frameworks), read by name; the workflow refuses the others before any
    # job from the same record.
    strategies = _FromRecord("strategies", default=(DEFAULT_STRATEGY,))
    # The optimizers its adapter builds: the record's `optimizers` (dlscale.registry.optimizers).
    optimizers = _FromRecord("optimizers", default=(DEFAULT_OPTIMIZER,))

    def __init__(self, spec: TrainSpec, ctx: RankContext):
        if not isinstance(spec, TrainSpec) or not isinstance(ctx, RankContext):
            raise TypeError("Adapter(spec: TrainSpec, ctx: RankContext)")
        self.spec, self.ctx = spec, ctx
        self.check_precision()
        self.check_mode()
        self.check_workload()
        self.check_parallelism()
        self.check_optimizer()

    # ------------------------------------------------------------------ shared by every framework
    def choose_gpu(self, device_count: int, identify=None) -> int:
        """This rank's device ordinal among the `device_count` GPUs its framework sees
        (dlscale.rank.devices.pick_gpu: the local rank when all of the node's GPUs are visible,
        device 0 when exactly one is, an error naming the binding otherwise); records the
        physical board in `self.gpu`. `identify(ordinal)` returns what the framework knows of
        the board ({"uuid", "pci_bus_id", "name"}, any of them)."""
        ordinal = pick_gpu(self.ctx.local_rank, self.ctx.local_world_size, device_count)
        known = {}
        if identify is not None:
            try:
                known = {k: v for k, v in identify(ordinal).items() if v}
            except Exception as exc:  # noqa: BLE001 (identity is provenance, not a failure)
                known = {"name": f"unknown ({exc!r})"}
        self.gpu = gpu_identity(ordinal, **known)
        return ordinal

    def check_precision(self) -> None:
        """Refuse a precision this framework does not run, or not on this device, naming the
        precisions it does run there."""
        spec = self.spec
        device = DEVICE_NAMES.get(spec.device, spec.device)
        missing = {} if spec.device == "cuda" else self.missing_cpu_flags()
        allowed = [
            p
            for p in self.precisions
            if spec.device == "cuda" or (p not in self.cuda_only and p not in missing)
        ]
        if spec.precision in allowed:
            return
        if spec.precision in missing:
            reason = f" ({missing[spec.precision]})"
        elif spec.precision in self.precisions:
            reason = f" ({self.cuda_only[spec.precision]})"
        else:
            reason = ""
        raise ValueError(
            f"precision {spec.precision} is not supported by "
            f"{self.title or self.name} on {device}{reason}; use one of: "
            f"{', '.join(allowed)}"
        )

    def missing_cpu_flags(self) -> dict[str, str]:
        """precision -> why, for each precision of `cpu_needs` this host's CPU cannot run."""
        if not self.cpu_needs:
            return {}
        have = cpu_flags()
        out = {}
        for precision, (flags, why) in self.cpu_needs.items():
            lacking = [f for f in flags if f not in have]
            if lacking:
                out[precision] = f"{why}; this CPU lacks {', '.join(lacking)}"
        return out

    @classmethod
    def can_compile(cls) -> bool:
        return bool(cls.compile_method)

    def check_mode(self) -> None:
        """Refuse a mode this framework does not have, naming the modes it has."""
        modes = ["eager", "compiled"] if self.can_compile() else ["eager"]
        if self.spec.mode not in modes:
            raise ValueError(
                f"mode {self.spec.mode} is not supported by {self.title or self.name}; "
                f"use one of: {', '.join(modes)}"
            )
        reason = self.compiled and self.cannot_compile_here()
        if reason:
            raise ValueError(
                f"mode compiled is not supported by {self.title or self.name} here: {reason}; "
                "use mode eager for this cell (exclude it: {mode: compiled, ...})"
            )

    @classmethod
    def workloads(cls) -> list[str]:
        """The workloads this adapter runs: throughput always, convergence where declared."""
        return ["throughput", "convergence"] if cls.convergence_method else ["throughput"]

    def check_workload(self) -> None:
        """Refuse a workload this framework does not run, naming the ones it does."""
        if self.spec.workload not in self.workloads():
            raise ValueError(
                f"workload {self.spec.workload} is not supported by {self.title or self.name}; "
                f"use one of: {', '.join(self.workloads())}"
            )

    def check_optimizer(self) -> None:
        """Refuse an optimizer this framework's adapter does not build, naming the ones it does
        (its record's `optimizers`); the workflow refuses the cell before any job."""
        if self.spec.optimizer not in self.optimizers:
            raise ValueError(
                f"optimizer {self.spec.optimizer} is not supported by "
                f"{self.title or self.name}; use one of: {', '.join(self.optimizers)}"
            )

    def check_parallelism(self) -> None:
        """Refuse a parallelism this framework does not run, naming the ones it does."""
        if self.spec.parallelism not in self.strategies:
            raise ValueError(
                f"parallelism {self.spec.parallelism} is not supported by "
                f"{self.title or self.name}; use one of: {', '.join(self.strategies)}"
            )

    def out_of_memory(self, error: BaseException) -> bool:
        """Whether an error means this rank ran out of memory (dlscale.store.does_not_fit: the cell
        does not
        fit at this size, a result rather than a failure)."""
        return isinstance(error, MemoryError)

    def memory_per_rank(self) -> dict:
        """What this rank holds in memory (metrics `memory`): its peak resident set (VmHWM,
        the CPU's figure) and, where the framework says, peak device memory and the bytes of
        parameters, gradients and optimizer state held locally."""
        return {"peak_rss_mb": peak_rss_mb()}

    def cannot_compile_here(self) -> str | None:
        """Why this cell's step cannot be compiled although the framework can compile (None:
        it can)."""
        return None

    @property
    def compiled(self) -> bool:
        return self.spec.mode == "compiled"

    @property
    def data_parallel(self) -> bool:
        """Whether there is anything to keep in sync: above one rank. At world size 1 every
        adapter runs the best single-device program (no data-parallel wrapper, no allreduce,
        no process group), the speedup baseline of Hoefler & Belli (SC'15)."""
        return self.ctx.world_size > 1

    def execution(self) -> dict:
        """How the step runs, recorded in every rank's metrics: mode and how it compiles, the
        data-parallel wrapper, and the fast paths in force (fast_paths)."""
        return {
            "mode": self.spec.mode,
            "compile_method": self.compile_method if self.compiled else None,
            "wrapper": self.wrapper(),
            "fast_paths": self.fast_paths(),
        }

    def wrapper(self) -> str:
        """The data-parallel wrapper the step runs under (none at world size 1)."""
        return "none (world size 1)"

    def fast_paths(self) -> dict:
        """The framework's performance switches as they are in this rank (cuDNN autotuning,
        TF32, memory format, fused/foreach optimizer, XLA, ...)."""
        return {}

    @property
    def precision_dtype(self):
        """The framework's dtype or policy for the spec's precision (None: plain fp32)."""
        return self.precisions[self.spec.precision]

    @property
    def rank_seed(self) -> int:
        """This rank's seed: the spec's seed + rank (ranks draw different random numbers; the
        initial weights agree all the same: every framework starts from rank 0's)."""
        return self.spec.seed + self.ctx.rank

    def seed(self) -> None:
        """Seed the framework's random generators for this rank (seed_framework(rank_seed))."""
        self.seed_framework(self.rank_seed)

    def seed_framework(self, seed: int) -> None:
        raise NotImplementedError

    @classmethod
    def has_breakdown(cls, spec: TrainSpec) -> bool:
        """Whether step_without_allreduce is available for this spec: by default whenever the
        adapter declares its breakdown method."""
        return bool(cls.breakdown_method)

    # ------------------------------------------------------------------ the contract
    def setup(self) -> None:  # init the process group, build model, optimizer, data
        raise NotImplementedError

    def step(self) -> None:  # one forward + backward + gradient allreduce + update
        raise NotImplementedError

    def sync(self) -> None:  # wait for queued device work
        raise NotImplementedError

    def barrier(self) -> None:  # all ranks meet
        raise NotImplementedError

    def teardown(self) -> None:
        raise NotImplementedError

    def describe(self) -> dict:
        """Library versions, device model, data layout, input shape, parameter count."""
        raise NotImplementedError

    def build_info(self) -> dict:
        """The framework's own build description, recorded once per node (dlscale.rank.node_probes):
        `cuda_runtime`, `cudnn`, `nccl` (None where the build has none) and the framework's
        description (torch.__config__.show(), TF build info, MXNet runtime features) under
        `build`. Called after setup(), outside the timed window."""
        return {"available": False, "reason": f"{self.name} does not describe its build"}

    # Where the capabilities above declare them: the breakdown and the bandwidth probe.
    def step_without_allreduce(self) -> None:
        """The same step with the gradient allreduce skipped (compute only); called only when
        has_breakdown(spec)."""
        raise NotImplementedError

    def allreduce(self, numel: int) -> None:
        """Blocking allreduce (sum) of a float32 buffer of `numel` elements over all ranks;
        called only when has_allreduce_probe."""
        raise NotImplementedError

    def step_timer(self) -> StepTimer:
        """How the timed window's steps are timed (device events where the framework has them)."""
        return StepTimer(self)

    def peak_device_memory_mb(self) -> float | None:
        return None

    # The timed window's memory (run_timed): the peak statistics are reset right before the
    # window opens (after the warm-up and re-warm steps) and read right after it closes, so the
    # peak is the training step's, not construction's, warm-up's or the probes'.
    def reset_peak_memory(self) -> None:
        """Reset the device's peak memory statistics (where the framework keeps them)."""

    def read_peak_memory(self) -> None:
        """Read the device's peak memory since reset_peak_memory (memory_per_rank reports it)."""

    # The timed window's preparation (run_timed).
    def steps_before_window(self) -> int:
        """How many steps (warm-up and re-warm together) must precede the timed window at
        least; run_timed runs more re-warm steps than REWARM_STEPS where this asks for it."""
        return 0

    # What the first warm-up step's longer deadline covers in this framework (recorded).
    first_step_deadline_method: str = ""

    def first_step_deadline(self, seconds: float):
        """A context in which the first warm-up step (compilation, tracing, autotuning) may wait
        up to `seconds` for its peers: by default the adapter's Watchdog, where it has one."""
        watchdog = getattr(self, "watchdog", None)
        if isinstance(watchdog, Watchdog):
            return watchdog.extended(seconds)
        return contextlib.nullcontext()

    def host_sync_points(self) -> list[tuple[object, str]]:
        """(owner, attribute) of the framework's calls that wait for the device on the host
        (reading a device value, synchronising a device or an event), which a SyncAudit counts
        besides the adapter's own hooks."""
        return []

    def after_window(self) -> dict:
        """What the adapter measures after the timed window, never inside it (run_timed calls
        it last; the PyTorch adapter: the attention kernel that ran, a profiler trace where the
        cell asks for one), as fields of the rank's rank_end record; none here."""
        return {}

    def window_facts(self) -> dict:
        """Framework state a SyncAudit records at the window's start and end (PyTorch: DDP's
        last sampled iteration)."""
        return {}

    # The convergence contract (where convergence_method is declared; dlscale.run.convergence_loop
    # runs it).
    def data_loaders(self, info, *, workers: int, seed: int):
        """(train batches, train sampler, validation batches) of this rank's shard of the
        dataset (`info`: dlscale.data.DatasetInfo); the sampler's set_epoch(e) reshuffles."""
        raise NotImplementedError

    def train_batch(self, batch, learning_rate: float):
        """One optimizer step on a batch at `learning_rate` (gradients averaged over all ranks);
        returns (the batch's summed loss as a device value, its sample count)."""
        raise NotImplementedError

    def warmup_pass(self, batch) -> None:
        """A forward and backward pass on a batch that changes no weight, momentum or
        normalisation statistic: compilation, tracing and allocation happen here, before the
        clock of time-to-accuracy starts."""
        raise NotImplementedError

    def evaluate(self, batches) -> tuple[int, int]:
        """(correct predictions, samples) of this rank over its validation batches."""
        raise NotImplementedError

    def to_host(self, value) -> float:
        """A device value (train_batch's summed loss) as a Python float."""
        raise NotImplementedError

    def allreduce_sum(self, values: list[float]) -> list[float]:
        """The element-wise sum of `values` over all ranks (the values themselves at world
        size 1)."""
        raise NotImplementedError

    def allreduce_max(self, values: list[float]) -> list[float]:
        """The element-wise maximum of `values` over all ranks."""
        raise NotImplementedError


class Watchdog:
    """Ends the rank when one blocking call (a step, a barrier, a probe, start-up, shutdown)
    outlives its deadline, for frameworks whose collectives can wait forever on a peer that is
    alive but stopped taking part (Horovod's synchronize()) or that have no timeout at all
    (MXNet's ps-lite).

    Used as `with watchdog("a training step"): ...`. The deadline of a call is `seconds` (given
    per call, else COLLECTIVE_TIMEOUT_S) plus `grow` x the longest call named in `grow_with`
    that finished so far (so a slow model's steps do not trip it). Past the deadline the rank
    prints what it waited for, runs `on_fire` (e.g. to kill child processes) and exits with
    `exit_code`; the launcher then fails the cell with that rank's exit code and log."""

    def __init__(
        self,
        framework: str,
        rank: int,
        *,
        timeout: float = COLLECTIVE_TIMEOUT_S,
        grow: float = 0.0,
        grow_with: tuple[str, ...] = (),
        on_fire=None,
        exit_code: int = WATCHDOG_EXIT_CODE,
    ):
        self.framework, self.rank = framework, rank
        self.timeout, self.grow, self.grow_with = timeout, grow, grow_with
        self.on_fire, self.exit_code = on_fire, exit_code
        self.longest = 0.0
        self._what = ""
        self._started = 0.0
        self._deadline: float | None = None
        self._lock = threading.Lock()
        threading.Thread(
            target=self._run, name=f"dlscale-{framework}-watchdog", daemon=True
        ).start()

    @contextlib.contextmanager
    def __call__(self, what: str, seconds: float | None = None):
        with self._lock:
            self._what, self._started = what, time.monotonic()
            self._deadline = (
                self._started
                + (self.timeout if seconds is None else seconds)
                + self.grow * self.longest
            )
        finished = False
        try:
            yield
            finished = True
        finally:
            with self._lock:
                if finished and what in self.grow_with:
                    self.longest = max(self.longest, time.monotonic() - self._started)
                self._deadline = None

    @contextlib.contextmanager
    def extended(self, seconds: float):
        """Calls inside this context that name no deadline of their own get at least `seconds`
        (the first warm-up step's compile deadline)."""
        with self._lock:
            previous, self.timeout = self.timeout, max(self.timeout, seconds)
        try:
            yield
        finally:
            with self._lock:
                self.timeout = previous

    def _run(self) -> None:
        while True:
            time.sleep(1.0)
            with self._lock:
                late = self._deadline is not None and time.monotonic() > self._deadline
                what, bound = self._what, (self._deadline or 0.0) - self._started
                longest = self.longest
            if late:
                grown = (
                    f" + {self.grow:g} x the longest step so far, {longest:.1f} s"
                    if self.grow and longest
                    else ""
                )
                print(
                    f"[dlscale.frameworks.{self.framework}] rank {self.rank}: {what} did not "
                    f"finish within {bound:.0f} s ({COLLECTIVE_TIMEOUT_ENV}{grown}): a peer is "
                    f"dead, hung or stopped taking part; exiting with {self.exit_code}",
                    file=sys.stderr,
                    flush=True,
                )
                try:
                    if self.on_fire is not None:
                        self.on_fire()
                finally:
                    os._exit(self.exit_code)


class StepTimer:
    """Per-step times of the timed window. The default (host) timer reads time.perf_counter
    around each step and its device synchronisation (Adapter.sync): exact on CPUs, where the
    step runs synchronously and sync does nothing, and on frameworks whose step already waits
    for its result (TensorFlow, Keras and MXNet fetch the loss). Adapters with device events
    (PyTorch and Horovod on CUDA: torch_model.TorchModel.step_timer) replace it with a timer
    that records events around each step and synchronises only once, at the end of the
    window."""

    method = TIMER + " around each step and its device synchronisation"

    def __init__(self, adapter: Adapter):
        self.adapter, self.times, self._t0 = adapter, [], 0.0

    def start(self) -> None:
        self._t0 = time.perf_counter()

    def stop(self) -> None:
        self.adapter.sync()
        self.times.append(time.perf_counter() - self._t0)

    def step_seconds(self) -> list[float]:
        return self.times


class HostTimer(StepTimer):
    """time.perf_counter around each step, with no synchronisation: for a step that returns
    only when its work is done (PyTorch on CPUs: CPU ops run synchronously and DDP's backward
    waits for its allreduce), so nothing is left to wait for."""

    method = TIMER + " around each step (the step returns when its work is done: no sync)"

    def stop(self) -> None:
        self.times.append(time.perf_counter() - self._t0)

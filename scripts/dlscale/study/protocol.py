"""The measurement method's facts, in one neutral module.

Both sides import this: the rank side (dlscale.run.train, dlscale.frameworks, which produce
measurements) and the analysis side (dlscale.store.metrics, collect, report, which read and explain
them); neither side imports the other for a constant. Pure Python: importable in every framework
environment.
"""

from __future__ import annotations

# ----------------------------------------------------------------------------- timing
TIMER = "time.perf_counter"
IDLE_PROBE_SECONDS = 0.5  # every rank waits this long after warm-up, sampling its host
COMPETING_BUSY_CPUS = 0.5  # more busy CPUs than this flags the cell as competing
BREAKDOWN_STEPS = 10  # compute-only steps after the timed window
ALLREDUCE_BYTES = (1 << 20, 16 << 20)  # probe message sizes (float32 buffers)
ALLREDUCE_REPEATS = 5  # timed repeats per size, after one warm-up
# Untimed steps after the idle probe and the barrier, right before the timed window: the device
# sat idle through the probe (clocks, caches and the allocator start cold otherwise). An adapter
# may need more (Adapter.steps_before_window: DDP's always-sampled first iterations).
REWARM_STEPS = 3
# The first warm-up step's own deadline (config `first_step_timeout_s`): compilation, tracing and
# autotuning of a cold cache can take far longer than a step, and ranks compile at different
# speeds, so the collectives of that one step wait up to this long (watchdog and the process
# group's timeout) instead of the collective timeout of every other step.
FIRST_STEP_TIMEOUT_S = 1800
REWARM_METHOD = (
    f"after the idle probe and a barrier, {REWARM_STEPS} untimed re-warm steps (more where the "
    "framework needs them, recorded per rank) run right before the timed window"
)
# Where a framework's step itself waits for the device or for its collectives on the host, once
# per step, and the same on CPUs: each framework's record (dlscale.registry.frameworks,
# host_sync_per_step and host_sync_per_step_cpu), stated per framework by the report.

THROUGHPUT_METHOD = (
    "cell throughput = sum over ranks of per_rank_batch * steps / the rank's timed window "
    "(wall clock between a device synchronisation before the first timed step and one after "
    "the last); never rank 0 x world size; compilation and other first-step costs are in the "
    "warm-up, reported separately (compile_seconds)"
)
IDLE_PROBE_METHOD = (
    f"after warm-up all ranks wait {IDLE_PROBE_SECONDS} s while each samples "
    f"its host's busy CPUs; > {COMPETING_BUSY_CPUS} busy CPUs flags the cell "
    "as competing"
)

# ----------------------------------------------------------------------------- time-to-accuracy
# What a convergence cell's clock holds and what it leaves out (dlscale.run.convergence_loop; every
# convergence record and the report state it).
TIME_TO_ACCURACY_METHOD = (
    "Time-to-accuracy is the sum, over the epochs up to the first whose validation accuracy "
    "reaches the target, of each epoch's training time: wall clock from the barrier that "
    "starts the epoch to the device synchronisation after its last optimizer step, the "
    "slowest rank's (loading the training batches included)"
)
TIME_TO_ACCURACY_EXCLUDES = (
    "process start-up, framework and process-group initialisation, staging the dataset to "
    "node-local storage (timed apart), model build, opening the dataset, a warm-up forward and "
    "backward pass without update (compilation, tracing, allocation), the idle probe, "
    "validation after each epoch (timed apart), and the loader-only measurement after the "
    "last epoch"
)
# The loader-only measurement (dlscale.data.loader_bench): after a convergence cell's last
# epoch every rank times its training loader alone, without the model.
LOADER_WARMUP_BATCHES = 5
LOADER_BATCHES = 50
LOADER_MAX_SECONDS = 20.0
INPUT_BOUND_MARGIN = 3.0  # the loader must deliver this many times the step's samples/s
LOADER_METHOD = (
    f"After the last epoch each rank iterates its training loader without the model: "
    f"{LOADER_WARMUP_BATCHES} untimed batches, then up to {LOADER_BATCHES} timed (at most "
    f"{LOADER_MAX_SECONDS:g} s); loader / train = the rank's loader samples/s over its "
    f"training samples/s (loading included) over the epochs, the smallest over ranks; below "
    f"{INPUT_BOUND_MARGIN:g} the cell is flagged input-bound"
)
VALIDATION_METHOD = (
    "validation accuracy over the whole validation split, disjoint from the training split: "
    "each rank evaluates its own shard and the correct counts are summed over all ranks"
)

# ----------------------------------------------------------------------------- the metrics format
FORMAT = "dlscale.metrics"
VERSION = 1

# Event names, in the order they appear in a metrics file.
RUN_START = "run_start"  # the cell and its provenance (written by the launcher)
RANK_START = "rank_start"  # a rank's host, libraries, device
IDLE_PROBE = "idle_probe"  # what kept the rank's host busy before the timed window
STEP = "step"  # one timed step
EPOCH = "epoch"  # one training epoch of a convergence cell and its validation
RANK_END = "rank_end"  # the rank's summary, breakdown, allreduce probe, energy
CONVERGENCE = "convergence"  # a convergence cell's outcome (written by the launcher)
SUMMARY = "summary"  # the cell's summary (written by the launcher)

# event -> whether its record names a rank
RANKED = {
    RUN_START: False,
    RANK_START: True,
    IDLE_PROBE: True,
    STEP: True,
    EPOCH: True,
    RANK_END: True,
    CONVERGENCE: False,
    SUMMARY: False,
}

# Telemetry (dlscale.rank.telemetry samples it; dlscale.analysis.collect and the report read it).
TELEMETRY_INTERVAL_S = 0.1

# quantity -> (unit, what it is); the order of the columns in cells.csv and ranks.csv
QUANTITIES = {
    "cpu_util_pct": ("%", "process CPU time over wall time, % of one core"),
    "rss_mb": ("MB", "resident memory of the rank's process"),
    "gpu_util_pct": ("%", "NVML utilisation: share of time a kernel ran on the board"),
    "sm_clock_mhz": ("MHz", "NVML SM clock"),
    "gpu_memory_used_mb": ("MB", "NVML device memory used (all processes on the board)"),
    "gpu_temperature_c": ("C", "NVML GPU temperature"),
    "gpu_power_w": ("W", "NVML power usage (the board's own averaging window)"),
}
GPU_QUANTITIES = tuple(q for q in QUANTITIES if q.startswith(("gpu_", "sm_")))

"""The measurement method's facts, in one neutral module.

Both sides import this: the rank side (dlscale.train, dlscale.frameworks, which produce
measurements) and the analysis side (dlscale.metrics, collect, report, which read and explain
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
# What a convergence cell's clock holds and what it leaves out (dlscale.converge; every
# convergence record and the report state it).
TIME_TO_ACCURACY_METHOD = (
    "Time-to-accuracy is the sum, over the epochs up to the first whose validation accuracy "
    "reaches the target, of each epoch's training time: wall clock from the barrier that "
    "starts the epoch to the device synchronisation after its last optimizer step, the "
    "slowest rank's (loading the training batches included)"
)
TIME_TO_ACCURACY_EXCLUDES = (
    "process start-up, framework and process-group initialisation, model build, opening the "
    "dataset, a warm-up forward and backward pass without update (compilation, tracing, "
    "allocation), the idle probe, and validation after each epoch (timed apart)"
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

"""Synthetic metrics files in the real format, for the tests and the benchmarks alike: the
records a rank writes (rank_start, idle_probe, one step per timed step, rank_end), built with
dlscale.store.metrics (make_record, rank_summary) and made into a cell's file by its assemble
(which adds run_start, the cell's own fields, and the summary), as a launch writes them.

- rank_start, idle_probe, unavailable, step_records, rank_end: the parts every rank's records
  share (a convergence rank's and the results database's files build on them too);
- throughput_rank: one throughput rank's records;
- rank_records, CELL, assembled: the two-rank file the metrics tests check (rank 1 competing
  for its CPUs, a compute-time breakdown and allreduce timings on both ranks);
- cell_records: the file of any real Cell, every rank of its world (the benchmarks' studies).

dlscale.store.metrics is imported where it is used: a benchmark measuring another checkout has
imported that checkout's package first."""

from __future__ import annotations

import time

from dlscale.study.cell import Cell

from helpers.cells import cell_dict


def rank_start(rank: int, **changes) -> dict:
    """A rank_start record's value: one CPU rank of a small vision model on node n<rank + 1>,
    with `changes` (any key, new or replaced)."""
    return {
        "local_rank": 0,
        "node": f"n{rank + 1}",
        "node_index": rank,
        "pid": 100 + rank,
        "device": "cpu",
        "device_model": "CPU X",
        "threads": 1,
        "loadavg_1m": 0.5,
        "per_rank_batch": 8,
        "data_layout": "NCHW",
        "input_shape": [3, 32, 32],
        "param_count": 1000,
        "libraries": {"torch": "2.13.0"},
        "python": "3.11.7",
        "cpu_model": "CPU X",
        "dlscale_version": "0.1.0",
        "timer": "time.perf_counter",
        "sync_method": "none",
        **changes,
    }


def idle_probe(busy_cpus: float = 0.1, competing: bool = False, method: str = "test") -> dict:
    """An idle_probe record's value: what kept the rank's host busy before its window."""
    return {
        "window_s": 0.5,
        "busy_cpus": busy_cpus,
        "top_processes": [],
        "competing": competing,
        "method": method,
    }


def unavailable(reason: str = "test") -> dict:
    """A measurement the rank could not make (energy, breakdown, allreduce) and why."""
    return {"available": False, "reason": reason}


def step_records(rank: int, step_seconds: list[float], samples: int) -> list[dict]:
    """One step record of `samples` samples per entry of `step_seconds`."""
    from dlscale.store import metrics

    return [
        metrics.make_record("step", rank, {"step": i, "seconds": s, "samples": samples})
        for i, s in enumerate(step_seconds)
    ]


def rank_end(step_seconds: list[float], samples: int, reason: str = "test", **changes) -> dict:
    """A rank_end record's value: the steps' summary (dlscale.store.metrics.rank_summary), no
    device memory, energy, breakdown and allreduce unavailable for `reason`, then `changes`."""
    from dlscale.store import metrics

    return {
        **metrics.rank_summary(step_seconds, samples, 100.0),
        "peak_device_memory_mb": None,
        "energy": unavailable(reason),
        "breakdown": unavailable(reason),
        "allreduce": unavailable(reason),
        **changes,
    }


def throughput_rank(
    rank: int,
    step_seconds: list[float],
    samples: int = 8,
    start: dict | None = None,
    probe: dict | None = None,
    end: dict | None = None,
    reason: str = "test",
) -> list[dict]:
    """A throughput rank's records: rank_start (`start`, else rank_start(rank)), idle_probe
    (`probe`, else idle_probe()), one step of `samples` per entry of `step_seconds`, and
    rank_end (the steps' summary, no device memory, energy, breakdown and allreduce unavailable
    for `reason`, then `end`'s keys)."""
    from dlscale.store import metrics

    return [
        metrics.make_record("rank_start", rank, start or rank_start(rank)),
        metrics.make_record("idle_probe", rank, probe or idle_probe()),
        *step_records(rank, step_seconds, samples),
        metrics.make_record(
            "rank_end", rank, rank_end(step_seconds, samples, reason, **(end or {}))
        ),
    ]


def rank_records(rank: int, step_seconds: list[float], node: str) -> list[dict]:
    """A rank of the metrics tests' file on `node`: rank 1 found its CPUs busy (competing), and
    every rank measured its compute time (half of each step) and two allreduce repeats."""
    return throughput_rank(
        rank,
        step_seconds,
        start=rank_start(rank, node=node, backend="gloo"),
        probe=idle_probe(busy_cpus=0.9 if rank == 1 else 0.1, competing=rank == 1),
        end={
            "breakdown": {
                "available": True,
                "method": "test",
                "compute_seconds": [s / 2 for s in step_seconds],
            },
            "allreduce": {
                "available": True,
                "repeats": 2,
                "sizes": [{"bytes": 1000, "seconds": [0.001, 0.001 * (rank + 1)]}],
            },
        },
    )


# The metrics tests' cell: 2 nodes of one rank, 8 samples each, 3 timed steps
CELL = cell_dict(per_rank_batch=8, global_batch=16, steps=3)


def assembled(**overrides) -> list[dict]:
    """CELL's metrics file: rank 0 on n1 at 0.1 s a step, rank 1 on n2 at 0.2 s;
    `overrides`: metrics.assemble's arguments (cell, wall_seconds, ...)."""
    from dlscale.store import metrics

    ranks = {0: rank_records(0, [0.1, 0.1, 0.1], "n1"), 1: rank_records(1, [0.2, 0.2, 0.2], "n2")}
    kwargs = dict(
        cell=Cell.from_dict(CELL),
        git_commit="deadbeef",
        slurm_job_id=None,
        rank_records=ranks,
        wall_seconds=2.0,
        started=1.0,
    )
    kwargs.update(overrides)
    return metrics.assemble(**kwargs)


def cell_records(cell: Cell, hw: dict | None = None) -> list[dict]:
    """The metrics file of a real Cell: every rank of its world (its node, local rank, device,
    threads and batch from the cell; `hw`: the cell's hardware entry, for its device model)
    at about 10 ms a step over the cell's timed steps."""
    from dlscale.store import metrics

    hw = hw or {}
    seconds = [0.01 + 0.0001 * (i % 7) for i in range(cell.steps)]
    ranks = {}
    for rank in range(cell.world_size):
        node = rank // cell.ranks_per_node
        start = rank_start(
            rank,
            local_rank=rank % cell.ranks_per_node,
            node=f"{cell.hardware}-node{node}",
            node_index=node,
            pid=1000 + rank,
            device=cell.device,
            device_model=hw.get("device_model") or "synthetic CPU",
            threads=cell.cpus_per_rank,
            loadavg_1m=0.1,
            per_rank_batch=cell.per_rank_batch,
            libraries={cell.framework: "synthetic"},
            python="3.11",
            cpu_model="synthetic",
        )
        probe = idle_probe(busy_cpus=0.0, method="synthetic")
        ranks[rank] = throughput_rank(
            rank, seconds, cell.per_rank_batch, start, probe, reason="synthetic"
        )
    return metrics.assemble(
        cell=cell,
        git_commit=None,
        slurm_job_id=None,
        rank_records=ranks,
        wall_seconds=1.0,
        started=time.time(),
    )

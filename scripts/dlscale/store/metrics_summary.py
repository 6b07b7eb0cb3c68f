"""A cell's summary from its ranks' records: throughput summed over ranks, the compute/communication
breakdown, allreduce bus bandwidth, energy per sample, boards shared by two ranks of a node, and a
convergence cell's loader and staging measurements. dlscale.store.metrics.assemble puts them into
the metrics file."""

from __future__ import annotations

import statistics

from dlscale.study.protocol import IDLE_PROBE, RANK_END, RANK_START, STEP


def shared_gpus(ranks: list[dict]) -> list[dict]:
    """Boards used by more than one rank of a node: [{"node", "gpu", "ranks"}]. `ranks` are
    {"rank", "node", "gpu"} with `gpu` a gpu_identity (or None for a CPU rank)."""
    by_board: dict[tuple, list[int]] = {}
    for r in ranks:
        if r.get("gpu"):
            by_board.setdefault((r["node"], r["gpu"]["key"]), []).append(r["rank"])
    return [
        {"node": node, "gpu": key, "ranks": sorted(rs)}
        for (node, key), rs in sorted(by_board.items())
        if len(rs) > 1
    ]


def summarize(rank_records: dict[int, list[dict]], wall_seconds: float) -> dict:
    """Cell summary from every rank's records: throughput is the sum over ranks."""
    ends = {
        r: next(x["value"] for x in recs if x["event"] == RANK_END)
        for r, recs in rank_records.items()
    }
    starts = {
        r: next(x["value"] for x in recs if x["event"] == RANK_START)
        for r, recs in rank_records.items()
    }
    probes = [
        x["value"] for recs in rank_records.values() for x in recs if x["event"] == IDLE_PROBE
    ]
    busy = [p["busy_cpus"] for p in probes if p["busy_cpus"] is not None]
    thr = [ends[r]["throughput_samples_per_s"] for r in sorted(ends)]
    steps = [
        x["value"]["seconds"] for recs in rank_records.values() for x in recs if x["event"] == STEP
    ] or [e["step_seconds_median"] for e in ends.values()]  # a convergence cell: no step records
    return {
        **_breakdown_summary(ends, statistics.median(steps)),
        **_allreduce_summary(ends, len(rank_records)),
        **_energy_summary(ends, starts),
        "status": "ok",
        "world_size": len(rank_records),
        "nodes_seen": sorted({s["node"] for s in starts.values()}),
        "throughput_samples_per_s": sum(thr),
        "rank_throughput_min": min(thr),
        "rank_throughput_median": statistics.median(thr),
        "rank_throughput_max": max(thr),
        "step_seconds_median": statistics.median(steps),
        "compile_seconds": max(
            (e["compile_seconds"] for e in ends.values() if e.get("compile_seconds") is not None),
            default=None,
        ),
        "peak_rss_mb_max": max(e["peak_rss_mb"] for e in ends.values()),
        "wall_seconds": wall_seconds,
        "competing": any(p["competing"] for p in probes),
        "host_busy_cpus_max": max(busy) if busy else None,
        # boards used by more than one rank of a node (shared_gpus): a wrong
        # binding, flagged in the status table and the report
        "shared_gpus": shared_gpus(
            [{"rank": r, "node": st["node"], "gpu": st.get("gpu")} for r, st in starts.items()]
        ),
    }


def _breakdown_summary(ends: dict, step_median: float) -> dict:
    """Compute-only step (allreduce skipped) vs the full step: communication share of a step."""
    per_rank = [
        statistics.median(e["breakdown"]["compute_seconds"])
        for e in ends.values()
        if e.get("breakdown", {}).get("available")
    ]
    if not per_rank:
        return {"compute_seconds_median": None, "comm_fraction": None}
    compute = statistics.median(per_rank)
    return {
        "compute_seconds_median": compute,
        "comm_fraction": max(0.0, 1.0 - compute / step_median),
    }


def _allreduce_summary(ends: dict, world_size: int) -> dict:
    """Allreduce algorithm and bus bandwidth (busbw = algbw x 2(n-1)/n) per message size, from
    the median time over repeats of the slowest rank (a collective ends when the last rank does)."""
    probes = [e["allreduce"] for e in ends.values() if e.get("allreduce", {}).get("available")]
    if not probes:
        return {"allreduce": None}
    out = []
    for i, size in enumerate(probes[0]["sizes"]):
        seconds = max(statistics.median(p["sizes"][i]["seconds"]) for p in probes)
        algbw = size["bytes"] / seconds
        out.append(
            {
                "bytes": size["bytes"],
                "seconds_median": seconds,
                "algbw_bytes_per_s": algbw,
                "busbw_bytes_per_s": bus_bandwidth(algbw, world_size),
            }
        )
    return {"allreduce": out}


def bus_bandwidth(algbw: float, world_size: int) -> float:
    """NCCL-tests convention for allreduce: busbw = algbw x 2(n-1)/n."""
    return algbw * 2 * (world_size - 1) / world_size if world_size > 1 else 0.0


def _energy_summary(ends: dict, starts: dict) -> dict:
    """Joules per sample over the timed window; a node's package counters are counted once."""
    readings = {}
    for rank, end in sorted(ends.items()):
        energy = end.get("energy") or {}
        if not energy.get("available"):
            return {
                "joules_per_sample": None,
                "energy_unavailable": energy.get("reason", "not recorded"),
            }
        key = (starts[rank]["node"], "node") if energy["source"].startswith("rapl") else rank
        readings.setdefault(key, energy["joules"])
    samples = sum(e["throughput_samples_per_s"] * e["seconds_total"] for e in ends.values())
    short = [e["energy"]["short_window"] for e in ends.values() if e["energy"].get("short_window")]
    return {
        "joules_per_sample": sum(readings.values()) / samples,
        "energy_unavailable": None,
        "energy_short_window": short[0] if short else None,
    }


def loader_outcome(ends: list[dict]) -> dict:
    """The ranks' loader-only measurements (dlscale.run.convergence_loop.loader_only) in one: the
    slowest
    rank's loader, the smallest loader / train ratio, input-bound when any rank is; None (not
    measured) for ranks written before the measurement existed."""
    loaders = [e["loader_only"] for e in ends if e.get("loader_only")]
    if len(loaders) < len(ends):
        return {
            "loader_samples_per_s": None,
            "loader_train_ratio": None,
            "input_bound": None,
            "loader_batches": None,
        }
    return {
        "loader_samples_per_s": min(x["samples_per_s"] for x in loaders),
        "loader_train_ratio": min(x["ratio"] for x in loaders),
        "input_bound": any(x["input_bound"] for x in loaders),
        "loader_batches": min(x["batches"] for x in loaders),
    }


def staging_outcome(rank_records: dict[int, list[dict]]) -> dict:
    """Where the ranks staged the dataset, the longest any rank spent on it and the bytes
    copied over all ranks (one copy per node, or none when reused)."""
    staged = [
        (x["value"].get("staging") or {})
        for recs in rank_records.values()
        for x in recs
        if x["event"] == RANK_START
    ]
    staged = [x for x in staged if x.get("stage_dir")]
    if not staged:
        return {"stage_dir": None, "staged_seconds": None, "staged_bytes": None}
    return {
        "stage_dir": staged[0]["stage_dir"],
        "staged_seconds": max(x["seconds"] for x in staged),
        "staged_bytes": sum(x["bytes_copied"] for x in staged),
    }

"""Where metrics are written: the versioned JSON-lines format of one cell.

A metrics file holds, in order: one `run_start` record (cell + provenance + timing method), for
each rank a `rank_start`, one `step` per timed step and a `rank_end`, and one `summary`. Every
line carries the same fixed keys (format, version, time, event, rank, value), in the manner of
mlperf's mllog. Ranks first write their own part files; the launcher merges them, validates the
result against schemas/metrics.schema.json and renames it into place only when complete.
"""
from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
from functools import lru_cache
from importlib import resources
from pathlib import Path

import jsonschema

from .frameworks.base import COMPETING_BUSY_CPUS, IDLE_PROBE_SECONDS

FORMAT = "dlscale.metrics"
VERSION = 1
THROUGHPUT_METHOD = ("cell throughput = sum over ranks of per_rank_batch * steps / sum(rank's "
                     "step seconds); never rank 0 x world size")


IDLE_PROBE_METHOD = (f"after warm-up all ranks wait {IDLE_PROBE_SECONDS} s while each samples "
                     f"its host's busy CPUs; > {COMPETING_BUSY_CPUS} busy CPUs flags the cell "
                     "as competing")


class MetricsError(ValueError):
    """A metrics file that is missing, truncated, corrupt, of another version or inconsistent."""


def make_record(event: str, rank: int | None, value: dict) -> dict:
    return {"format": FORMAT, "version": VERSION, "time": time.time(), "event": event,
            "rank": rank, "value": value}


@lru_cache(maxsize=1)
def _validator() -> jsonschema.Draft202012Validator:
    schema = json.loads(resources.files("dlscale").joinpath("schemas/metrics.schema.json").read_text())
    return jsonschema.Draft202012Validator(schema)


def rank_file(rank_dir: str | Path, rank: int) -> Path:
    return Path(rank_dir) / f"rank{rank}.jsonl"


class RankWriter:
    """A rank's own part file, appended and flushed record by record (a crash keeps what ran)."""

    def __init__(self, rank_dir: str | Path, rank: int):
        self.rank = rank
        self.path = rank_file(rank_dir, rank)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fh = self.path.open("w")

    def write(self, event: str, value: dict) -> None:
        self._fh.write(json.dumps(make_record(event, self.rank, value)) + "\n")
        self._fh.flush()

    def close(self) -> None:
        self._fh.close()


def read_rank_files(rank_dir: str | Path, world_size: int) -> dict[int, list[dict]]:
    out = {}
    for rank in range(world_size):
        path = rank_file(rank_dir, rank)
        if not path.exists():
            raise MetricsError(f"rank {rank} wrote no metrics ({path} missing)")
        out[rank] = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        events = [r["event"] for r in out[rank]]
        if "rank_end" not in events:
            raise MetricsError(f"rank {rank} did not finish (no rank_end in {path})")
    return out


def rank_summary(step_seconds: list[float], per_rank_batch: int, peak_rss_mb: float) -> dict:
    total = sum(step_seconds)
    return {"steps": len(step_seconds), "seconds_total": total,
            "throughput_samples_per_s": per_rank_batch * len(step_seconds) / total,
            "step_seconds_median": statistics.median(step_seconds), "peak_rss_mb": peak_rss_mb}


def summarize(rank_records: dict[int, list[dict]], wall_seconds: float) -> dict:
    """Cell summary from every rank's records: throughput is the sum over ranks."""
    ends = {r: next(x["value"] for x in recs if x["event"] == "rank_end")
            for r, recs in rank_records.items()}
    starts = {r: next(x["value"] for x in recs if x["event"] == "rank_start")
              for r, recs in rank_records.items()}
    probes = [x["value"] for recs in rank_records.values() for x in recs
              if x["event"] == "idle_probe"]
    busy = [p["busy_cpus"] for p in probes if p["busy_cpus"] is not None]
    thr = [ends[r]["throughput_samples_per_s"] for r in sorted(ends)]
    steps = [x["value"]["seconds"] for recs in rank_records.values() for x in recs
             if x["event"] == "step"]
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
        "peak_rss_mb_max": max(e["peak_rss_mb"] for e in ends.values()),
        "wall_seconds": wall_seconds,
        "competing": any(p["competing"] for p in probes),
        "host_busy_cpus_max": max(busy) if busy else None,
    }


def _breakdown_summary(ends: dict, step_median: float) -> dict:
    """Compute-only step (allreduce skipped) vs the full step: communication share of a step."""
    per_rank = [statistics.median(e["breakdown"]["compute_seconds"]) for e in ends.values()
                if e.get("breakdown", {}).get("available")]
    if not per_rank:
        return {"compute_seconds_median": None, "comm_fraction": None}
    compute = statistics.median(per_rank)
    return {"compute_seconds_median": compute,
            "comm_fraction": max(0.0, 1.0 - compute / step_median)}


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
        out.append({"bytes": size["bytes"], "seconds_median": seconds,
                    "algbw_bytes_per_s": algbw,
                    "busbw_bytes_per_s": bus_bandwidth(algbw, world_size)})
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
            return {"joules_per_sample": None,
                    "energy_unavailable": energy.get("reason", "not recorded")}
        key = (starts[rank]["node"], "node") if energy["source"].startswith("rapl") else rank
        readings.setdefault(key, energy["joules"])
    samples = sum(e["throughput_samples_per_s"] * e["seconds_total"] for e in ends.values())
    return {"joules_per_sample": sum(readings.values()) / samples, "energy_unavailable": None}


def assemble(*, study: str, cell: dict, config_hash: str, git_commit: str | None, launcher: str,
             slurm_job_id: str | None, rank_records: dict[int, list[dict]],
             wall_seconds: float, started: float) -> list[dict]:
    """The whole metrics file: run_start (provenance), every rank's records, summary."""
    first = next(x["value"] for x in rank_records[0] if x["event"] == "rank_start")
    starts = [next(x["value"] for x in recs if x["event"] == "rank_start")
              for _, recs in sorted(rank_records.items())]
    run_start = make_record("run_start", None, {
        "study": study,
        "cell": cell,
        "config_hash": config_hash,
        "provenance": {
            "dlscale_version": first["dlscale_version"],
            "git_commit": git_commit,
            "python": first["python"],
            "libraries": first["libraries"],
            "hosts": sorted({s["node"] for s in starts}),
            "world_size": len(rank_records),
            "ranks_per_node": cell["ranks_per_node"],
            "device_model": first["device_model"],
            "cpu_model": first["cpu_model"],
            "backend": first.get("backend"),
            "launcher": launcher,
            "slurm_job_id": slurm_job_id,
        },
        "timing": {
            "warmup_steps": cell["warmup_steps"],
            "steps": cell["steps"],
            "timer": first["timer"],
            "sync_method": first["sync_method"],
            "throughput": THROUGHPUT_METHOD,
            "batch_policy": cell["policy"],
            "idle_probe": IDLE_PROBE_METHOD,
        },
    })
    run_start["time"] = started
    records = [run_start]
    for _, recs in sorted(rank_records.items()):
        records.extend(recs)
    records.append(make_record("summary", None, summarize(rank_records, wall_seconds)))
    return records


def validate_records(records: list[dict], where: str = "metrics") -> None:
    """Schema-check every line and the file's structure; raise MetricsError on the first problem."""
    if not records:
        raise MetricsError(f"{where}: empty")
    for i, rec in enumerate(records, 1):
        if isinstance(rec, dict) and rec.get("format") == FORMAT and rec.get("version") != VERSION:
            raise MetricsError(f"{where}: line {i}: format version {rec.get('version')!r}, "
                               f"this dlscale reads version {VERSION}")
        err = jsonschema.exceptions.best_match(_validator().iter_errors(rec))
        if err is not None:
            path = "/".join(map(str, err.absolute_path))
            raise MetricsError(f"{where}: line {i}: {path or '(record)'}: {err.message}")
    if records[0]["event"] != "run_start" or records[-1]["event"] != "summary":
        raise MetricsError(f"{where}: must start with run_start and end with summary")
    world = records[0]["value"]["cell"]["world_size"]
    ranks = {r["rank"] for r in records if r["event"] == "rank_end"}
    if ranks != set(range(world)):
        raise MetricsError(f"{where}: rank_end records for ranks {sorted(ranks)}, "
                           f"expected 0..{world - 1}")


def write_atomic(path: str | Path, records: list[dict]) -> None:
    """Validate, write to a temporary file beside `path`, fsync, then rename into place."""
    path = Path(path)
    validate_records(records, where=str(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            for rec in records:
                fh.write(json.dumps(rec, sort_keys=True) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_metrics(path: str | Path) -> list[dict]:
    """Read and validate one metrics file; MetricsError for anything but a complete, valid file."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise MetricsError(f"{path}: cannot read ({exc.strerror})") from None
    records = []
    for i, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as exc:
            raise MetricsError(f"{path}: line {i}: not JSON ({exc.msg})") from None
    validate_records(records, where=str(path))
    return records

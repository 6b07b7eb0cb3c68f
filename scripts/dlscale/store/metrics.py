"""Where metrics are written: the versioned JSON-lines format of one cell.

A metrics file holds, in order: one `run_start` record (cell + provenance + timing method), for
each rank a `rank_start`, one `step` per timed step and a `rank_end`, and one `summary`. Every
line carries the same fixed keys (format, version, time, event, rank, value), in the manner of
mlperf's mllog. Ranks first write their own part files; the launcher merges them, validates the
result against schemas/metrics.schema.json and renames it into place only when complete.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import statistics
import tempfile
import time
from functools import lru_cache
from importlib import resources
from pathlib import Path

from dlscale.store.metrics_summary import loader_outcome, staging_outcome, summarize
from dlscale.study.cell import Cell
from dlscale.study.lr import scaled_lr
from dlscale.study.protocol import (
    CONVERGENCE,
    EPOCH,
    FORMAT,
    IDLE_PROBE_METHOD,
    RANK_END,
    RANK_START,
    RANKED,
    RUN_START,
    STEP,
    SUMMARY,
    THROUGHPUT_METHOD,
    TIME_TO_ACCURACY_EXCLUDES,
    TIME_TO_ACCURACY_METHOD,
    VALIDATION_METHOD,
    VERSION,
)


class MetricsError(ValueError):
    """A metrics file that is missing, truncated, corrupt, of another version or inconsistent."""


def make_record(event: str, rank: int | None, value: dict) -> dict:
    return {
        "format": FORMAT,
        "version": VERSION,
        "time": time.time(),
        "event": event,
        "rank": rank,
        "value": value,
    }


@lru_cache(maxsize=1)
def _schema() -> dict:
    return json.loads(
        resources.files("dlscale").joinpath("schemas/metrics.schema.json").read_text()
    )


@lru_cache(maxsize=1)
def _validator() -> jsonschema.Draft202012Validator:  # noqa: F821 (imported here)
    """The reference validator: its message explains every rejected record. jsonschema is
    imported here, not with the module: a rank's records and summary (RankWriter,
    rank_summary) need no validator, so a bare GPU machine runs them without jsonschema
    (benchmarks/gpu_suite.py)."""
    import jsonschema

    return jsonschema.Draft202012Validator(_schema())


def prepare_validation() -> None:
    """Compile the validators now: the first file read pays for it otherwise (~0.2 s), which
    a reader that times each file (the results database's recorder) does once, up front."""
    _validator()
    _value_validators()


_ENVELOPE = frozenset(("format", "version", "time", "event", "rank", "value"))
_STEP_VALUE = frozenset(("step", "seconds", "samples"))


@lru_cache(maxsize=1)
def _value_validators() -> dict | None:
    """Each event's value schema ($defs/<event>) compiled to Python code by fastjsonschema
    (~10x faster than jsonschema); None where fastjsonschema is not installed (the framework
    venvs, which validate one file per cell on writing, where speed does not matter)."""
    try:
        import fastjsonschema
    except ImportError:
        return None
    schema = _schema()
    # "$id" keeps fastjsonschema's $ref resolution inside this document (no remote lookups)
    return {
        event: fastjsonschema.compile(
            {"$id": schema["$id"], "$defs": schema["$defs"], "$ref": f"#/$defs/{event}"}
        )
        for event in RANKED
    }


def _plain_step(value) -> bool:
    """Exactly what $defs/step requires, by hand (~1 us; steps are most lines of a file)."""
    if type(value) is not dict or value.keys() != _STEP_VALUE:
        return False
    step, seconds, samples = value["step"], value["seconds"], value["samples"]
    return (
        type(step) is int
        and step >= 0
        and type(samples) is int
        and samples >= 1
        and type(seconds) in (int, float)
        and seconds > 0
    )


def _fast_valid(rec) -> bool:
    """A sufficient (never a necessary) condition for a record to be valid: the envelope of the
    schema checked by hand with exact types, then the event's own value schema (compiled).
    A record it does not accept goes to the reference validator, which decides and explains,
    so nothing valid is rejected; tests/unit/store/test_metrics.py checks that nothing it accepts
    is invalid, on mutated records."""
    validators = _value_validators()
    if validators is None or type(rec) is not dict or rec.keys() != _ENVELOPE:
        return False
    event, rank, version = rec["event"], rec["rank"], rec["version"]
    if (
        rec["format"] != FORMAT
        or type(version) is not int
        or version != VERSION
        or type(rec["time"]) not in (int, float)
        or type(event) is not str
        or event not in RANKED
    ):
        return False
    if not ((type(rank) is int and rank >= 0) if RANKED[event] else rank is None):
        return False
    if event == STEP:
        return _plain_step(rec["value"])
    try:
        validators[event](rec["value"])
    except Exception:  # fastjsonschema.JsonSchemaException: the reference validator explains
        return False
    return True


def _record_error(rec) -> str | None:
    """None for a valid record, else the reference validator's message (path: message)."""
    if _fast_valid(rec):
        return None
    from jsonschema.exceptions import best_match

    err = best_match(_validator().iter_errors(rec))
    if err is None:
        return None
    return f"{'/'.join(map(str, err.absolute_path)) or '(record)'}: {err.message}"


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
        if RANK_END not in events:
            raise MetricsError(f"rank {rank} did not finish (no rank_end in {path})")
    return out


def rank_summary(
    step_seconds: list[float],
    per_rank_batch: int,
    peak_rss_mb: float,
    window_seconds: float | None = None,
) -> dict:
    """A rank's summary: throughput = per_rank_batch x steps / the timed window's wall-clock
    seconds (THROUGHPUT_METHOD; the sum of step times where no window was measured)."""
    total = window_seconds if window_seconds is not None else sum(step_seconds)
    return {
        "steps": len(step_seconds),
        "seconds_total": total,
        "step_seconds_sum": sum(step_seconds),
        "throughput_samples_per_s": per_rank_batch * len(step_seconds) / total,
        "step_seconds_median": statistics.median(step_seconds),
        "peak_rss_mb": peak_rss_mb,
    }


def first_step_overhead(first_step: float | None, step_seconds: list[float]) -> float | None:
    """What the first warm-up step took beyond a steady step: compilation, tracing, graph
    building, autotuning (never inside throughput)."""
    if first_step is None or not step_seconds:
        return None
    return max(0.0, first_step - statistics.median(step_seconds))


def convergence_outcome(cell: Cell, rank_records: dict[int, list[dict]], started: float) -> dict:
    """A convergence cell's outcome from its ranks' epoch records (their global values agree;
    rank 0's are taken): reached or not, time-, epochs- and samples-to-accuracy, the learning
    rate rule and rates, and what the clock leaves out (TIME_TO_ACCURACY_EXCLUDES)."""
    epochs = [x["value"] for x in rank_records[0] if x["event"] == EPOCH]
    if not epochs:
        raise MetricsError("a convergence cell's rank 0 wrote no epoch record")
    first = next(x["value"] for x in rank_records[0] if x["event"] == RANK_START)
    ends = [
        next(x["value"] for x in recs if x["event"] == RANK_END) for recs in rank_records.values()
    ]
    hit = next((e for e in epochs if e["val_accuracy"] >= cell.target_accuracy), None)
    data = first.get("dataset") or {}
    warm = [e.get("warmup_pass_seconds") for e in ends if e.get("warmup_pass_seconds") is not None]
    clock = [e["clock_start_time"] for e in ends if e.get("clock_start_time") is not None]
    return {
        "reached": hit is not None,
        "time_to_accuracy_s": hit["training_seconds"] if hit else None,
        "epochs_to_accuracy": hit["epoch"] if hit else None,
        "samples_to_accuracy": hit["samples_seen"] if hit else None,
        "target_accuracy": cell.target_accuracy,
        "max_epochs": cell.max_epochs,
        "epochs_run": len(epochs),
        "best_val_accuracy": max(e["val_accuracy"] for e in epochs),
        "final_val_accuracy": epochs[-1]["val_accuracy"],
        "training_seconds": epochs[-1]["training_seconds"],
        "samples_seen": epochs[-1]["samples_seen"],
        "lr_rule": cell.lr_rule,
        "base_learning_rate": cell.learning_rate,
        "reference_batch": cell.reference_batch,
        "warmup_epochs": cell.warmup_epochs,
        "effective_learning_rate": scaled_lr(
            cell.lr_rule, cell.learning_rate, cell.global_batch, cell.reference_batch
        ),
        "global_batch": cell.global_batch,
        "per_rank_batch": cell.per_rank_batch,
        "policy": cell.policy,
        "world_size": cell.world_size,
        "dataset": cell.dataset,
        "data_format": cell.data_format,
        "train_samples": data.get("train_samples") or 1,
        "val_samples": data.get("val_samples") or epochs[-1]["val_samples"],
        "method": TIME_TO_ACCURACY_METHOD,
        "excluded": TIME_TO_ACCURACY_EXCLUDES,
        "validation": VALIDATION_METHOD,
        "warmup_pass_seconds": max(warm) if warm else None,
        "startup_seconds": max(0.0, min(clock) - started) if clock else None,
        "validation_seconds": sum(e["validation_seconds"] for e in epochs),
        **loader_outcome(ends),
        **staging_outcome(rank_records),
    }


def rendezvous_of(starts: list[dict]) -> dict:
    """The cell's rendezvous as its ranks saw it (rank_start `network`, dlscale.rank.network):
    MASTER_ADDR and port, what MASTER_ADDR resolved to on each node and the collectives'
    interface there with the reason it was taken; nothing where no rank recorded it (files of
    before, a local launch of simulated nodes records it too)."""
    nets = [(s["node"], s["network"]) for s in starts if s.get("network")]
    if not nets:
        return {}
    first = nets[0][1]
    return {
        "rendezvous": {
            "master_addr": first["master_addr"],
            "master_port": first["master_port"],
            "resolved": {node: net["master_resolved"] for node, net in nets},
            "interface": {node: net["interface"] for node, net in nets},
            "chosen_by": {node: net["chosen_by"] for node, net in nets},
        }
    }


def assemble(
    *,
    cell: Cell,
    git_commit: str | None,
    slurm_job_id: str | None,
    rank_records: dict[int, list[dict]],
    wall_seconds: float,
    started: float,
) -> list[dict]:
    """The whole metrics file: run_start (provenance), every rank's records, a convergence
    cell's outcome (convergence_outcome), summary."""
    first = next(x["value"] for x in rank_records[0] if x["event"] == RANK_START)
    starts = [
        next(x["value"] for x in recs if x["event"] == RANK_START)
        for _, recs in sorted(rank_records.items())
    ]
    run_start = make_record(
        RUN_START,
        None,
        {
            "study": cell.study,
            "cell": cell.as_dict(),
            "config_hash": cell.config_hash,
            "provenance": {
                "dlscale_version": first["dlscale_version"],
                "git_commit": git_commit,
                "python": first["python"],
                "libraries": first["libraries"],
                "hosts": sorted({s["node"] for s in starts}),
                "world_size": len(rank_records),
                "ranks_per_node": cell.ranks_per_node,
                "device_model": first["device_model"],
                "cpu_model": first["cpu_model"],
                "backend": first.get("backend"),
                "launcher": cell.launcher,
                "slurm_job_id": slurm_job_id,
                **rendezvous_of(starts),
            },
            "timing": {
                "warmup_steps": cell.warmup_steps,
                "steps": cell.steps,
                "timer": first["timer"],
                "sync_method": first["sync_method"],
                "throughput": THROUGHPUT_METHOD,
                "batch_policy": cell.policy,
                "idle_probe": IDLE_PROBE_METHOD,
            },
        },
    )
    run_start["time"] = started
    if cell.workload == "convergence":
        run_start["value"]["timing"]["time_to_accuracy"] = TIME_TO_ACCURACY_METHOD
        run_start["value"]["timing"]["excluded"] = TIME_TO_ACCURACY_EXCLUDES
    records = [run_start]
    for _, recs in sorted(rank_records.items()):
        records.extend(recs)
    if cell.workload == "convergence":
        records.append(
            make_record(CONVERGENCE, None, convergence_outcome(cell, rank_records, started))
        )
    records.append(make_record(SUMMARY, None, summarize(rank_records, wall_seconds)))
    return records


def validate_records(
    records: list[dict],
    where: str = "metrics",
    *,
    line_numbers: list[int] | None = None,
    checked: list[bool] | None = None,
) -> None:
    """Schema-check every line and the file's structure; raise MetricsError on the first problem.
    `line_numbers`: each record's line in the file (default 1, 2, ...); `checked`: records
    already known valid (canonical step lines, see read_metrics)."""
    if not records:
        raise MetricsError(f"{where}: empty")
    line_numbers = line_numbers or range(1, len(records) + 1)
    checked = checked or itertools.repeat(False)
    for i, rec, ok in zip(line_numbers, records, checked):
        if ok:
            continue
        if isinstance(rec, dict) and rec.get("format") == FORMAT and rec.get("version") != VERSION:
            raise MetricsError(
                f"{where}: line {i}: format version {rec.get('version')!r}, "
                f"this dlscale reads version {VERSION}"
            )
        err = _record_error(rec)
        if err is not None:
            raise MetricsError(f"{where}: line {i}: {err}")
    if records[0]["event"] != RUN_START or records[-1]["event"] != SUMMARY:
        raise MetricsError(f"{where}: must start with run_start and end with summary")
    world = records[0]["value"]["cell"]["world_size"]
    ranks = {r["rank"] for r in records if r["event"] == RANK_END}
    if ranks != set(range(world)):
        raise MetricsError(
            f"{where}: rank_end records for ranks {sorted(ranks)}, expected 0..{world - 1}"
        )
    if records[0]["value"]["cell"].get("workload", "throughput") == "convergence":
        _check_convergence(records, world, where)
    elif any(r["event"] in (EPOCH, CONVERGENCE) for r in records):
        raise MetricsError(f"{where}: epoch or convergence records in a throughput cell")


def _check_convergence(records: list[dict], world: int, where: str) -> None:
    """A convergence cell's structure: every rank the same epochs 1..k, agreeing on the global
    values, and one convergence record (before the summary) that says what they say."""
    outcome = [r["value"] for r in records if r["event"] == CONVERGENCE]
    if len(outcome) != 1 or records[-2]["event"] != CONVERGENCE:
        raise MetricsError(
            f"{where}: a convergence cell needs one convergence record before summary"
        )
    per_rank = {
        rank: [r["value"] for r in records if r["event"] == EPOCH and r["rank"] == rank]
        for rank in range(world)
    }
    epochs = per_rank[0]
    if [e["epoch"] for e in epochs] != list(range(1, len(epochs) + 1)) or not epochs:
        raise MetricsError(f"{where}: rank 0's epochs are not 1..k")
    shared = ("epoch", "val_accuracy", "val_samples", "samples_seen", "training_seconds")
    for rank, mine in per_rank.items():
        if [[e[k] for k in shared] for e in mine] != [[e[k] for k in shared] for e in epochs]:
            raise MetricsError(f"{where}: rank {rank}'s epochs disagree with rank 0's")
    out = outcome[0]
    target = out["target_accuracy"]
    hit = next((e for e in epochs if e["val_accuracy"] >= target), None)
    if (
        out["reached"] != (hit is not None)
        or out["epochs_run"] != len(epochs)
        or (hit is None and out["time_to_accuracy_s"] is not None)
    ):
        raise MetricsError(f"{where}: the convergence record contradicts the epoch records")
    if hit is not None and (
        out["epochs_to_accuracy"] != hit["epoch"]
        or out["time_to_accuracy_s"] != hit["training_seconds"]
    ):
        raise MetricsError(f"{where}: time- or epochs-to-accuracy contradict the epoch records")


def current_umask() -> int:
    """The process's umask (read by setting it and setting it back)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_atomic(path: str | Path, records: list[dict]) -> None:
    """Validate, write to a temporary file beside `path`, fsync, then rename into place."""
    path = Path(path)
    validate_records(records, where=str(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        # mkstemp creates the file 0600; a metrics file gets the mode any file of the user gets
        # (0666 minus the umask), so a group sharing a project directory can read it.
        os.fchmod(fd, 0o666 & ~current_umask())
        with os.fdopen(fd, "w") as fh:
            for rec in records:
                fh.write(json.dumps(rec, sort_keys=True) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


# A step record exactly as write_atomic serialises it (sort_keys, json's default separators,
# floats as Python writes them). A line this pattern matches is a valid step record: every
# number it admits satisfies $defs/step (seconds > 0 needs a non-zero digit and an exponent of
# at most two digits, so nothing underflows to 0). Lines it does not match take the full
# path (parse + schema); tests/unit/store/test_metrics.py checks the pattern against the schema.
_UINT = r"(?:0|[1-9][0-9]*)"
_NUMBER = r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?"
_POSITIVE = (
    r"(?:0\.0{0,3}[1-9][0-9]*|[1-9][0-9]*(?:\.[0-9]+)?|[1-9](?:\.[0-9]+)?"
    r"[eE][+-]?[0-9]{1,2})"
)
_STEP = (
    r'\{"event": "'
    + STEP
    + r'", "format": "'
    + re.escape(FORMAT)
    + r'", "rank": '
    + _UINT
    + r', "time": '
    + _NUMBER
    + r', "value": \{"samples": [1-9][0-9]*, "seconds": '
    + _POSITIVE
    + r', "step": '
    + _UINT
    + r'\}, "version": '
    + str(VERSION)
    + r"\}"
)
STEP_LINE = re.compile(_STEP)
_STEP_LINES = re.compile("^" + _STEP + "\n", re.MULTILINE)  # all of a file's, in one call


def read_metrics(path: str | Path, steps: bool = True, text: str | None = None) -> list[dict]:
    """Read and validate one metrics file; MetricsError for anything but a complete, valid file.

    steps=False (aggregation, which needs only the ranks' own summaries): step lines are still
    checked, but not returned, and canonical ones are matched by STEP_LINE without parsing.
    Everything else is parsed in one call and checked with the schema (fast path: _fast_valid).
    `text`: the file's content where the caller has read it already (the results database
    hashes the same bytes), so the file is read once.
    """
    if text is None:
        try:
            with open(path) as fh:
                text = fh.read()
        except OSError as exc:
            raise MetricsError(f"{path}: cannot read ({exc.strerror})") from None
        except UnicodeDecodeError as exc:
            raise MetricsError(f"{path}: not text ({exc.reason})") from None
    if not steps:
        try:  # the common case in one pass; any problem is located line by line below
            lines = [line for line in _STEP_LINES.sub("", text).splitlines() if line.strip()]
            records = json.loads("[" + ",".join(lines) + "]")
            if len(records) == len(lines):
                validate_records(records, where=str(path))
                return records
        except (json.JSONDecodeError, MetricsError):
            pass
    numbered = [(i, line) for i, line in enumerate(text.splitlines(), 1) if line.strip()]
    canonical = [STEP_LINE.fullmatch(line) is not None for _, line in numbered]
    if not steps:
        numbered = [nl for nl, step in zip(numbered, canonical) if not step]
        canonical = [False] * len(numbered)
    lines = [line for _, line in numbered]
    try:  # one C-level parse of all lines; line by line only to locate an error
        records = json.loads("[" + ",".join(lines) + "]")
    except json.JSONDecodeError:
        records = None
    if records is None or len(records) != len(lines):
        records = []
        for i, line in numbered:
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise MetricsError(f"{path}: line {i}: not JSON ({exc.msg})") from None
    validate_records(
        records, where=str(path), line_numbers=[i for i, _ in numbered], checked=canonical
    )
    return records

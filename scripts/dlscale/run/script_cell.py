"""A script cell, on the launcher's side: fill the command, start the ranks, read the throughput.

dlscale.run.launch.run_cell hands a cell of the `script` workload (dlscale.study.script_workload)
here once the hardware entry's modules and env are loaded:

  1. the command's placeholders are filled for the cell (fill_command) and written for the
     tasks (dlscale.run.script_rank.COMMAND_FILE); its {output_dir} is the rank folder's
     OUTPUT_DIR, kept with the measurement;
  2. the tasks start through the launcher's own functions (srun or local processes, the entry's
     binding and srun options, a container where the entry names one): one per rank, or one per
     node under launch torchrun; a task that fails fails the cell as any rank does;
  3. the throughput is read from what the script wrote (read_throughput): the JSON lines of its
     `json` file, or the matches of its `pattern` in its standard output, each line cut to
     MAX_LINE characters and each line's match bounded by LINE_TIMEOUT_S in a child process
     (match_lines), so no pattern or log can hang the launcher;
  4. no reading: the cell fails with the pattern (or file) and the tail of the log it read,
     and nothing else of the study is affected; else the metrics file is written in the
     format of every cell (dlscale.store.metrics: rank_start, step, rank_end per rank, a
     summary), with the script's argv as run, its content hash and how the value was read, in
     a measurement folder of its own beside the earlier ones (dlscale.store.measurements).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import select
import shutil
import signal
import statistics
import sys
import time
from pathlib import Path

from dlscale.study.cell import Cell

OUTPUT_DIR = "output"  # in the rank folder: the script's {output_dir}
MAX_LINE = 4096  # characters of a line a pattern sees (the rest of a longer line is cut)
LINE_TIMEOUT_S = 2.0  # one line's match may take this long; then the cell fails
MAX_LOG_BYTES = 16 << 20  # the end of a log a pattern reads
MAX_JSON_BYTES = 64 << 20  # a JSON-lines file larger than this is refused
TAIL = 8  # lines of the log quoted in a failure


class NoThroughput(Exception):
    """The script's output holds no throughput as the study describes it."""


def script_of(cell: Cell) -> dict:
    return dict(cell.script)


def placeholder_values(cell: Cell, python: str, output_dir: Path) -> dict[str, str]:
    """What each placeholder of dlscale.study.script_workload.PLACEHOLDERS is for this cell."""
    script = script_of(cell)
    return {
        "python": python,
        "script": script["script"],
        "per_rank_batch": str(cell.per_rank_batch),
        "global_batch": str(cell.global_batch),
        "steps": str(cell.steps),
        "warmup_steps": str(cell.warmup_steps),
        "seq_len": "" if cell.seq_len is None else str(cell.seq_len),
        "precision": cell.precision,
        "parallelism": cell.parallelism,
        "output_dir": str(output_dir.resolve()),
        "seed": str(script.get("seed", 0)),
        "nodes": str(cell.nodes),
        "ranks_per_node": str(cell.ranks_per_node),
        "world_size": str(cell.world_size),
    }


def fill_command(cell: Cell, python: str, output_dir: Path) -> list[str]:
    """The cell's argv: each item's placeholders replaced (str.format over names only: the
    study's check refused anything else), nothing else touched, no shell."""
    values = placeholder_values(cell, python, output_dir)
    return [item.format(**values) for item in script_of(cell)["command"]]


def task_cell(cell: Cell) -> Cell:
    """The cell as the launcher starts its tasks: one task per rank, or under launch torchrun
    one per node with the node's CPUs (torchrun starts the node's ranks)."""
    if script_of(cell)["launch"] != "torchrun":
        return cell
    return dataclasses.replace(
        cell, ranks_per_node=1, cpus_per_rank=cell.cpus_per_rank * cell.ranks_per_node
    )


# ---- bounded matching ---------------------------------------------------------------------
class PatternTimeout(NoThroughput):
    pass


def match_lines(
    pattern: str, lines: list[str], line_timeout_s: float = LINE_TIMEOUT_S
) -> list[dict | None]:
    """Each line's named groups where `pattern` is found in it (re.search), else None. Lines
    are cut to MAX_LINE characters; a child process matches them one by one and the launcher
    waits at most line_timeout_s for each, so a pattern that backtracks without end stops at
    the first line that takes too long (PatternTimeout, naming the line)."""
    if not lines:
        return []
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: match, one JSON line per input line, flushed as each ends
        code = 0
        try:
            os.close(read)
            regex = re.compile(pattern)
            for line in lines:
                m = regex.search(line[:MAX_LINE])
                os.write(write, (json.dumps(m.groupdict() if m else None) + "\n").encode())
        except BaseException:  # noqa: BLE001 (the parent sees the pipe close early)
            code = 1
        finally:
            os._exit(code)
    os.close(write)
    out: list[dict | None] = []
    buffer = b""
    try:
        while len(out) < len(lines):
            if b"\n" not in buffer:
                ready, _, _ = select.select([read], [], [], line_timeout_s)
                if not ready:
                    raise PatternTimeout(
                        f"pattern {pattern!r} took more than {line_timeout_s:g} s on line "
                        f"{len(out) + 1} ({lines[len(out)][:80]!r}...): matching stopped"
                    )
                chunk = os.read(read, 1 << 16)
                if not chunk:
                    raise NoThroughput(f"pattern {pattern!r}: matching ended early")
                buffer += chunk
                continue
            line, buffer = buffer.split(b"\n", 1)
            out.append(json.loads(line))
    finally:
        os.close(read)
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        os.waitpid(pid, 0)
    return out


def log_lines(path: Path) -> list[str]:
    """A log's lines, its last MAX_LOG_BYTES only."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - MAX_LOG_BYTES))
            data = fh.read()
    except OSError:
        return []
    return data.decode(errors="replace").splitlines()


# ---- reading the throughput ---------------------------------------------------------------
@dataclasses.dataclass
class Stream:
    """One stream of readings: the whole job's (scope global) or one rank's (scope rank).
    `steps`: (step, count, seconds) of each timed step where the script gives them; `rates`:
    each timed rate where it prints rates instead; `printed`: the one rate's text as printed."""

    steps: list[tuple[int, int, float]]
    rates: list[float]
    printed: str | None = None

    @property
    def readings(self) -> int:
        return len(self.steps) or len(self.rates)

    @property
    def throughput(self) -> float:
        if self.steps:
            return sum(c for _, c, _ in self.steps) / sum(s for _, _, s in self.steps)
        return statistics.median(self.rates)


def _number(text: str, what: str, where: str, whole: bool = False) -> float:
    try:
        value = int(text) if whole else float(text)
    except (TypeError, ValueError):
        kind = "a whole number" if whole else "a number"
        raise NoThroughput(f"{where}: {what} {str(text)[:40]!r} is not {kind}") from None
    if not math.isfinite(value) or value <= 0:
        raise NoThroughput(f"{where}: {what} {text!r} must be above 0")
    return value


def _pattern_stream(script: dict, log: Path, label: str) -> Stream:
    pattern, warmup = script["read"], script["warmup"]
    found = [m for m in match_lines(pattern, log_lines(log)) if m is not None]
    if len(found) <= warmup:
        tail = "\n".join(log_lines(log)[-TAIL:]) or "(empty)"
        raise NoThroughput(
            f"no throughput: pattern {pattern!r} matched {len(found)} line(s) of {label} "
            f"({log.name}), {warmup} of them warm-up; its last lines:\n{tail}"
        )
    timed = found[warmup:]
    where = f"pattern {pattern!r} in {log.name}"
    if "value" in timed[0]:
        rates = [_number(m["value"], "value", where) for m in timed]
        printed = timed[0]["value"].strip() if len(timed) == 1 else None
        return Stream(steps=[], rates=rates, printed=printed)
    steps = [
        (
            i,
            int(_number(m["count"], "count", where, whole=True)),
            _number(m["seconds"], "seconds", where),
        )
        for i, m in enumerate(timed, warmup)
    ]
    return Stream(steps=steps, rates=[])


def _json_stream(script: dict, path: Path) -> Stream:
    unit, warmup = script["unit"], script["warmup"]
    if not path.is_file():
        raise NoThroughput(
            f"no throughput: the script wrote no {path.name} in its output folder "
            f"(throughput.json {script['read']!r})"
        )
    if path.stat().st_size > MAX_JSON_BYTES:
        raise NoThroughput(f"{path.name}: larger than {MAX_JSON_BYTES >> 20} MiB")
    records = []
    for i, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path.name} line {i}"
        if len(line) > MAX_LINE:
            raise NoThroughput(f"{where}: longer than {MAX_LINE} characters")
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            raise NoThroughput(f"{where}: not JSON ({exc.msg})") from None
        if not isinstance(rec, dict) or unit not in rec or "seconds" not in rec:
            raise NoThroughput(
                f"{where}: a record needs step, {unit} and seconds, e.g. "
                f'{{"step": 3, "{unit}": 256, "seconds": 0.125}}; got {line[:80]!r}'
            )
        step = rec.get("step", len(records))
        if not isinstance(step, int) or isinstance(step, bool) or step < 0:
            raise NoThroughput(f"{where}: step {step!r} is not a whole number >= 0")
        count = rec[unit]
        if not isinstance(count, int) or isinstance(count, bool) or count < 1:
            raise NoThroughput(f"{where}: {unit} {count!r} is not a whole number >= 1")
        records.append((step, count, _number(rec["seconds"], "seconds", where)))
    if len(records) <= warmup:
        raise NoThroughput(
            f"no throughput: {path.name} holds {len(records)} record(s), {warmup} of them warm-up"
        )
    return Stream(steps=records[warmup:], rates=[])


@dataclasses.dataclass
class Reading:
    """The cell's throughput as read: its value in the unit per second, each rank's (an equal
    share of a global value: the script measured no rank's own), the streams read and how."""

    throughput: float
    per_rank: list[float]
    streams: dict[int | None, Stream]  # rank -> its stream; None: the job's
    how: str

    @property
    def printed(self) -> str | None:
        job = self.streams.get(None)
        return job.printed if job else None


def read_throughput(cell: Cell, rank_dir: Path) -> Reading:
    """The cell's throughput from the script's output (module docstring); NoThroughput with
    the reason and the log's tail where there is none."""
    script = script_of(cell)
    world, unit = cell.world_size, script["unit"]
    per_node = cell.ranks_per_node
    torchrun = script["launch"] == "torchrun"
    output = rank_dir / OUTPUT_DIR
    streams: dict[int | None, Stream] = {}
    if script["source"] == "json":
        if script["scope"] == "global":
            streams[None] = _json_stream(script, output / script["read"])
        else:
            for r in range(world):
                streams[r] = _json_stream(script, output / script["read"].format(rank=r))
        where = f"the JSON lines of {script['read']} in the output folder"
    else:
        if script["scope"] == "global":
            streams[None] = _pattern_stream(script, rank_dir / "rank0.log", "rank 0's output")
        else:
            for r in range(world):
                log = rank_dir / f"rank{r // per_node if torchrun else r}.log"
                streams[r] = _pattern_stream(script, log, f"rank {r}'s output")
        where = f"pattern {script['read']!r} on " + (
            "rank 0's standard output" if script["scope"] == "global" else "each rank's output"
        )
    if None in streams:
        value = streams[None]
        throughput = float(value.printed) if value.printed is not None else value.throughput
        per_rank = [throughput / world] * world
    else:
        per_rank = [streams[r].throughput for r in range(world)]
        throughput = sum(per_rank)
    job = streams.get(None) or streams[0]
    how = (
        f"read from the script's output: {where}; "
        + (
            "the whole job's value"
            if None in streams
            else "each rank's own value, summed over ranks"
        )
        + (
            f" ({job.readings} timed step record(s): their {unit} over their seconds"
            if job.steps
            else f" ({job.readings} timed reading(s): their median"
        )
        + (f", after {script['warmup']} warm-up" if script["warmup"] else "")
        + f"); {unit}/s"
    )
    return Reading(throughput=throughput, per_rank=per_rank, streams=streams, how=how)


# ---- the metrics records ------------------------------------------------------------------
UNAVAILABLE = {"available": False, "reason": "a script cell: dlscale does not instrument it"}


def read_tasks(rank_dir: Path, tasks: int) -> dict[int, dict]:
    from dlscale.run.script_rank import TASK_FILE

    out = {}
    for t in range(tasks):
        path = rank_dir / TASK_FILE.format(task=t)
        try:
            out[t] = json.loads(path.read_text())
        except (OSError, ValueError):
            raise NoThroughput(f"task {t} wrote no record of its script ({path.name})") from None
    return out


def rank_records(cell: Cell, reading: Reading, tasks: dict[int, dict]) -> dict[int, list[dict]]:
    """Each rank's records as the metrics format has them: rank_start (where and how it ran),
    its step records where the script gave steps (a global stream's go to rank 0), rank_end
    (its throughput: its own, or an equal share of the job's; its timed readings; the script
    process's peak resident set)."""
    import dlscale
    from dlscale.store.metrics import make_record
    from dlscale.study.protocol import RANK_END, RANK_START, STEP

    script = script_of(cell)
    by_rank = {r: t for t in tasks.values() for r in t["ranks"]}
    job = reading.streams.get(None)
    seq = cell.seq_len if script["unit"] == "tokens" and cell.seq_len else 1
    out = {}
    for rank in range(cell.world_size):
        task = by_rank[rank]
        stream = reading.streams.get(rank, job)
        steps = stream.steps if (rank in reading.streams or rank == 0) else []
        step_seconds = [s for _, _, s in stream.steps] or [
            # the rate's implied step: the global batch (x seq_len for tokens) over the rate
            cell.global_batch * seq / max(reading.throughput, 1e-300)
        ]
        start = {
            "local_rank": task["local_ranks"][task["ranks"].index(rank)],
            "node": task["node"],
            "node_index": task["node_index"],
            "pid": task["pid"],
            "device": cell.device,
            "device_model": task["device_model"],
            "threads": task["threads"],
            "loadavg_1m": task["loadavg_1m"],
            "per_rank_batch": cell.per_rank_batch,
            "data_layout": "the script's own",
            "input_shape": [],
            "param_count": None,
            "libraries": task["libraries"],
            "cpu_affinity": task["cpu_affinity"],
            "cpu_model": task["cpu_model"],
            "python": task["python"],
            "dlscale_version": dlscale.__version__,
            "timer": "the script's own",
            "sync_method": "the script's own",
            "torchrun_environment": task["torchrun_environment"],
        }
        records = [make_record(RANK_START, rank, start)]
        records += [
            make_record(STEP, rank, {"step": step, "seconds": seconds, "samples": count})
            for step, count, seconds in steps
        ]
        end = {
            "steps": stream.readings,
            "seconds_total": sum(step_seconds) if stream.steps else max(task["seconds"], 1e-9),
            "throughput_samples_per_s": reading.per_rank[rank],
            "step_seconds_median": statistics.median(step_seconds),
            "peak_rss_mb": task["peak_rss_mb"],
            "energy": UNAVAILABLE,
            "breakdown": UNAVAILABLE,
            "allreduce": UNAVAILABLE,
        }
        records.append(make_record(RANK_END, rank, end))
        out[rank] = records
    return out


def script_records(
    cell: Cell,
    reading: Reading,
    tasks: dict[int, dict],
    argv: list[str],
    *,
    git_commit: str | None,
    wall_seconds: float,
    started: float,
) -> list[dict]:
    """The cell's metrics file: assembled as every cell's (dlscale.store.metrics.assemble), the
    timing saying how the throughput was read, run_start `script` holding the argv as run and
    what was printed, and the summary's throughput exactly the value read."""
    from dlscale.store import metrics

    records = metrics.assemble(
        cell=cell,
        git_commit=git_commit,
        slurm_job_id=os.environ.get("SLURM_JOB_ID"),
        rank_records=rank_records(cell, reading, tasks),
        wall_seconds=wall_seconds,
        started=started,
    )
    script = script_of(cell)
    start = records[0]["value"]
    start["timing"]["throughput"] = reading.how
    start["script"] = {
        "argv": argv,
        "sha256": script["sha256"],
        "unit": script["unit"],
        "printed": reading.printed,
        "readings": sum(s.readings for s in reading.streams.values()),
        "exit_codes": {str(t): task["exit_code"] for t, task in sorted(tasks.items())},
    }
    records[-1]["value"]["throughput_samples_per_s"] = reading.throughput
    return records


# ---- the cell -----------------------------------------------------------------------------
def run_script(
    cell: Cell,
    output: Path,
    rank_dir: Path,
    environment: dict,
    *,
    git_commit: str | None,
    python: str,
    launch,
) -> int:
    """Run a script cell (module docstring); its exit code. `launch`: dlscale.run.launch, the
    caller, whose rank start-up and failure records the cell uses (passed, not imported: the
    launcher imports this module)."""
    from dlscale.run.script_rank import COMMAND_FILE
    from dlscale.store import metrics
    from dlscale.store.measurements import keep_measurement
    from dlscale.study.cell import SLURM_JOB_FILE

    out_dir = rank_dir / OUTPUT_DIR
    out_dir.mkdir(parents=True, exist_ok=True)
    script = script_of(cell)
    argv = fill_command(cell, python, out_dir)
    tasks_cell = task_cell(cell)
    (rank_dir / COMMAND_FILE).write_text(
        json.dumps(
            {
                "argv": argv,
                "launch": script["launch"],
                "nodes": cell.nodes,
                "ranks_per_node": cell.ranks_per_node,
                "device": cell.device,
            }
        )
    )
    task_argv = [python, "-m", "dlscale.run.script_rank", "--rank-dir", str(rank_dir)]
    print(
        f"[dlscale.run.launch] {cell.launcher}: {cell.nodes} node(s) x {cell.ranks_per_node} "
        f"rank(s) of script {cell.framework} (sha256 {script['sha256'][:12]}, launch "
        f"{script['launch']}): {' '.join(argv)}",
        file=sys.stderr,
        flush=True,
    )
    started = time.time()
    failed = launch._run_ranks(tasks_cell, task_argv, rank_dir, environment)
    wall = time.time() - started
    for log in sorted(rank_dir.glob("*.log")):
        print(f"----- {log.name} -----\n{log.read_text(errors='replace')}", file=sys.stderr)
    if failed is not None:
        return launch._cell_failed(output, rank_dir, tasks_cell, failed)
    try:
        reading = read_throughput(cell, rank_dir)
        tasks = read_tasks(rank_dir, tasks_cell.world_size)
        records = script_records(
            cell, reading, tasks, argv, git_commit=git_commit, wall_seconds=wall, started=started
        )
        folder = keep_measurement(
            output,
            records,
            metrics.write_atomic,
            slurm_job_id=os.environ.get("SLURM_JOB_ID"),
            extra_files=[*sorted(rank_dir.glob("*.log")), output.parent / SLURM_JOB_FILE],
        )
    except (NoThroughput, metrics.MetricsError) as exc:
        reason = str(exc) if isinstance(exc, NoThroughput) else f"invalid metrics: {exc}"
        launch.record_failure(output, rank_dir, cell, reason=reason, rank=None, exit_code=None)
        print(f"[dlscale.run.launch] cell FAILED: {reason}", file=sys.stderr)
        return 1
    shutil.move(str(out_dir), str(folder / OUTPUT_DIR))  # the script's own files, kept
    shutil.rmtree(rank_dir, ignore_errors=True)
    print(
        f"[dlscale.run.launch] throughput {reading.how}\n[dlscale.run.launch] ok: "
        f"{reading.throughput!r} {script['unit']}/s over {cell.world_size} rank(s) in "
        f"{wall:.1f} s; kept in {folder}",
        file=sys.stderr,
    )
    return 0

"""The GPU suite's bookkeeping (benchmarks/gpu_suite.py): its rows on disk (rows.jsonl and the
rows.md table, rewritten whole), the budget, and the plan of the child's rows (steps c-f) with
their estimates, from the recorded GPU runs where they exist. Standard library only."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from _gpu_common import (
    FORMAT,
    INIT_NS_PER_PARAM,
    MODES,
    OK,
    ROWS_FILE,
    SAFETY_S,
    TABLE_FILE,
    VERSION,
    decoder,
    row_target,
    size_decoder,
)


# ---------------------------------------------------------------------------- rows on disk
class Rows:
    """The run's rows: appended to OUT/rows.jsonl as each finishes (flushed and fsynced), and
    OUT/rows.md rewritten whole from them (written beside, then renamed)."""

    COLUMNS = ("step", "row", "status", "seconds", "result", "target", "reason")

    def __init__(self, out: Path, meta: dict):
        self.out, self.meta, self.rows = out, meta, []
        out.mkdir(parents=True, exist_ok=True)
        if (out / ROWS_FILE).exists():  # an earlier run's rows are never overwritten
            raise SystemExit(f"{out / ROWS_FILE} exists (an earlier run): give another folder")
        self._table()

    def write(self, row: dict) -> dict:
        row = {"format": FORMAT, "version": VERSION, **row}
        line = json.dumps(row, sort_keys=True, default=str)
        with open(self.out / ROWS_FILE, "a") as fh:
            fh.write(line + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        self.rows.append(json.loads(line))
        self._table()
        status = row["status"] + (f" ({row['reason']})" if row.get("reason") else "")
        print(f"[{row['step']}] {row['row']}: {row.get('result') or ''} -- {status}", flush=True)
        return row

    def _table(self) -> None:
        m = self.meta
        lines = [
            f"# dlscale GPU suite: {m['device_name']}",
            "",
            f"{m['started']}; commit {m['commit']}; device {m['device']}; torch "
            f"{m['torch']}; budget {m['budget_s']:g} s. Rows as they finished "
            f"({ROWS_FILE} holds the same rows with every field).",
            "",
            "| " + " | ".join(self.COLUMNS) + " |",
            "|" + "---|" * len(self.COLUMNS),
        ]
        for row in self.rows:
            lines.append("| " + " | ".join(table_cell(row, c) for c in self.COLUMNS) + " |")
        tmp = self.out / f".{TABLE_FILE}.tmp"
        tmp.write_text("\n".join(lines) + "\n")
        os.replace(tmp, self.out / TABLE_FILE)


def table_cell(row: dict, column: str) -> str:
    """One cell of the Markdown table as it is written from a row (the test reads it back)."""
    value = row.get(column)
    if column == "target" and value and row.get("target_met") is not None:
        return f"{value} ({'met' if row['target_met'] else 'not met'})"
    if column == "seconds":
        return "" if value is None else f"{value:.1f}"
    return "" if value is None else str(value).replace("|", "/").replace("\n", " ")


def read_table(path: Path) -> list[dict]:
    """The rows of a rows.md table, column -> text."""
    lines = [ln for ln in path.read_text().splitlines() if ln.startswith("| ")]
    head = [c.strip() for c in lines[0].strip("|").split("|")]
    return [dict(zip(head, (c.strip() for c in ln[2:-2].split(" | ")))) for ln in lines[1:]]


# ---------------------------------------------------------------------------- plan and budget
class Budget:
    """The run's deadline (monotonic clock) and whether an estimated cost fits before it."""

    def __init__(self, seconds: float, started: float | None = None):
        self.started = time.monotonic() if started is None else started
        self.deadline = self.started + seconds - SAFETY_S

    def left(self, reserve: float = 0.0) -> float:
        return self.deadline - reserve - time.monotonic()

    def fits(self, estimate: float, reserve: float = 0.0) -> bool:
        return estimate <= self.left(reserve)

    def why_not(self, estimate: float, reserve: float = 0.0) -> str:
        return f"budget: estimated {estimate:.0f} s, {max(self.left(reserve), 0):.0f} s left" + (
            f" after {reserve:.0f} s kept for the later steps" if reserve else ""
        )


def decoder_estimate(device: str, plan: dict, model: str, batch: int, mode: str, recorded: dict):
    """A decoder row's estimated seconds (None: leave it to PRIOR_S), from the recorded GPU
    runs (`recorded`: row -> its fields; benchmarks/gpu-runs): the steps at the TFLOP/s the
    recorded decoder row of the same mode reached, its first step (compilation) as recorded,
    and the seeded initialisation (INIT_NS_PER_PARAM); the child's start is PRIOR_S's."""
    from dlscale.models import seq_len_of, spec_for
    from dlscale.models.flops import decoder_flops_per_token

    if device != "cuda":
        return None
    base = next(
        (
            f
            for row, f in recorded.items()
            if row.startswith("MFU ") and row.endswith(f" {mode}") and f.get("achieved_tflops")
        ),
        None,
    )
    if base is None:
        return None
    spec = spec_for(model, plan["decoder_seq_len"])
    tokens = batch * seq_len_of(spec)
    step_s = decoder_flops_per_token(spec)["counted"] * tokens / (base["achieved_tflops"] * 1e12)
    warmup, steps = plan["decoder_window"]
    stepped = warmup + steps + 4  # re-warm, the attention kernel's profiled step, the probes
    init_s = INIT_NS_PER_PARAM * 1e-9 * spec.param_count
    compile_s = base.get("first_step_seconds") or 0.0
    return round(stepped * step_s + compile_s + init_s, 1)


def recorded_fields(paths) -> dict:
    """Row -> fields of the finished rows of recorded runs' rows.jsonl files."""
    out = {}
    for path in paths or ():
        for line in Path(path).read_text().splitlines():
            row = json.loads(line)
            if row.get("status") == OK and row.get("fields"):
                out[row["row"]] = row["fields"]
    return out


def child_rows(
    device: str, plan: dict, memory_bytes: float | None = None, recorded: dict | None = None
) -> list[dict]:
    """The rows of steps c-f, in order, each with its kind and parameters; the decoder rows
    (e, f) sized from the memory prediction where `memory_bytes` is given (size_decoder) and
    estimated from the recorded runs (`recorded`, decoder_estimate)."""
    rows = []
    for model, precision, batch, mode in plan["sync"]:
        rows.append(
            {
                "step": "c",
                "row": f"sync-free window {model} {precision} b{batch} {mode}",
                "kind": f"sync_{mode}",
                "args": [model, precision, batch, mode],
            }
        )
    model, precision, batch = plan["energy"]
    for kind in ("energy", "telemetry"):
        rows.append(
            {
                "step": "d",
                "row": f"{kind} {model} {precision} b{batch}",
                "kind": kind,
                "args": [model, precision, batch],
            }
        )
    llm, precision = decoder(plan), plan["decoder_precision"]
    sizing = size_decoder(plan, llm, memory_bytes)
    batch = sizing["batch"] or 1
    for mode in MODES:
        rows.append(
            {
                "step": "e",
                "row": f"MFU {llm} {precision} b{batch} {mode}",
                "kind": f"mfu_{mode}",
                "args": [llm, precision, batch, mode],
                "sizing": sizing,
                "prior": decoder_estimate(device, plan, llm, batch, mode, recorded or {}),
            }
        )
    rows.append(
        {
            "step": "f",
            "row": f"memory {llm} {precision} b{batch} fsdp world size 1",
            "kind": "memory",
            "args": [llm, precision, batch],
            "sizing": sizing,
            "prior": decoder_estimate(device, plan, llm, batch, "eager", recorded or {}),
        }
    )
    for row in rows:
        row["target"] = row_target(row["kind"], row["args"][0])
    return rows


def measured_estimates(paths: Path | list[Path] | None) -> dict[str, float]:
    """Row -> seconds from earlier runs' rows.jsonl files (their finished rows; a fidelity row's
    seconds per repetition; a later file's row wins), the estimates of this run's same rows."""
    if paths is None:
        return {}
    out = {}
    lines = []
    for path in [paths] if isinstance(paths, (str, Path)) else paths:
        lines += Path(path).read_text().splitlines()
    for line in lines:
        row = json.loads(line)
        if row.get("status") != OK or not row.get("seconds"):
            continue
        n = (row.get("fields") or {}).get("n") if row["step"] == "b" else 1
        out[row["row"]] = row["seconds"] / (n or 1)
    return out

"""Per-cell metrics files -> tidy tables (results/tables/).

ranks.csv    one row per cell and rank (long format: every rank's own measurement)
cells.csv    one row per cell: summed throughput, rank spread, speedup, efficiency, provenance
scaling.csv  one row per group and node count: median over repetitions, min/max, n
quarantine.csv  metrics files that could not be used, with the reason (never a crash)
status.csv   every planned cell: ok, failed (reason, rank, exit code, Slurm state, log tail)
             or missing (dlscale.analysis.cell_status)
systems.csv  per hardware entry, system-description field and value: cells and nodes showing it,
             and the cells whose nodes disagree (dlscale.analysis.systems_table, from the probes'
             records)

`paths` are the planned cells' metrics paths; absent ones are looked up, never an error, so
the same call builds the tables of a complete study and of a study with failed cells.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import pandas as pd

from dlscale.analysis.cell_status import cell_status
from dlscale.analysis.mfu import add_mfu, cell_columns
from dlscale.analysis.stats import add_speedup, scaling_summary, stragglers
from dlscale.analysis.systems_table import cell_systems, probe_seconds, systems_table
from dlscale.analysis.time_to_accuracy import (
    DEFAULT_VALIDITY_TOLERANCE,
    convergence_rows,
    convergence_tables,
)
from dlscale.store.measurements import earlier_measurements
from dlscale.store.metrics import MetricsError, read_metrics
from dlscale.store.pack_files import ran_beside
from dlscale.study.cell import (
    DEFAULT_PARALLELISM,
    KEY,
    cell_label,
    parse_cell_path,
    study_dir_of,
)
from dlscale.study.protocol import IDLE_PROBE, QUANTITIES, RANK_END, RANK_START
from dlscale.study.script_workload import script_columns

CELL_FIELDS = [
    "world_size",
    "ranks_per_node",
    "per_rank_batch",
    "global_batch",
    "device",
    "cpus_per_rank",
    "warmup_steps",
    "steps",
]


def pipeline_columns(cell: dict, rank_start: dict) -> dict:
    """A cell's pipeline columns: pp_degree and microbatches (1 but for a pipelined cell),
    pp_schedule (gpipe where the cell's JSON names none) and the bubble fraction its rank
    recorded (None where none was: another strategy, or a file without the bubble record)."""
    pipeline = (rank_start.get("parallelism") or {}).get("pipeline") or {}
    pipelined = cell.get("pp_degree", 1) > 1
    return {
        "pp_degree": cell.get("pp_degree", 1),
        "microbatches": cell.get("microbatches", 1),
        "pp_schedule": cell.get("pp_schedule", "gpipe") if pipelined else None,
        "bubble_fraction": pipeline.get("bubble_fraction"),
    }


def _largest(summary: dict, key: str):
    """A field of the allreduce probe's largest message size (None when not measured)."""
    probes = summary.get("allreduce") or []
    return max(probes, key=lambda p: p["bytes"])[key] if probes else None


def _scaled(value, factor):
    return None if value is None else value * factor


def rank_telemetry(rank_end: dict) -> dict:
    """A rank's telemetry columns (dlscale.study.protocol.QUANTITIES: the window's mean of each),
    None where not sampled (a quantity it could not read, or a cell measured before)."""
    quantities = (rank_end.get("telemetry") or {}).get("quantities") or {}
    return {q: (quantities.get(q) or {}).get("mean") for q in QUANTITIES}


def cell_telemetry(records: list[dict], ranks: list[dict]) -> dict:
    """A cell's telemetry columns: per quantity the mean over its ranks and the lowest and
    highest rank (`{q}_mean`, `{q}_rank_min`, `{q}_rank_max`), the fewest samples a rank took,
    and what could not be read (reasons, once each)."""
    row = {}
    for q in QUANTITIES:
        values = [r[q] for r in ranks if r.get(q) is not None]
        row[f"{q}_mean"] = sum(values) / len(values) if values else None
        row[f"{q}_rank_min"] = min(values, default=None)
        row[f"{q}_rank_max"] = max(values, default=None)
    records_t = [r["value"].get("telemetry") for r in records if r["event"] == RANK_END]
    taken = [t["samples"] for t in records_t if t]
    row["telemetry_samples_min"] = min(taken, default=None)
    reasons = sorted({f"{q}: {why}" for t in records_t if t for q, why in t["unavailable"].items()})
    row["telemetry_unavailable"] = "; ".join(reasons) or None
    return row


# what the straggler detail shows of a slow rank's telemetry, in this order: (quantity, label)
STRAGGLER_TELEMETRY = (
    ("gpu_util_pct", "GPU util"),
    ("sm_clock_mhz", "SM clock"),
    ("gpu_temperature_c", "temperature"),
    ("gpu_power_w", "power"),
    ("cpu_util_pct", "CPU util"),
    ("rss_mb", "RSS"),
)


def straggler_detail(slow: list[dict], ranks: list[dict]) -> str | None:
    """Each slow rank with its node, GPU board and telemetry beside the cell's median rank,
    e.g. 'rank 3 (n2, GPU gres:1): 61.2 samples/s vs median 80.4; GPU util 45 % (median
    97 %), SM clock 1410 MHz (median 1980 MHz)'; ranks joined by ' | '."""
    if not slow:
        return None

    def median_of(q):
        values = [r[q] for r in ranks if r.get(q) is not None]
        return statistics.median(values) if values else None

    parts = []
    for r in slow:
        where = r["node"] + (f", GPU {r['gpu']}" if r.get("gpu") else "")
        shown = []
        for q, label in STRAGGLER_TELEMETRY:
            if r.get(q) is None:
                continue
            unit = QUANTITIES[q][0]
            shown.append(f"{label} {r[q]:.0f} {unit} (median {median_of(q):.0f} {unit})")
        parts.append(
            f"rank {r['rank']} ({where}): {r['throughput_samples_per_s']:.3g} samples/s vs "
            f"median {median_of('throughput_samples_per_s'):.3g}; "
            + (", ".join(shown) or "no telemetry")
        )
    return " | ".join(parts)


# The value of a key for metrics files written before that key existed.
BEFORE_AXIS = {"mode": "eager", "workload": "throughput", "parallelism": DEFAULT_PARALLELISM}

# What a rank holds in memory (rank_end `memory`, Adapter.memory_per_rank): bytes of
# parameters, gradients and optimizer state held locally, and peak device memory.
MEMORY_BYTES = ("param_bytes", "grad_bytes", "optimizer_state_bytes")
MEMORY_PEAKS = ("peak_allocated_mb", "peak_reserved_mb")


def rank_memory(rank_end: dict) -> dict:
    """A rank's memory columns (None for a cell measured before they were recorded)."""
    memory = rank_end.get("memory") or {}
    return {k: memory.get(k) for k in MEMORY_BYTES}


# The predicted parts beside them (memory `predicted`: dlscale.frameworks.torch_memory), per
# rank; the cells table keeps the largest over the cell's ranks of each.
PREDICTED_BYTES = ("state_bytes", "activation_bytes", "total_bytes", "padding_bytes")


def cell_memory(ends: list[dict]) -> dict:
    """Per cell, the largest value over its ranks of each memory figure (the rank that must
    fit), the sum of a rank's parameter, gradient and optimizer-state bytes
    (state_bytes_per_rank_max), the predicted parts beside them (predicted_*_per_rank_max),
    the whole model's state and the shard degree (full_state_bytes / shard_degree: the exact
    shard fraction under fsdp and hsdp), and what the device peaks span (peak_scope)."""
    memories = [e.get("memory") or {} for e in ends]
    predicted = [m.get("predicted") or {} for m in memories]

    def largest(key, records=memories):
        values = [m[key] for m in records if m.get(key) is not None]
        return max(values) if values else None

    state = [sum(m[k] for k in MEMORY_BYTES) for m in memories if all(k in m for k in MEMORY_BYTES)]
    scopes = {m["peak_scope"] for m in memories if m.get("peak_scope")}
    out = {
        **{f"{k}_per_rank_max": largest(k) for k in MEMORY_BYTES},
        "state_bytes_per_rank_max": max(state) if state else None,
        **{f"{k}_max": largest(k) for k in MEMORY_PEAKS},
        # a file without peak_scope read the device's peak at the rank's end: the whole process
        "peak_scope": ", ".join(sorted(scopes))
        or ("process" if largest("peak_allocated_mb") is not None else None),
        **{f"predicted_{k}_per_rank_max": largest(k, predicted) for k in PREDICTED_BYTES},
        "full_state_bytes": largest("full_state_bytes", predicted),
        "shard_degree": largest("shard_degree", predicted),
    }
    # rank 0 estimates the activations for every rank (the same model and batch on each): the
    # largest predicted state plus them
    if out["predicted_state_bytes_per_rank_max"] is not None:
        out["predicted_total_bytes_per_rank_max"] = out["predicted_state_bytes_per_rank_max"] + (
            out["predicted_activation_bytes_per_rank_max"] or 0
        )
    return out


def _rank_rows(records: list[dict], base: dict, rank_start: dict) -> list[dict]:
    """One row per rank (its rank_end record): throughput, steps, memory, host load, device,
    telemetry, after the cell's `base` columns."""
    ranks = []
    probe = {r["rank"]: r["value"] for r in records if r["event"] == IDLE_PROBE}
    for rec in records:
        if rec["event"] != RANK_END:
            continue
        st, end = rank_start[rec["rank"]], rec["value"]
        ranks.append(
            {
                **base,
                "rank": rec["rank"],
                "local_rank": st["local_rank"],
                "node": st["node"],
                "node_index": st["node_index"],
                "throughput_samples_per_s": end["throughput_samples_per_s"],
                "step_seconds_median": end["step_seconds_median"],
                "timed_steps": end["steps"],
                "peak_rss_mb": end["peak_rss_mb"],
                **rank_memory(end),
                "loadavg_1m": st["loadavg_1m"],
                "threads": st["threads"],
                "host_busy_cpus": probe.get(rec["rank"], {}).get("busy_cpus"),
                "device_model": st["device_model"],
                "gpu": (st.get("gpu") or {}).get("key"),
                **rank_telemetry(end),
            }
        )
    return ranks


def llm_step_columns(cell: dict, records: list[dict]) -> dict:
    """A cell's attention setting and the kernel that ran (rank 0's rank_end
    `attention_kernel`: torch.profiler's operator names after the window), its compiled loss,
    what world size 1 ran, and the trace rank 0 wrote (rank_end `trace`)."""
    end = next((r["value"] for r in records if r["event"] == RANK_END and r.get("rank") == 0), {})
    kernel = end.get("attention_kernel") or {}
    world = cell.get("nodes", 1) * cell.get("ranks_per_node", 1)
    return {
        "attention": cell.get("attention"),
        "attention_kernel": kernel.get("kernel") if kernel.get("available") else None,
        "compile_loss": bool(cell.get("compile_loss", False)),
        "single_device": cell.get("single_device", "plain") if world == 1 else None,
        "trace": (end.get("trace") or {}).get("path"),
    }


def _measured_columns(records: list[dict], first: dict) -> dict:
    """A cell row's measured columns from its records (run_start, summary) and rank 0's
    rank_start (`first`): throughput, FLOPs, hosts, timer, communication, energy, memory,
    shared boards."""
    start, summary = records[0]["value"], records[-1]["value"]
    cell, prov = start["cell"], start["provenance"]
    return {
        "throughput_samples_per_s": summary["throughput_samples_per_s"],
        "rank_throughput_min": summary["rank_throughput_min"],
        "rank_throughput_median": summary["rank_throughput_median"],
        "rank_throughput_max": summary["rank_throughput_max"],
        "step_seconds_median": summary["step_seconds_median"],
        # tokens and model FLOPs (dlscale.analysis.mfu); MFU is added from the hardware file
        # (add_mfu)
        **cell_columns(cell, summary, first),
        "nodes_seen": len(summary["nodes_seen"]),
        "hosts": " ".join(prov["hosts"]),
        "wall_seconds": summary["wall_seconds"],
        "compute_seconds_median": summary.get("compute_seconds_median"),
        "compile_seconds": summary.get("compile_seconds"),
        "timer": first.get("timer"),
        "wrapper": first.get("wrapper"),
        "fast_paths": " ".join(
            f"{k}={v}" for k, v in sorted((first.get("fast_paths") or {}).items()) if v is not None
        )
        or None,
        "comm_fraction": summary.get("comm_fraction"),
        "allreduce_bytes": _largest(summary, "bytes"),
        "allreduce_busbw_gb_per_s": _scaled(_largest(summary, "busbw_bytes_per_s"), 1e-9),
        "allreduce_algbw_gb_per_s": _scaled(_largest(summary, "algbw_bytes_per_s"), 1e-9),
        "joules_per_sample": summary.get("joules_per_sample"),
        "energy_unavailable": summary.get("energy_unavailable"),
        "energy_short_window": summary.get("energy_short_window"),
        "peak_rss_mb_max": summary.get("peak_rss_mb_max"),
        "peak_device_memory_mb_max": max(
            (
                r["value"].get("peak_device_memory_mb") or 0
                for r in records
                if r["event"] == RANK_END
            ),
            default=0,
        )
        or None,
        **cell_memory([r["value"] for r in records if r["event"] == RANK_END]),
        "tp_degree": cell.get("tp_degree", 1),
        # a pipeline's stages, micro-batches, schedule and idle share (rank 0's record;
        # dlscale.frameworks.torch_pipeline); 1, 1, None, None for every other strategy
        **pipeline_columns(cell, first),
        # the optimizer (absent: SGD, every cell before the choice) and FSDP2's mixed precision
        "optimizer": cell.get("optimizer", "sgd"),
        "fsdp_mixed_precision": bool(cell.get("fsdp_mixed_precision", False)),
        # the tensor-parallel plan, activation checkpointing and what "compiled" compiles
        # (absent: their cell.LATER_FIELDS values, blocks, none, model)
        "tp_plan": cell.get("tp_plan", "blocks") if cell.get("tp_degree", 1) > 1 else None,
        "activation_checkpointing": cell.get("activation_checkpointing", "none"),
        "compile_scope": cell.get("compile_scope", "model")
        if cell.get("mode") == "compiled"
        else None,
        # the LLM step's settings (absent: their cell.LATER_FIELDS values) and what rank 0
        # measured after the window: the attention kernel that ran, the trace it wrote
        **llm_step_columns(cell, records),
        "competing": summary["competing"],
        # ranks of one node that used one GPU board (dlscale.store.metrics_summary.shared_gpus):
        # "n1:0,1"
        "shared_gpu_ranks": " ".join(
            f"{s['node']}:{','.join(map(str, s['ranks']))}"
            for s in summary.get("shared_gpus") or []
        ),
    }


def beside_cells(path: str, allocation) -> str:
    """The cells whose job steps ran beside this cell's in its pack's allocation, on other nodes
    (dlscale.store.pack_files.ran_beside), by their folders under runs/; empty for a cell that
    had its allocation to itself."""
    study = study_dir_of(path)
    if study is None or not allocation:
        return ""
    runs = f"{study.as_posix()}/runs/"
    return " ".join(
        str(Path(other).parent).removeprefix(runs) for other in ran_beside(study, path, allocation)
    )


def cell_rows(
    records: list[dict], path: str, straggler_threshold: float
) -> tuple[dict, list[dict]]:
    start, summary = records[0]["value"], records[-1]["value"]
    cell, prov = start["cell"], start["provenance"]
    base = {
        "study": start["study"],
        **{k: cell.get(k, BEFORE_AXIS.get(k)) for k in KEY},
        **{k: cell[k] for k in CELL_FIELDS},
        # whether its path names its ranks per node (cell_label; config axes.ranks_per_node)
        "ranks_in_path": cell.get("ranks_in_path", False),
    }
    rank_start = {r["rank"]: r["value"] for r in records if r["event"] == RANK_START}
    ranks = _rank_rows(records, base, rank_start)
    slow = stragglers([r["throughput_samples_per_s"] for r in ranks], straggler_threshold)
    row = {
        **base,
        **_measured_columns(records, rank_start[0]),
        "straggler": bool(slow),
        "straggler_ranks": " ".join(str(ranks[i]["rank"]) for i in slow),
        "straggler_detail": straggler_detail([ranks[i] for i in slow], ranks),
        **cell_telemetry(records, ranks),
        "host_busy_cpus_max": summary["host_busy_cpus_max"],
        "device_model": prov["device_model"],
        "libraries": " ".join(f"{k}={v}" for k, v in sorted(prov["libraries"].items())),
        "python": prov["python"],
        "launcher": prov["launcher"],
        "slurm_job_id": prov["slurm_job_id"],
        # a packed cell: the cells that ran beside it in its allocation (config pack_steps)
        "ran_beside": beside_cells(path, prov["slurm_job_id"]),
        "git_commit": prov["git_commit"],
        "config_hash": start["config_hash"],
        "probe_seconds_max": max(probe_seconds(records), default=None),
        "metrics_path": path,
        "earlier_measurements": earlier_measurements(Path(path)),
    }
    if cell.get("workload") == "script":  # a user's script: its unit, hash and command
        row.update(script_columns(cell, start, row["throughput_samples_per_s"]))
    return row, ranks


def collect(
    paths: list[str], straggler_threshold: float = 0.1
) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """ranks, cells, scaling, quarantine and status tables (collect_tables: and systems)."""
    tables = collect_tables(paths, straggler_threshold)
    return tuple(tables[k] for k in ("ranks", "cells", "scaling", "quarantine", "status"))


# The convergence workload's tables (dlscale.analysis.time_to_accuracy), beside the throughput
# tables.
CONVERGENCE_TABLES = ("convergence", "epochs", "time_to_accuracy")


def collect_tables(
    paths: list[str],
    straggler_threshold: float = 0.1,
    validity_tolerance: float = DEFAULT_VALIDITY_TOLERANCE,
    peaks: dict | None = None,
) -> dict[str, pd.DataFrame]:
    """Every table, by name: ranks, cells, scaling (throughput cells), quarantine, status
    (every planned cell), systems, and convergence, epochs, time_to_accuracy (convergence
    cells; dlscale.analysis.time_to_accuracy; `validity_tolerance`:
    convergence.validity_tolerance)."""
    cells, ranks, quarantine, status, seen, systems = [], [], [], [], {}, []
    conv_cells, conv_epochs = [], []
    for path in paths:
        if not Path(path).exists():
            status.append(cell_status(str(path), ok=False))
            continue
        try:
            records = read_metrics(path, steps=False)
            row, rank_rows = cell_rows(records, str(path), straggler_threshold)
            key = tuple(row[k] for k in KEY)
            named = parse_cell_path(str(path))
            if {k: row[k] for k in named} != named:
                raise MetricsError(
                    f"holds cell {dict(zip(KEY, key))} of study "
                    f"{row['study']!r}, not the cell its path names"
                )
            if key in seen:
                raise MetricsError(f"duplicate of cell {key} already read from {seen[key]}")
            if row["workload"] == "convergence":
                conv_row, epoch_rows = convergence_rows(records, row)
        except MetricsError as exc:
            reason = str(exc)
        except (KeyError, TypeError, IndexError, StopIteration) as exc:
            reason = f"inconsistent records: {exc!r}"
        else:
            seen[key] = path
            systems.extend(cell_systems(records, cell_label(row)))
            if row["workload"] == "convergence":
                conv_cells.append(conv_row)
                conv_epochs.extend(epoch_rows)
            else:
                cells.append(row)
                ranks.extend(rank_rows)
            status.append(cell_status(str(path), ok=True))
            continue
        quarantine.append({"metrics_path": str(path), "reason": reason})
        status.append(cell_status(str(path), ok=False, invalid_reason=reason))
    cells_df = add_speedup(
        pd.DataFrame(
            cells,
            columns=None
            if cells
            else [
                "study",
                *KEY,
                *(f for f in CELL_FIELDS if f not in KEY),
                "throughput_samples_per_s",
                "competing",
                "straggler",
            ],
        )
    )
    # MFU against the hardware file's dense peaks (`peaks`: dlscale.analysis.mfu.hardware_peaks)
    cells_df = add_mfu(cells_df, peaks)
    ranks_df = pd.DataFrame(ranks)
    quarantine_df = pd.DataFrame(quarantine, columns=["metrics_path", "reason"])
    status_df = pd.DataFrame(status).astype({"failed_rank": "Int64", "exit_code": "Int64"})
    return {
        "ranks": ranks_df,
        "cells": cells_df,
        "scaling": scaling_summary(cells_df),
        "quarantine": quarantine_df,
        "status": status_df,
        "systems": systems_table(systems),
        **convergence_tables(conv_cells, conv_epochs, validity_tolerance),
    }


def write_named_tables(
    paths: list[str],
    outputs: dict[str, str],
    straggler_threshold: float,
    log: str | None = None,
    validity_tolerance: float = DEFAULT_VALIDITY_TOLERANCE,
    peaks: dict | None = None,
) -> None:
    """write_tables with the outputs by table name (rule collect's named outputs)."""
    write_tables(
        list(paths),
        *(outputs[k] for k in ("ranks", "cells", "scaling", "quarantine", "status")),
        straggler_threshold=straggler_threshold,
        log=log,
        systems_csv=outputs.get("systems"),
        convergence_csvs={k: outputs[k] for k in CONVERGENCE_TABLES if k in outputs},
        validity_tolerance=validity_tolerance,
        peaks=peaks,
    )


def write_tables(
    paths: list[str],
    ranks_csv: str,
    cells_csv: str,
    scaling_csv: str,
    quarantine_csv: str,
    status_csv: str,
    straggler_threshold: float,
    log: str | None = None,
    systems_csv: str | None = None,
    convergence_csvs: dict[str, str] | None = None,
    validity_tolerance: float = DEFAULT_VALIDITY_TOLERANCE,
    peaks: dict | None = None,
) -> None:
    """The tables as CSV files; `convergence_csvs`: CONVERGENCE_TABLES name -> path; `peaks`:
    each hardware key's dense peak_tflops (MFU; dlscale.analysis.mfu.hardware_peaks)."""
    started = time.perf_counter()
    tables = collect_tables(paths, straggler_threshold, validity_tolerance, peaks)
    outs = {
        "ranks": ranks_csv,
        "cells": cells_csv,
        "scaling": scaling_csv,
        "quarantine": quarantine_csv,
        "status": status_csv,
        "systems": systems_csv,
        **(convergence_csvs or {}),
    }
    for name, out in outs.items():
        if out is None:
            continue
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        tables[name].to_csv(out, index=False)
    tables = [tables[k] for k in ("ranks", "cells", "scaling", "quarantine", "status")]
    if log:
        status = tables[4]["status"].value_counts().to_dict() if len(tables[4]) else {}
        Path(log).parent.mkdir(parents=True, exist_ok=True)
        Path(log).write_text(
            f"{len(paths)} planned cells: {status.get('ok', 0)} ok, {status.get('failed', 0)} "
            f"failed, {status.get('missing', 0)} missing; {len(tables[3])} metrics files "
            f"quarantined; {len(tables[1])} cell rows, {len(tables[0])} rank rows, "
            f"{len(tables[2])} scaling rows in {time.perf_counter() - started:.2f} s\n"
        )

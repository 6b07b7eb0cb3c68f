"""Every GPU check of the project in one call that fits a few minutes on one GPU.

    python benchmarks/gpu_suite.py OUT [--budget 300] [--device cuda|cpu] [--wheels DIR]
        [--steps a,b,c,d,e,f] [--rows compiled,...] [--estimates OLD/rows.jsonl ...]
        [--hardware KEY]

Runs, in this order, as much as fits in `--budget` seconds, one row per check:
  a. environment: the GPU (model, UUID, PCI bus id, memory, driver: dlscale.rank.node_probes'
     nvidia-smi section; clocks and power limit from NVML), CUDA, cuDNN and NCCL versions; the
     capability check (dlscale.workflow.capability on this torch, the device's sm_XY in the
     build's architectures) and the device choice (dlscale.rank.devices.pick_gpu, gpu_identity,
     the NVML board found by production's nvml_handle);
  b. fidelity: the project's one-rank cell (dlscale.run.launch) against the plain loop, through
     benchmarks/gpu_fidelity.py (its `harness` and `plain` sides: the engine of this step),
     ResNet-50 bf16 b256 and fp32 b32, eager rows then compiled rows, the sides alternating
     within a row; medians, ranges, n. Every process of the run shares one inductor cache
     (TORCHINDUCTOR_CACHE_DIR), so a compiled model is compiled once and loaded after;
  c. sync-free window: the production step (dlscale.frameworks.pytorch.Adapter) under the
     production timing loop (dlscale.rank.timing.run_timed) with
     torch.cuda.set_sync_debug_mode("error") over the timed steps and the production SyncAudit
     counting the host synchronisations inside the window (goal 0);
  d. energy: the production meter's board counter (dlscale.rank.energy, NVML total energy) over
     a window of >= 10 s against NVML power sampled over the same window by the same module
     (its sampled method), the difference in % (goal <= 5 %); telemetry: the rank's record
     (dlscale.rank.telemetry) of that window, every quantity non-empty;
  e. MFU: the largest decoder of the registry (llama3_1b where registered, else gpt2_124m), bf16,
     eager and compiled: FLOPs per token as the rank counts them (dlscale.models.flops through
     the adapter), tokens/s over the production window, MFU against the dense peak of the
     hardware entry whose device_model is this GPU (dlscale.analysis.mfu; --hardware KEY to
     name it);
  f. memory: the same model with parallelism fsdp at world size 1: the peak allocated over the
     timed window (peak statistics reset at its first step) and the state the adapter reports
     (parameters, gradients, optimizer state: memory_per_rank) against the predicted parts.

Each finished row is written at once to OUT/rows.jsonl (one JSON object per line) and
OUT/rows.md (the same rows as a Markdown table, rewritten whole from the JSON lines, by rename),
so a run killed from outside still leaves every row it finished (SIGTERM and SIGINT also kill
the suite's children). Before each row the suite compares its estimated cost (PRIOR_S; an
earlier run's measured seconds with --estimates; a fidelity row's own last repetition) with the
time left, less the cheapest row of every later step; a row that does not fit is written as
skipped with the estimate and the time left, and the child processes are killed at the budget
(a row cut there is written as skipped, never half). Rows that cannot run on the device are
skipped with the reason (GPU only). A row whose code raises is written as failed with the
error, and the suite exits 1. `--rows` keeps the rows of steps b-f whose names contain one of
its words (a rerun of what a first call skipped: `--rows compiled`).

Needs only this checkout and a CUDA PyTorch with numpy: steps c-f import neither Snakemake,
PyYAML nor jsonschema; the fidelity step's launcher validates the cell's metrics file with
jsonschema, the MFU row reads config/hardware.yaml with PyYAML, and steps a, d read NVML with
nvidia-ml-py: where they are missing, `--wheels DIR` installs them from the wheels in DIR into a
temporary folder for this run only (gpu_fidelity.provide_harness_packages; benchmarks/README.md
has the download command, about 1.5 MiB in all).

`--device cpu` is the CPU path the test command runs (tests/unit/benchmarks/test_gpu_suite.py): tiny
models (cnn_small, gpt2_tiny), fp32, eager; the GPU-only rows (the energy counter, compiled rows)
are written as skipped with the reason.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import gc
import json
import math
import os
import platform
import queue
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path
from types import SimpleNamespace

REPO = Path(__file__).resolve().parents[1]
for _path in (REPO / "scripts", Path(__file__).resolve().parent):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

import gpu_fidelity as fidelity  # noqa: E402 (the fidelity step's engine, beside this file)

FORMAT, VERSION = "dlscale-gpu-suite", 1
ROWS_FILE, TABLE_FILE = "rows.jsonl", "rows.md"
OK, SKIPPED, FAILED = "ok", "skipped", "failed"
ROW_PREFIX = "@@gpu-suite-row "  # a child's row on its stdout
SAFETY_S = 2.0  # the budget's end, less this: time to write the last row and stop
BREAK_ENV = "DLSCALE_GPU_SUITE_BREAK"  # "<kind>": that row's code raises (tests)
INDUCTOR_CACHE = "inductor-cache"

# What each device runs. CUDA: the targets' cases (TARGETS); CPU: tiny models, fp32, eager (the
# CPU path of the test command).
PLANS = {
    "cuda": {
        "fidelity_cases": [("resnet50", "bf16", 256), ("resnet50", "fp32", 32)],
        "fidelity_warmup": 10,
        "fidelity_steps": 30,
        "fidelity_repeats": 5,
        "threads": 1,
        "sync": [
            ("resnet50", "bf16", 256, "eager"),
            ("resnet50", "bf16", 256, "compiled"),
            ("resnet50", "fp16", 64, "eager"),
        ],
        "window": (5, 20),  # warm-up, timed steps of rows c, e and f
        "energy": ("resnet50", "bf16", 256),
        "energy_window_s": 12.0,
        "decoders": ("llama3_1b", "gpt2_124m"),
        "decoder_batch": 2,  # torchtitan's 16,384 tokens per GPU step at 8,192; 1 where memory says
        "decoder_seq_len": 8192,
        "decoder_window": (3, 15),  # warm-up, timed steps of rows e and f
        "decoder_precision": "bf16",
    },
    "cpu": {
        "fidelity_cases": [("cnn_small", "fp32", 8)],
        "fidelity_warmup": 2,
        "fidelity_steps": 5,
        "fidelity_repeats": 1,
        "threads": 1,
        "sync": [("cnn_small", "fp32", 8, "eager"), ("cnn_small", "fp32", 8, "compiled")],
        "window": (2, 4),
        "energy": ("cnn_small", "fp32", 8),
        "energy_window_s": 0.5,
        "decoders": ("gpt2_tiny",),
        "decoder_batch": 4,
        "decoder_seq_len": None,  # the model's own
        "decoder_window": (2, 4),
        "decoder_precision": "fp32",
    },
}
MODES = ("eager", "compiled")
CPU_COMPILED = (
    "the CPU path runs eager only: inductor's C++ compile of even a tiny model takes tens of "
    "seconds on a 2-core host (benchmarks/reports/2026-11-23-measurement-fidelity.md: 38.8 s); "
    "compiled rows run on CUDA"
)
GPU_ONLY_ENERGY = (
    "GPU only: NVML's board energy counter against NVML power sampled over the same window"
)

# Estimated seconds of each kind of row before it has run (first GPU run: guesses from the
# figures in benchmarks/reports/ and the sizes of the models; a process start with CUDA costs
# ~5-10 s, compiling ResNet-50 or GPT-2 small ~40-90 s on a cold cache). A repeated fidelity
# row uses its own last repetition instead. The child processes are killed at the budget
# whatever these say.
PRIOR_S = {
    "cuda": {
        "environment": 10,
        "fidelity_eager": 20,  # one side (a process): start, warm-up, 30 steps
        "fidelity_compiled": 55,  # one side: ~80 s compiling cold, ~30 s from the shared cache
        "child": 15,  # the child of steps c-f: start, torch, CUDA
        "sync_eager": 15,
        "sync_compiled": 60,
        "energy": 30,
        "mfu_eager": 20,
        "mfu_compiled": 90,
        "memory": 15,
    },
    "cpu": {  # this 2-core host: a child's start ~2.5 s, a row of steps c-f 1-4 s
        "environment": 2,
        "fidelity_eager": 8,
        "fidelity_compiled": 60,
        "child": 3,
        "sync_eager": 2,
        "sync_compiled": 60,
        "energy": 2,
        "mfu_eager": 2,
        "mfu_compiled": 60,
        "memory": 2,
    },
}
# The decoder rows (e, f) train as torchtitan trains Llama 3 (a comparable MFU): AdamW with
# its settings and clipping, bf16 through FSDP2 at degree 1 (its MixedPrecisionPolicy, no
# autocast), the attention kernels in auto's order, per-block compile with the loss compiled
# (mode compiled), no activation checkpointing.
DECODER_TRAINING = {
    "optimizer": "adamw",
    "adam_beta1": 0.9,
    "adam_beta2": 0.95,
    "adam_eps": 1e-8,
    "weight_decay": 0.1,
    "grad_clip_norm": 1.0,
    "learning_rate": 3e-4,
    "activation_checkpointing": "none",
    "attention": "auto",
    "single_device": "fully_shard",
}
# What a row's time is made of beyond its steps (the decoder rows' estimates, decoder_estimate):
# seeded initialisation on the host, measured on this 2-core VM (torch.nn.init.trunc_normal_ of
# 50 M float32 on one thread: 1.31 s, i.e. 26 ns per parameter; normal_ 0.53 s), rounded up.
INIT_NS_PER_PARAM = 30
DEFAULT_HEADROOM_GIB = 1.0  # a GPU entry without memory_headroom_gib (dlscale.study.partitions)
RECORDED_RUNS = REPO / "benchmarks" / "gpu-runs"  # the recorded GPU runs (--estimates default)

# The targets, reported beside each row, never gated on
TARGETS = {
    ("resnet50", "bf16", 256): 0.99,
    ("resnet50", "fp32", 32): 0.97,
}
ENERGY_TARGET_PCT = 5.0
MFU_TARGET = 0.45  # llama3_1b bf16 compiled (MosaicML MPT-1B at 8,192 on H100: 0.377)
MEMORY_TARGET_PCT = 10.0


class Stopped(BaseException):
    """The suite was stopped by a signal (SIGTERM, SIGINT): no more rows."""


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


def decoder(plan: dict) -> str:
    """The largest decoder of the plan's list that the registry has (llama3_1b once the Llama
    family is registered, gpt2_124m until then)."""
    from dlscale.models import SPECS

    return next(m for m in plan["decoders"] if m in SPECS)


def decoder_settings(plan: dict, mode: str) -> dict:
    """The TrainSpec settings of a decoder row (DECODER_TRAINING; compiled: each block and the
    loss; bf16/fp16: FSDP2's mixed precision at degree 1)."""
    compiled = mode == "compiled"
    return {
        **DECODER_TRAINING,
        "seq_len": plan["decoder_seq_len"],
        "compile_scope": "block" if compiled else "model",
        "compile_loss": compiled,
        "fsdp_mixed_precision": plan["decoder_precision"] != "fp32",
    }


def predicted_memory(model: str, seq_len: int | None, batch: int, precision: str) -> dict:
    """A decoder row's predicted peak device memory (bytes), from production's prediction
    (dlscale.frameworks.torch_memory.activation_bytes on the meta device) and the state AdamW
    holds under FSDP2 at degree 1: float32 parameters, gradients and two moments (16 B per
    parameter), a bf16 copy of the parameters (all-gathered for the forward and backward: 2 B),
    the activations (key/value heads repeated: the larger of the two layouts), and the step's
    largest temporary, the float32 gradient of the logits (tokens x vocabulary x 4 B)."""
    import torch

    from dlscale.frameworks.torch_memory import activation_bytes
    from dlscale.models import seq_len_of, spec_for

    spec = spec_for(model, seq_len)
    n = spec.param_count
    dtype = None if precision == "fp32" else torch.bfloat16
    act = activation_bytes(model, seq_len, batch, dtype, "none", gqa=False)
    if not act.get("available"):
        raise RuntimeError(f"no activation prediction for {model}: {act.get('reason')}")
    tokens = batch * (seq_len_of(spec) or 1)
    parts = {
        "state_bytes": 16 * n,
        "low_precision_params_bytes": 0 if dtype is None else 2 * n,
        "activation_bytes": act["bytes"],
        "logits_gradient_bytes": tokens * spec.vocab_size * 4,
    }
    return {**parts, "total_bytes": sum(parts.values()), "param_count": n, "batch": batch}


def size_decoder(plan: dict, model: str, memory_bytes: float | None) -> dict:
    """The decoder rows' per-rank batch, chosen before they run: the plan's, halved while the
    prediction (predicted_memory) exceeds the device's memory less its headroom (`memory_bytes`:
    None, no sizing: the plan's batch); {"batch": None} where batch 1 does not fit either."""
    batch = plan["decoder_batch"]
    if memory_bytes is None:
        return {"batch": batch, "sized": False}
    tried = []
    while batch >= 1:
        pred = predicted_memory(model, plan["decoder_seq_len"], batch, plan["decoder_precision"])
        tried.append(pred)
        if pred["total_bytes"] <= memory_bytes:
            return {"batch": batch, "sized": True, "memory_bytes": memory_bytes, "tried": tried}
        batch //= 2
    return {"batch": None, "sized": True, "memory_bytes": memory_bytes, "tried": tried}


def device_memory_bytes(device: str, entry: dict | None) -> float | None:
    """What a rank may use on this device: the GPU's total memory (CUDA) or the hardware
    entry's device_memory_gib (a dry run), less memory_headroom_gib (1 GiB where unstated)."""
    headroom = (entry or {}).get("memory_headroom_gib")
    headroom = DEFAULT_HEADROOM_GIB if headroom is None else headroom
    if entry is not None and entry.get("device_memory_gib"):
        return (entry["device_memory_gib"] - headroom) * 2**30
    if device == "cuda":
        import torch

        return torch.cuda.get_device_properties(0).total_memory - headroom * 2**30
    return None


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


def does_not_fit(row: dict) -> str | None:
    """Why a decoder row is not run: its prediction exceeds the device's memory at batch 1."""
    sizing = row.get("sizing") or {}
    if not sizing.get("sized") or sizing.get("batch"):
        return None
    pred = sizing["tried"][-1]
    return (
        f"memory: predicted {pred['total_bytes'] / 2**30:.1f} GiB at batch 1 > "
        f"{sizing['memory_bytes'] / 2**30:.1f} GiB usable"
    )


def row_target(kind: str, model: str) -> str | None:
    """The target of a row of steps c-f, as the table shows it (reported, not gated)."""
    if kind.startswith("sync"):
        return "0 host syncs in the window"
    if kind == "energy":
        return f"counter vs sampled within {ENERGY_TARGET_PCT:g} %, window >= 10 s"
    if kind == "telemetry":
        return "every quantity non-empty"
    if kind == "mfu_compiled" and model == "llama3_1b":
        return f"MFU >= {MFU_TARGET:g}"
    if kind == "memory":
        return f"within {MEMORY_TARGET_PCT:g} % of the prediction"
    return None


def not_here(device: str, kind: str) -> str | None:
    """Why a row does not run on this device (None: it runs)."""
    if device == "cuda":
        return None
    if kind.endswith("_compiled"):
        return CPU_COMPILED
    if kind == "energy":
        return GPU_ONLY_ENERGY
    return None


def row_estimate(device: str, kind: str, spec: dict | None = None) -> float:
    """A row's estimated seconds: what an earlier run measured (--estimates), else PRIOR_S."""
    if spec is not None and spec.get("estimate") is not None:
        return float(spec["estimate"])
    if spec is not None and spec.get("prior") is not None:  # from the recorded runs
        return float(spec["prior"])
    return float(PRIOR_S[device][kind if kind != "telemetry" else "energy"])


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


def kept_for_later(device: str, specs: list[dict], step: str) -> float:
    """Seconds a row of `step` leaves to the steps after it: the estimate of the cheapest row
    each later step can run here, so that every step gets its go (compiled rows, the dearest,
    take what is left)."""
    kept = 0.0
    for later in sorted({s["step"] for s in specs if s["step"] > step}):
        runnable = [
            row_estimate(device, s["kind"], s)
            for s in specs
            if s["step"] == later and not not_here(device, s["kind"])
        ]
        kept += min(runnable, default=0.0)
    return kept


# ---------------------------------------------------------------------------- a: environment
def environment(device: str) -> dict:
    """Step a: what runs here, the capability check and the device choice (production code)."""
    import torch

    from dlscale.rank import node_probes
    from dlscale.rank.devices import gpu_identity, nvml_handle, pick_gpu
    from dlscale.registry.frameworks import FRAMEWORKS

    site = Path(torch.__file__).resolve().parents[1]
    drives, says = FRAMEWORKS["pytorch"].cuda_probe(site)  # the capability check's own probe
    fields = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda_runtime": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "cpu": node_probes.cpu_facts().get("model"),
        "capability_check": {"drives_cuda": drives, "says": says, "site_packages": str(site)},
    }
    if device != "cuda":
        fields["device_choice"] = "cpu: no GPU (--device cpu)"
        fields["gpu"] = "none: --device cpu"
        return {
            "fields": fields,
            "result": f"CPU {fields['cpu']}; torch {torch.__version__}; capability: {says}",
        }
    if not torch.cuda.is_available():
        raise RuntimeError(f"--device cuda, but torch sees no GPU ({says})")
    nccl = torch.cuda.nccl.version() if torch.distributed.is_nccl_available() else None
    fields["nccl"] = ".".join(map(str, nccl)) if isinstance(nccl, tuple) else nccl
    from dlscale.frameworks.torch_model import torch_gpu_identity

    ordinal = pick_gpu(0, 1, torch.cuda.device_count())
    gpu = gpu_identity(ordinal, **{k: v for k, v in torch_gpu_identity(ordinal).items() if v})
    major, minor = torch.cuda.get_device_capability(ordinal)
    arch = f"sm_{major}{minor}"
    limit = FRAMEWORKS["pytorch"].cuda_limit
    fields["device_choice"] = gpu
    fields["compute_capability"] = f"{major}.{minor}"
    fields["build_archs"] = torch.cuda.get_arch_list()
    fields["build_drives_device"] = arch in torch.cuda.get_arch_list() or any(
        a.startswith("compute_") and int(a.split("_")[1]) <= major * 10 + minor
        for a in torch.cuda.get_arch_list()
    )
    fields["framework_cuda_limit"] = limit
    fields["gpu"] = node_probes.gpu_facts()
    fields["nvml"] = nvml_facts(gpu, nvml_handle)
    name = gpu.get("name") or torch.cuda.get_device_name(ordinal)
    return {
        "fields": fields,
        "result": f"{name} ({gpu['key']}), driver "
        f"{fields['nvml'].get('driver', '?')}, CUDA {torch.version.cuda}, NCCL {fields['nccl']}; "
        f"{arch} in the build: {fields['build_drives_device']}; {says}",
    }


def nvml_facts(gpu: dict, nvml_handle) -> dict:
    """Driver, clocks and power limits of the rank's board (NVML; found as production finds
    it), or why not."""
    try:
        import pynvml as n

        n.nvmlInit()
        handle, how = nvml_handle(n, gpu)
    except Exception as exc:  # noqa: BLE001 (no NVML: say why)
        return {"available": False, "reason": repr(exc)}
    out = {"available": True, "board_by": how}
    reads = {
        "driver": lambda: n.nvmlSystemGetDriverVersion(),
        "name": lambda: n.nvmlDeviceGetName(handle),
        "uuid": lambda: n.nvmlDeviceGetUUID(handle),
        "sm_clock_mhz": lambda: n.nvmlDeviceGetClockInfo(handle, n.NVML_CLOCK_SM),
        "sm_clock_max_mhz": lambda: n.nvmlDeviceGetMaxClockInfo(handle, n.NVML_CLOCK_SM),
        "mem_clock_max_mhz": lambda: n.nvmlDeviceGetMaxClockInfo(handle, n.NVML_CLOCK_MEM),
        "sm_application_clock_mhz": lambda: n.nvmlDeviceGetApplicationsClock(
            handle, n.NVML_CLOCK_SM
        ),
        "power_limit_w": lambda: n.nvmlDeviceGetPowerManagementLimit(handle) / 1000,
        "power_limit_enforced_w": lambda: n.nvmlDeviceGetEnforcedPowerLimit(handle) / 1000,
        "energy_counter_mj": lambda: n.nvmlDeviceGetTotalEnergyConsumption(handle),
        "persistence_mode": lambda: n.nvmlDeviceGetPersistenceMode(handle),
    }
    for key, read in reads.items():
        try:
            value = read()
            out[key] = value.decode() if isinstance(value, bytes) else value
        except Exception as exc:  # noqa: BLE001 (one fact missing is recorded)
            out[key] = f"unavailable: {exc}"
    return out


# ---------------------------------------------------------------------------- b: fidelity
def fidelity_rows(
    a, budget: Budget, rows: Rows, python: str, work: Path, first_reserve: float, reserve_after
) -> None:
    """Step b: per case, eager rows then compiled rows; in a row, the harness and the plain
    loop alternate (the harness first in odd repetitions), up to the plan's repetitions. The
    first repetition of a row runs if it fits the budget less `first_reserve` (the cheapest
    row of each later step); each further one only if it also leaves the estimates of every
    later row (`reserve_after(row index)`)."""
    device, plan = a.device, a.plan
    side = SimpleNamespace(
        threads=plan["threads"], warmup=plan["fidelity_warmup"], steps=plan["fidelity_steps"]
    )
    cases = plan["fidelity_cases"]
    specs = [(case, mode) for mode in MODES for case in cases]
    for index, (case, mode) in enumerate(specs):
        model, precision, batch = case
        name = f"fidelity {model} {precision} b{batch} {mode}"
        if not wanted(a, name):
            continue
        target = TARGETS.get(case)
        base = {
            "step": "b",
            "row": name,
            "target": f"harness/plain >= {target}" if target else None,
        }
        why = not_here(device, f"fidelity_{mode}")
        if why:
            rows.write({**base, "status": SKIPPED, "reason": why})
            continue
        started = time.monotonic()
        estimate = a.measured.get(name, 2 * PRIOR_S[device][f"fidelity_{mode}"])
        h, q, reps, stop = [], [], [], None
        try:
            if BREAK_ENV in os.environ and os.environ[BREAK_ENV] == "fidelity":
                raise RuntimeError(f"{BREAK_ENV}=fidelity: a deliberate break (tests)")
            for r in range(plan["fidelity_repeats"]):
                reserve = first_reserve if r == 0 else reserve_after(index)
                if not budget.fits(estimate, reserve):
                    stop = budget.why_not(estimate, reserve)
                    break
                rep_started = time.monotonic()
                order = ("harness", "plain") if r % 2 == 0 else ("plain", "harness")
                for which in order:
                    timeout = max(budget.left(), 1.0)
                    if which == "harness":
                        h.append(fidelity.harness(case, device, mode, side, python, work, timeout))
                    else:
                        q.append(fidelity.plain(case, device, mode, side, python, timeout))
                reps.append(time.monotonic() - rep_started)
                estimate = reps[-1]  # a repetition costs what the last one did
        except fidelity.SideTimeout as exc:
            stop = f"budget: stopped at the budget in repetition {len(reps) + 1} ({exc})"
        except BaseException as exc:  # noqa: BLE001 (SystemExit from a side: its stderr)
            if isinstance(exc, (KeyboardInterrupt, Stopped)):
                raise
            rows.write(failed(base, exc, time.monotonic() - started))
            continue
        n = min(len(h), len(q))
        h, q = h[:n], q[:n]
        if not n:
            rows.write(
                {
                    **base,
                    "status": SKIPPED,
                    "reason": stop,
                    "seconds": time.monotonic() - started,
                }
            )
            continue
        hm, qm = statistics.median(h), statistics.median(q)
        ratio = hm / qm
        fields = {
            "model": model,
            "precision": precision,
            "per_rank_batch": batch,
            "mode": mode,
            "warmup_steps": side.warmup,
            "steps": side.steps,
            "harness_samples_per_s": h,
            "plain_samples_per_s": q,
            "harness_median": hm,
            "plain_median": qm,
            "ratio": ratio,
            "ratio_range": [min(h) / max(q), max(h) / min(q)],
            "n": n,
            "repetition_seconds": reps,
            "compile_cache": os.environ.get("TORCHINDUCTOR_CACHE_DIR"),
            "stopped": stop,
        }
        rows.write(
            {
                **base,
                "status": OK,
                "reason": None,
                "seconds": time.monotonic() - started,
                "fields": fields,
                "target_met": None if target is None else ratio >= target,
                "result": f"harness {hm:,.1f} ({min(h):,.1f}-{max(h):,.1f}), plain {qm:,.1f} "
                f"({min(q):,.1f}-{max(q):,.1f}) samples/s; harness/plain {ratio:.3f} "
                f"({fields['ratio_range'][0]:.2f}-{fields['ratio_range'][1]:.2f}), n={n}",
            }
        )


def wanted(a, name: str) -> bool:
    """Whether --rows asks for this row of steps b-f (every row without --rows)."""
    return not a.rows or any(part in name for part in a.rows.split(","))


def failed(base: dict, exc: BaseException, seconds: float) -> dict:
    text = "".join(traceback.format_exception(exc))
    first = str(exc).strip().splitlines()
    return {
        **base,
        "status": FAILED,
        "reason": f"{type(exc).__name__}: {first[0] if first else ''}"[:300],
        "seconds": seconds,
        "fields": {"traceback": text[-4000:]},
    }


# ---------------------------------------------------------------------------- c-f: the child
def make_adapter(device: str, model: str, precision: str, batch: int, mode: str, window, **kw):
    """The production PyTorch adapter of a one-rank cell, set up (model, batch, optimizer)."""
    from dlscale.frameworks.train_spec import TrainSpec
    from dlscale.rank.rank_context import RankContext
    from dlscale.registry.frameworks import get_adapter

    port = kw.pop("port", 29500)  # a one-rank process group (FSDP2 at degree 1) listens here
    ctx = RankContext(0, 1, 0, 1, 0, platform.node(), "127.0.0.1", port, "gpu-suite")
    settings = {"learning_rate": 0.01, "momentum": 0.9, **kw}
    spec = TrainSpec(
        framework="pytorch",
        model=model,
        per_rank_batch=batch,
        warmup_steps=window[0],
        steps=window[1],
        precision=precision,
        device=device,
        threads=1,
        mode=mode,
        **settings,
    )
    adapter = get_adapter("pytorch")(spec, ctx)
    adapter.setup()
    return adapter


def release(adapter) -> None:
    import torch

    adapter.teardown()
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def sync_row(device, plan, model, precision, batch, mode) -> dict:
    """Step c: the production window with set_sync_debug_mode("error") over its timed steps
    (CUDA) and the production SyncAudit counting host synchronisations inside it."""
    import torch

    from dlscale.rank.timing import SyncAudit, run_timed

    adapter = make_adapter(device, model, precision, batch, mode, plan["window"])
    cuda, warmup = device == "cuda", adapter.spec.warmup_steps
    sync, in_force, raised = adapter.sync, [], None

    def before_step(i: int) -> None:
        if cuda and i == warmup:  # the first timed step: the window has just opened
            torch.cuda.set_sync_debug_mode("error")
            in_force.append(torch.cuda.get_sync_debug_mode())

    def closing_sync() -> None:
        if cuda:
            torch.cuda.set_sync_debug_mode("default")  # the window's own closing sync
        sync()

    adapter.sync = closing_sync
    audit = SyncAudit(adapter)
    try:
        run = run_timed(adapter, before_step=before_step, audit=audit)
        timer = run["timer"]
    except RuntimeError as exc:
        if not (cuda and "synchroniz" in str(exc)):
            raise
        # the window ended at the first synchronising call; its telemetry thread (a daemon,
        # sampling NVML every 0.1 s off the step's path) is left to the child's exit
        raised, timer = str(exc).strip().splitlines()[0], None
    finally:
        if cuda:
            torch.cuda.set_sync_debug_mode("default")
        audit.uninstall()
    record = audit.record()
    count = sum(record["inside_window"].values())
    release(adapter)
    debug = (
        ("raised: " + raised if raised else "no raise")
        if cuda
        else "not on a CPU (torch.cuda.set_sync_debug_mode is CUDA's)"
    )
    return {
        "fields": {
            "host_syncs_in_window": count,
            "sync_audit": record,
            "sync_debug_mode": "error" if in_force == [2] else ("n/a" if not cuda else in_force),
            "debug_mode_outcome": debug,
            "timer": timer,
            "steps": adapter.spec.steps,
        },
        "target_met": count == 0 and raised is None,
        "result": f"{count} host syncs in the window (SyncAudit); sync debug mode error: {debug}",
    }


def energy_rows(device, plan, model, precision, batch) -> list[dict]:
    """Step d: one production window of >= energy_window_s seconds; the production meter's
    reading (the counter on a board that has one) against NVML power sampled over the same
    window by the production module's sampled method; the rank's telemetry of that window."""
    from dlscale.rank.timing import run_timed
    from dlscale.study.protocol import GPU_QUANTITIES

    adapter = make_adapter(device, model, precision, batch, "eager", plan["window"])
    for _ in range(2):  # how long a step takes, to size the window
        adapter.step()
    adapter.sync()
    t0 = time.perf_counter()
    for _ in range(3):
        adapter.step()
    adapter.sync()
    step_s = (time.perf_counter() - t0) / 3
    steps = max(plan["window"][1], math.ceil(plan["energy_window_s"] / step_s))
    adapter.spec = dataclasses.replace(adapter.spec, steps=steps)
    cuda, sampled, sampled_error = device == "cuda", None, None
    if cuda:
        try:
            from dlscale.rank.energy import _Nvml

            sampled = _Nvml(adapter.gpu)
            sampled.method = "sampled"  # the module's own sampling, beside its counter
        except Exception as exc:  # noqa: BLE001 (no NVML: the row says why)
            sampled_error = repr(exc)
    warmup = adapter.spec.warmup_steps

    def before_step(i: int) -> None:
        if sampled is not None and i == warmup:
            sampled.start()

    run = run_timed(adapter, before_step=before_step)
    joules_sampled = sampled.stop() if sampled is not None else None
    sampled_s = sampled.samples[-1][0] - sampled.samples[0][0] if sampled is not None else None
    release(adapter)
    energy, telemetry = run["energy"], run["telemetry"]
    window = run["window_seconds"]
    rows = []
    # energy
    if not cuda:
        rows.append({"status": SKIPPED, "reason": GPU_ONLY_ENERGY, "fields": {"energy": energy}})
    else:
        fields = {
            "window_seconds": window,
            "steps": steps,
            "production_meter": energy,
            "sampled_joules": joules_sampled,
            "sampled_seconds": sampled_s,
            "sampled_samples": len(sampled.samples) if sampled is not None else None,
            "sampled_error": sampled_error,
        }
        counter = energy.get("available") and "counter" in (energy.get("source") or "")
        if counter and joules_sampled:
            w_counter = energy["joules"] / energy["seconds"]
            w_sampled = joules_sampled / sampled_s
            diff = 100 * (w_counter - w_sampled) / w_sampled
            fields.update(counter_watts=w_counter, sampled_watts=w_sampled, difference_pct=diff)
            rows.append(
                {
                    "fields": fields,
                    "target_met": abs(diff) <= ENERGY_TARGET_PCT and window >= 10,
                    "result": f"counter {energy['joules']:.0f} J / {energy['seconds']:.1f} s = "
                    f"{w_counter:.0f} W; sampled {joules_sampled:.0f} J / {sampled_s:.1f} s = "
                    f"{w_sampled:.0f} W; difference {diff:+.2f} %",
                }
            )
        else:
            why = energy.get("reason") or energy.get("source") or sampled_error
            rows.append(
                {
                    "fields": fields,
                    "target_met": False,
                    "result": f"no comparison: production meter {why}",
                }
            )
    # telemetry
    quantities = telemetry.get("quantities", {})
    expected = ["cpu_util_pct", "rss_mb", *(GPU_QUANTITIES if cuda else ())]
    empty = [q for q in expected if not quantities.get(q, {}).get("n")]
    shown = ", ".join(
        f"{q} {v['mean']:.4g} {v['unit']} (n={v['n']})" for q, v in quantities.items()
    )
    rows.append(
        {
            "fields": {"telemetry": telemetry, "expected": expected, "empty": empty},
            "target_met": not empty,
            "result": f"rank 0: {shown}" + (f"; empty: {', '.join(empty)}" if empty else ""),
        }
    )
    return rows


def peak_for(device: str, name: str, precision: str, hardware: str | None) -> tuple:
    """(dense peak TFLOP/s, how it is known) of the hardware entry for this device: the entry
    named by --hardware, else the one whose device_model is this device's name."""
    from dlscale.analysis.mfu import UNKNOWN_PEAK, peak_of

    try:
        import yaml
    except ImportError as exc:
        return None, f"{UNKNOWN_PEAK} (PyYAML not importable to read the hardware file: {exc})"
    entries = yaml.safe_load((REPO / "config" / "hardware.yaml").read_text()) or {}
    if hardware is None:
        found = [
            k
            for k, e in entries.items()
            if isinstance(e, dict) and e.get("device") == device and e.get("device_model") == name
        ]
        if len(found) != 1:
            return None, (
                f"{UNKNOWN_PEAK} ({len(found)} hardware entries with device_model {name!r}: "
                "name one with --hardware KEY)"
            )
        hardware = found[0]
    value, how = peak_of(entries.get(hardware), precision)
    return value, f"{hardware}: {how}"


def formula_per_token(spec) -> float | str:
    """What the counter should count per token by the decoder's formula
    (dlscale.models.flops.decoder_flops_per_token, "counted"), or why there is none."""
    from dlscale.models.flops import decoder_flops_per_token

    try:
        return decoder_flops_per_token(spec)["counted"]
    except (KeyError, TypeError) as exc:  # a decoder the formula does not describe
        return f"no formula for {spec.name}: {exc!r}"


def sync_debug_window(adapter, device: str):
    """(before_step, audit, state) for run_timed: torch.cuda.set_sync_debug_mode("error") over
    the timed steps (CUDA) and the production SyncAudit counting host synchronisations inside
    the window, as step c's rows do."""
    import torch

    from dlscale.rank.timing import SyncAudit

    cuda, warmup = device == "cuda", adapter.spec.warmup_steps
    sync, state = adapter.sync, {"in_force": []}

    def before_step(i: int) -> None:
        if cuda and i == warmup:
            torch.cuda.set_sync_debug_mode("error")
            state["in_force"].append(torch.cuda.get_sync_debug_mode())

    def closing_sync() -> None:
        if cuda:
            torch.cuda.set_sync_debug_mode("default")
        sync()

    adapter.sync = closing_sync
    return before_step, SyncAudit(adapter), state


def mfu_row(device, plan, model, precision, batch, mode, hardware=None, sizing=None) -> dict:
    """Step e: FLOPs per token as the rank counts them, tokens/s over the production window
    (the decoder settings: decoder_settings), MFU against the hardware entry's dense peak
    (production arithmetic), the attention kernel that ran, and the window checked for host
    synchronisations (set_sync_debug_mode("error") on CUDA, SyncAudit). The batch was sized
    from the memory prediction before the row (size_decoder): no retry on out-of-memory."""
    import torch

    from dlscale.analysis.mfu import achieved_tflops_per_device, mfu
    from dlscale.rank.timing import run_timed
    from dlscale.store.metrics import rank_summary

    adapter = make_adapter(
        device,
        model,
        precision,
        batch,
        mode,
        plan["decoder_window"],
        port=fidelity_port(),
        **decoder_settings(plan, mode),
    )
    described = adapter.describe()
    before_step, audit, state = sync_debug_window(adapter, device)
    raised = None
    try:
        run = run_timed(adapter, before_step=before_step, audit=audit)
    except RuntimeError as exc:
        if not (device == "cuda" and "synchroniz" in str(exc)):
            raise
        raised = str(exc).strip().splitlines()[0]
        raise RuntimeError(f"a host synchronisation inside the window: {raised}") from exc
    finally:
        if device == "cuda":
            torch.cuda.set_sync_debug_mode("default")
        audit.uninstall()
    syncs = sum(audit.record()["inside_window"].values())
    counted = described["model_flops"]
    if not counted.get("available"):
        raise RuntimeError(f"the rank's FLOP count failed: {counted.get('reason')}")
    seq_len = adapter.model_spec.input_shape[0]
    summary = rank_summary(run["step_seconds"], batch, 0.0, run["window_seconds"])
    samples_s = summary["throughput_samples_per_s"]
    flops_token = counted["flops_per_sample"] / seq_len
    achieved = achieved_tflops_per_device(counted["flops_per_sample"], samples_s, 1)
    name = described["device_model"]
    peak, how = peak_for(device, name, precision, hardware)
    value = mfu(achieved, peak)
    kernel = run.get("after_window", {}).get("attention_kernel") or {}
    execution = adapter.execution()
    release(adapter)
    target = MFU_TARGET if mode == "compiled" and model == "llama3_1b" else None
    return {
        "fields": {
            "model": model,
            "seq_len": seq_len,
            "per_rank_batch": batch,
            "sizing": sizing,
            "settings": decoder_settings(plan, mode),
            "wrapper": adapter.wrapper(),
            "training": execution.get("training"),
            "attention": execution.get("attention"),
            "attention_kernel": kernel,
            "host_syncs_in_window": syncs,
            "sync_debug_mode": "error" if state["in_force"] == [2] else "n/a (not CUDA)",
            "flops_per_sample": counted["flops_per_sample"],
            "flops_per_token": flops_token,
            "formula_counted_per_token": formula_per_token(adapter.model_spec),
            "flop_method": counted["method"],
            "throughput_samples_per_s": samples_s,
            "tokens_per_s": samples_s * seq_len,
            "achieved_tflops": achieved,
            "peak_tflops": peak,
            "peak_from": how,
            "mfu": value,
            "first_step_seconds": run["first_step_seconds"],
            "window_seconds": run["window_seconds"],
            "steps": len(run["step_seconds"]),
            "device_model": name,
        },
        "target_met": None if target is None or value is None else value >= target,
        "result": f"{flops_token / 1e9:.3g} GFLOP/token, {samples_s * seq_len:,.0f} tokens/s, "
        f"{achieved:.3g} TFLOP/s; MFU "
        + (f"{value:.3f}" if value is not None else how)
        + f"; attention {kernel.get('kernel')}; {syncs} host syncs in the window",
    }


def fidelity_port() -> int:
    """A free port for a row's one-rank process group (FSDP2 at degree 1)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def memory_row(device, plan, model, precision, batch, sizing=None) -> dict:
    """Step f: the decoder row's settings (decoder_settings, eager: FSDP2 at degree 1, AdamW) at
    world size 1 through the production adapter; the state bytes the adapter reports against
    the prediction the row was sized by (predicted_memory: AdamW's 16 B per parameter), and on
    CUDA the peak allocated over the timed window (peak statistics reset as it opens) against
    the predicted total."""
    import torch

    from dlscale.rank.timing import run_timed

    adapter = make_adapter(
        device,
        model,
        precision,
        batch,
        "eager",
        plan["decoder_window"],
        port=fidelity_port(),
        **decoder_settings(plan, "eager"),
    )
    cuda, warmup = device == "cuda", adapter.spec.warmup_steps

    def before_step(i: int) -> None:
        if cuda and i == warmup:
            torch.cuda.reset_peak_memory_stats(adapter.device)

    run_timed(adapter, before_step=before_step)
    memory = adapter.memory_per_rank()
    n = adapter.param_count
    pred = predicted_memory(model, plan["decoder_seq_len"], batch, precision)
    predicted = {"param_bytes": 4 * n, "grad_bytes": 4 * n, "optimizer_state_bytes": 8 * n}
    measured = {k: memory.get(k) for k in predicted}
    state_pred, state_meas = sum(predicted.values()), sum(v or 0 for v in measured.values())
    state_diff = 100 * (state_meas - state_pred) / state_pred
    peak_mb = memory.get("peak_allocated_mb")
    fields = {
        "wrapper": adapter.wrapper(),
        "param_count": n,
        "predicted_bytes": predicted,
        "measured_bytes": measured,
        "state_difference_pct": state_diff,
        "predicted_total": pred,
        "sizing": sizing,
        "peak_allocated_mb_window": peak_mb,
        "peak_reserved_mb": memory.get("peak_reserved_mb"),
        "peak_rss_mb": memory.get("peak_rss_mb"),
        "memory_method": memory.get("method"),
    }
    result = (
        f"state {state_meas / 2**20:,.1f} MiB measured vs {state_pred / 2**20:,.1f} MiB "
        f"predicted ({state_diff:+.2f} %, AdamW); wrapper: {fields['wrapper']}"
    )
    if cuda:
        total_mb = pred["total_bytes"] / 2**20
        fields["peak_vs_predicted_total_pct"] = 100 * (peak_mb - total_mb) / total_mb
        result += (
            f"; window peak {peak_mb:,.0f} MiB allocated vs {total_mb:,.0f} MiB predicted "
            f"({fields['peak_vs_predicted_total_pct']:+.1f} %)"
        )
    else:
        result += "; no device memory on a CPU (peak RSS in the fields)"
    release(adapter)
    return {
        "fields": fields,
        "target_met": abs(state_diff) <= MEMORY_TARGET_PCT,
        "result": result,
    }


def child(argv: list[str]) -> int:
    """Steps c-f in one process (one torch import, one CUDA context): each row printed as one
    line, ROW_PREFIX + JSON, as it finishes."""
    p = argparse.ArgumentParser()
    p.add_argument("--device", required=True)
    p.add_argument("--deadline", type=float, required=True, help="time.time() to stop by")
    p.add_argument("--hardware", default=None)
    p.add_argument("--rows", required=True, help="the rows, JSON")
    a = p.parse_args(argv)
    plan = PLANS[a.device]
    broken = os.environ.get(BREAK_ENV)

    def emit(row: dict) -> None:
        print(ROW_PREFIX + json.dumps(row, default=str), flush=True)

    pending = json.loads(a.rows)
    while pending:
        row = pending.pop(0)
        base = {k: row[k] for k in ("step", "row", "target")}
        why = not_here(a.device, row["kind"]) or does_not_fit(row)
        if why:
            emit({**base, "status": SKIPPED, "reason": why})
            continue
        estimate = row_estimate(a.device, row["kind"], row)
        kept = kept_for_later(a.device, pending, row["step"])
        left = a.deadline - time.time() - kept
        if estimate > left:
            after = f" after {kept:.0f} s kept for the later steps" if kept else ""
            emit(
                {
                    **base,
                    "status": SKIPPED,
                    "reason": f"budget: estimated {estimate:.0f} s, {max(left, 0):.0f} s "
                    f"left{after}",
                }
            )
            continue
        started = time.monotonic()
        kind, args = row["kind"], row["args"]
        try:
            if broken == "hang":  # a row that never ends: the parent stops it at the budget
                time.sleep(3600)
            if broken == kind.split("_")[0] or broken == kind:
                raise RuntimeError(f"{BREAK_ENV}={broken}: a deliberate break (tests)")
            if kind.startswith("sync"):
                out = [sync_row(a.device, plan, *args)]
            elif kind == "energy":
                out = energy_rows(a.device, plan, *args)
                # the telemetry row comes from the same window
                if pending and pending[0]["kind"] == "telemetry":
                    tele = pending.pop(0)
                    out[1] = {**out[1], "_base": {k: tele[k] for k in ("step", "row", "target")}}
            elif kind == "telemetry":
                out = energy_rows(a.device, plan, *args)[1:]
            elif kind.startswith("mfu"):
                out = [mfu_row(a.device, plan, *args, hardware=a.hardware, sizing=row["sizing"])]
            elif kind == "memory":
                out = [memory_row(a.device, plan, *args, sizing=row["sizing"])]
            else:
                raise ValueError(f"unknown row kind {kind!r}")
        except Exception as exc:  # noqa: BLE001 (the row fails, the others still run)
            emit(failed(base, exc, time.monotonic() - started))
            continue
        seconds = time.monotonic() - started
        for result in out:
            where = result.pop("_base", base)
            emit({**where, "status": OK, "reason": None, "seconds": seconds, **result})
    return 0


def run_child(a, rows: Rows, budget: Budget, python: str, specs: list[dict]) -> None:
    """Steps c-f in one child process, killed at the budget; its rows written as they come,
    the rows it did not report written as skipped (stopped at the budget) or failed (the child
    died)."""
    if not specs:
        return
    estimate = PRIOR_S[a.device]["child"] + row_estimate(a.device, specs[0]["kind"], specs[0])
    if not budget.fits(estimate):
        for spec in specs:
            rows.write(
                {
                    "step": spec["step"],
                    "row": spec["row"],
                    "target": spec["target"],
                    "status": SKIPPED,
                    "reason": not_here(a.device, spec["kind"]) or budget.why_not(estimate),
                }
            )
        return
    deadline = time.time() + budget.left()
    argv = [python, str(Path(__file__).resolve()), "--child", "--device", a.device]
    argv += ["--deadline", f"{deadline:.3f}", "--rows", json.dumps(specs)]
    if a.hardware:
        argv += ["--hardware", a.hardware]
    proc = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=fidelity.child_env(),
        start_new_session=True,
    )
    fidelity.SESSIONS.add(proc.pid)
    lines: queue.Queue = queue.Queue()
    err: list[str] = []
    threading.Thread(target=lambda: [lines.put(x) for x in proc.stdout], daemon=True).start()
    threading.Thread(target=lambda: err.extend(proc.stderr), daemon=True).start()
    done, started = set(), time.monotonic()
    killed = False
    while True:
        try:
            line = lines.get(timeout=0.2)
        except queue.Empty:
            if proc.poll() is not None and lines.empty():
                break
            if budget.left() <= 0 and proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                killed = True
            continue
        if line.startswith(ROW_PREFIX):
            row = json.loads(line[len(ROW_PREFIX) :])
            rows.write(row)
            done.add(row["row"])
        else:
            print(line, end="", flush=True)
    proc.wait()
    fidelity.SESSIONS.discard(proc.pid)
    rest = [s for s in specs if s["row"] not in done]
    for i, spec in enumerate(rest):
        base = {"step": spec["step"], "row": spec["row"], "target": spec["target"]}
        if killed:
            what = "stopped at the budget in this row" if i == 0 else "not reached"
            why = not_here(a.device, spec["kind"]) if i else None
            rows.write({**base, "status": SKIPPED, "reason": why or f"budget: {what}"})
        else:
            tail = "".join(err)[-1500:]
            rows.write(
                {
                    **base,
                    "status": FAILED,
                    "reason": f"the child of steps c-f exited {proc.returncode} before this row",
                    "seconds": time.monotonic() - started if i == 0 else None,
                    "fields": {"stderr_tail": tail},
                }
            )


# ---------------------------------------------------------------------------- the run
def needs(device: str, steps: set) -> tuple[dict[str, str], dict[str, str]]:
    """What a run imports besides torch (module -> distribution to install from --wheels): what
    it cannot run without (numpy; jsonschema for the fidelity step's launcher), and what a row
    reports as missing when it is absent (PyYAML: the MFU row's peak; nvidia-ml-py: NVML's
    facts, energy and GPU telemetry)."""
    hard = {"numpy": "numpy", **({"jsonschema": "jsonschema"} if "b" in steps else {})}
    optional = {"yaml": "pyyaml", **({"pynvml": "nvidia-ml-py"} if device == "cuda" else {})}
    return hard, optional


def run(a, rows: Rows, budget: Budget, steps: set, work: Path) -> None:
    """The steps asked for, in order, in the run's temporary folder `work`."""
    hard, optional = needs(a.device, steps)
    installed = fidelity.provide_harness_packages(a.python, a.wheels, work, hard, optional)
    # one compile cache for every process of the run (steps b, c, e)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(work / INDUCTOR_CACHE)
    specs = [
        {**s, "estimate": a.measured.get(s["row"])}
        for s in child_rows(a.device, a.plan, a.memory_bytes, a.recorded)
        if s["step"] in steps and wanted(a, s["row"])
    ]
    if "a" in steps:
        started = time.monotonic()
        base = {"step": "a", "row": "environment"}
        try:
            if os.environ.get(BREAK_ENV) == "environment":
                raise RuntimeError(f"{BREAK_ENV}=environment: a deliberate break (tests)")
            env = environment(a.device)
            env["fields"]["wheels_installed"] = installed
            seconds = time.monotonic() - started
            rows.write({**base, "status": OK, "reason": None, "seconds": seconds, **env})
        except Exception as exc:  # noqa: BLE001 (the row fails, the others still run)
            rows.write(failed(base, exc, time.monotonic() - started))
    if "b" in steps:
        child = PRIOR_S[a.device]["child"] if specs else 0.0
        later = child + sum(
            row_estimate(a.device, s["kind"], s) for s in specs if not not_here(a.device, s["kind"])
        )
        b_rows = [(c, m) for m in MODES for c in a.plan["fidelity_cases"]]

        def reserve_after(index: int) -> float:
            """The first repetitions of the b rows after `index` and every row of c-f."""
            firsts = sum(
                a.measured.get(
                    f"fidelity {model} {precision} b{batch} {mode}",
                    2 * PRIOR_S[a.device][f"fidelity_{mode}"],
                )
                for (model, precision, batch), mode in b_rows[index + 1 :]
                if not not_here(a.device, f"fidelity_{mode}")
                and wanted(a, f"fidelity {model} {precision} b{batch} {mode}")
            )
            return firsts + later

        first = child + kept_for_later(a.device, specs, "b")
        fidelity_rows(a, budget, rows, a.python, work, first, reserve_after)
    run_child(a, rows, budget, a.python, specs)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        return child(argv[1:])
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", type=Path, help="folder for rows.jsonl and rows.md")
    p.add_argument("--budget", type=float, default=300.0, help="seconds for the whole run")
    p.add_argument("--device", choices=("cuda", "cpu"), default=None)
    p.add_argument("--steps", default="a,b,c,d,e,f", help="which steps (default: all)")
    p.add_argument(
        "--rows",
        default=None,
        help="only the rows of steps b-f whose name contains one of these (comma-separated), "
        "e.g. compiled: a rerun of what the first run skipped",
    )
    p.add_argument("--wheels", default=None, help="folder of wheels for missing packages")
    p.add_argument(
        "--estimates",
        type=Path,
        nargs="+",
        default=None,
        help="earlier runs' rows.jsonl files (e.g. benchmarks/gpu-runs/*.jsonl): their measured "
        "seconds are this run's estimates",
    )
    p.add_argument("--hardware", default=None, help="hardware entry of this GPU (MFU's peak)")
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="print the plan against --hardware's entry (the rows, their estimates and memory "
        "predictions, what fits the budget and what is left for another call); run nothing",
    )
    p.add_argument("--python", default=sys.executable)
    a = p.parse_args(argv)
    budget = Budget(a.budget)
    recorded = a.estimates or sorted(RECORDED_RUNS.glob("*.jsonl"))
    a.measured = measured_estimates(recorded)
    a.recorded = recorded_fields(recorded)
    import torch

    from dlscale.rank.provenance import git_commit

    a.device = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    a.plan = PLANS[a.device]
    steps = set(a.steps.split(","))
    entry = hardware_entry(a.hardware) if a.hardware else None
    a.memory_bytes = device_memory_bytes(a.device, entry) if a.device == "cuda" else None
    if a.dry_run:
        return dry_run(a, steps, entry)
    name = (
        torch.cuda.get_device_name()
        if a.device == "cuda" and torch.cuda.is_available()
        else f"CPU ({platform.machine()})"
    )
    rows = Rows(
        a.out,
        {
            "device_name": name,
            "device": a.device,
            "started": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "commit": git_commit(REPO),
            "torch": torch.__version__,
            "budget_s": a.budget,
        },
    )
    cache_was = os.environ.get("TORCHINDUCTOR_CACHE_DIR")

    def stopped(signum, frame):  # a timeout from outside: no side or child outlives the suite
        fidelity.stop_sessions()
        raise Stopped(signum)

    handlers = {sig: signal.signal(sig, stopped) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        with tempfile.TemporaryDirectory(prefix="dlscale-gpu-suite-") as tmp:
            run(a, rows, budget, steps, Path(tmp))
    except Stopped as stop:
        print(f"stopped by signal {stop.args[0]}: {len(rows.rows)} rows written", flush=True)
        return 128 + stop.args[0]
    finally:
        fidelity.stop_sessions()
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
        if cache_was is None:
            os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
        else:
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache_was
    left_for_later(rows.rows, a)
    elapsed = time.monotonic() - budget.started
    bad = [r for r in rows.rows if r["status"] == FAILED]
    print(
        f"{len(rows.rows)} rows in {elapsed:.1f} s (budget {a.budget:g} s): "
        f"{sum(r['status'] == OK for r in rows.rows)} ok, "
        f"{sum(r['status'] == SKIPPED for r in rows.rows)} skipped, {len(bad)} failed; "
        f"{a.out / ROWS_FILE}, {a.out / TABLE_FILE}",
        flush=True,
    )
    return 1 if bad else 0


def left_for_later(rows: list[dict], a) -> list[str]:
    """Print the rows the budget left for another call (skipped with a budget reason) and the
    command that runs them; returns their names."""
    later = [
        r for r in rows if r["status"] == SKIPPED and str(r.get("reason")).startswith("budget")
    ]
    if not later:
        print("left for another call: none", flush=True)
        return []
    names = [r["row"] for r in later]
    steps = ",".join(sorted({"a", *(r["step"] for r in later)}))
    print(
        f"left for another call ({len(names)}): " + "; ".join(names) + "\n  rerun: python3 "
        f"benchmarks/gpu_suite.py OUT2 --device {a.device} --steps {steps} --rows "
        f"'{','.join(names)}'" + (f" --hardware {a.hardware}" if a.hardware else ""),
        flush=True,
    )
    return names


def hardware_entry(key: str) -> dict:
    """The hardware file's entry `key` (PyYAML)."""
    import yaml

    entries = yaml.safe_load((REPO / "config" / "hardware.yaml").read_text()) or {}
    if key not in entries:
        raise SystemExit(f"--hardware {key}: no such entry; entries: {', '.join(entries)}")
    return entries[key]


def dry_run(a, steps: set, entry: dict | None) -> int:
    """The plan of a call against a hardware entry, run nowhere: each row in order with its
    estimate (recorded runs, decoder_estimate, PRIOR_S), the decoder rows' memory prediction
    against the entry's device_memory_gib, and whether it fits the budget by the same rule as
    a run (the cheapest row of each later step kept; step b's first repetition only), the rows
    that do not listed as left for another call."""
    device, plan = a.device, a.plan
    left = a.budget - SAFETY_S
    rows = []
    if "a" in steps:
        left -= PRIOR_S[device]["environment"]
        rows.append({"step": "a", "row": "environment", "estimate": PRIOR_S[device]["environment"]})
    specs = [
        {**s, "estimate": a.measured.get(s["row"])}
        for s in child_rows(device, plan, a.memory_bytes, a.recorded)
        if s["step"] in steps and wanted(a, s["row"])
    ]
    child = PRIOR_S[device]["child"] if specs else 0.0
    if "b" in steps:
        for mode in MODES:
            for model, precision, batch in plan["fidelity_cases"]:
                name = f"fidelity {model} {precision} b{batch} {mode}"
                if not wanted(a, name) or not_here(device, f"fidelity_{mode}"):
                    continue
                est = a.measured.get(name, 2 * PRIOR_S[device][f"fidelity_{mode}"])
                reserve = child + kept_for_later(device, specs, "b")
                fits = est <= left - reserve
                left -= est if fits else 0
                rows.append({"step": "b", "row": name, "estimate": est, "fits": fits})
    left -= child
    for i, spec in enumerate(specs):
        why = not_here(device, spec["kind"]) or does_not_fit(spec)
        est = row_estimate(device, spec["kind"], spec)
        kept = kept_for_later(device, specs[i + 1 :], spec["step"])
        fits = why is None and est <= left - kept
        left -= est if fits else 0
        rows.append({**spec, "estimate": est, "fits": fits, "why": why})
    print(f"dry run: device {device}, hardware {a.hardware}, budget {a.budget:g} s")
    if a.memory_bytes is not None:
        print(f"  usable device memory {a.memory_bytes / 2**30:.1f} GiB (entry less headroom)")
    for row in rows:
        sizing = row.get("sizing") or {}
        memory = ""
        if sizing.get("tried"):
            pred = sizing["tried"][-1]
            memory = (
                f"; memory predicted {pred['total_bytes'] / 2**30:.1f} GiB at batch "
                f"{pred['batch']} (state {pred['state_bytes'] / 2**30:.1f}, activations "
                f"{pred['activation_bytes'] / 2**30:.1f}, logits gradient "
                f"{pred['logits_gradient_bytes'] / 2**30:.1f})"
            )
        verdict = (
            "runs"
            if row.get("fits", True) and not row.get("why")
            else f"not run: {row['why']}"
            if row.get("why")
            else "left for another call"
        )
        estimate = f"estimated {row['estimate']:.0f} s"
        print(f"  [{row['step']}] {row['row']}: {estimate}{memory} -- {verdict}")
    later = [r["row"] for r in rows if r.get("fits") is False and not r.get("why")]
    print(f"  left for another call: {'; '.join(later) if later else 'none'}")
    print(f"  estimated total of the rows that run: {a.budget - SAFETY_S - left:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

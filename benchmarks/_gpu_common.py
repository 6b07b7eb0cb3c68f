"""What the GPU suite's runner (benchmarks/gpu_suite.py), its fidelity step
(benchmarks/gpu_fidelity.py) and its acceptance checks (tests/gpu/acceptance.py) share: the
rows' format and outcomes, each device's plan, the estimates and targets, the decoder rows'
training and sizing, and which rows cannot run where. Standard library only."""

from __future__ import annotations

import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


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

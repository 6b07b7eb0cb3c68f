"""The GPU acceptance checks, steps c-f of benchmarks/gpu_suite.py (its runner starts them in a
child process, `gpu_suite.py --child`, within its budget): the production step under the
production timing loop with no host synchronisation inside the timed window (c), the energy
counter against sampled power and the rank's telemetry (d), the decoder's MFU against the
hardware entry's peak (e), and its memory at world size 1 against the prediction (f). Each
check writes one row; on a CPU they run the tiny models (the test command's CPU path,
tests/unit/benchmarks/test_gpu_suite.py) and the GPU-only rows say why not. Imported by the
runner, which has put scripts/ and benchmarks/ on the path."""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import math
import os
import platform
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

from _gpu_common import (  # noqa: E402
    BREAK_ENV,
    ENERGY_TARGET_PCT,
    GPU_ONLY_ENERGY,
    MEMORY_TARGET_PCT,
    MFU_TARGET,
    OK,
    PLANS,
    ROW_PREFIX,
    SKIPPED,
    decoder_settings,
    does_not_fit,
    failed,
    kept_for_later,
    not_here,
    predicted_memory,
    row_estimate,
)


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

"""A PyTorch cell's attention kernel and its profiler, outside the timed window.

- attention_scope: torch.nn.attention.sdpa_kernel over the cell's backend order
  (dlscale.registry.attention.backend_order; set_priority=True: the first that can run wins);
- uses_gqa: whether scaled_dot_product_attention gets enable_gqa=True: where the first backend
  of the order that runs the shapes supports it (on CUDA torch.backends.cuda.can_use_*, asked
  with the cell's shapes and dtype; on a CPU the flash and math kernels both do);
- profiled_ops: the operator names of one step under torch.profiler (CPU and, on a GPU, CUDA
  activities): which kernel ran is read from them (dlscale.registry.attention.kernel_of), after
  the timed window, never inside it;
- trace: a Chrome/Perfetto trace of a few steps (torch.profiler's schedule: wait 0, warmup 1,
  active N; export_chrome_trace), and an Nsight Systems capture range around the same steps
  where asked for and `nsys` runs the rank (torch.cuda.profiler.start/stop).

Imported only in environments with torch."""

from __future__ import annotations

import contextlib
import os
import time

import torch

from dlscale.registry.attention import backend_order, kernel_of


def _backends():
    from torch.nn.attention import SDPBackend

    return {
        "cudnn": SDPBackend.CUDNN_ATTENTION,
        "flash": SDPBackend.FLASH_ATTENTION,
        "efficient": SDPBackend.EFFICIENT_ATTENTION,
        "math": SDPBackend.MATH,
    }


def order_for(attention: str | None, device: torch.device) -> tuple[str, ...]:
    """The cell's backend order on this device (empty: PyTorch's own choice)."""
    if attention is None:
        return ()
    capability = None
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        capability = major + minor / 10
    return backend_order(attention, device.type, capability)


def attention_scope(order: tuple[str, ...]):
    """sdpa_kernel over `order` (priority as given); nothing where the order is empty."""
    if not order:
        return contextlib.nullcontext()
    from torch.nn.attention import sdpa_kernel

    backends = _backends()
    return sdpa_kernel([backends[b] for b in order], set_priority=True)


def uses_gqa(order: tuple[str, ...], device: torch.device, shapes: dict | None, dtype) -> dict:
    """Whether the cell passes enable_gqa=True (instead of repeating the key/value heads):
    {"enable_gqa": bool, "backend": the first backend of the order that runs these shapes,
    "why": ...}. `shapes`: {"heads", "kv_heads", "head_dim", "seq_len", "batch"} of the model's
    attention (None: no grouped-query attention, nothing to decide)."""
    if not order or shapes is None or shapes["heads"] == shapes["kv_heads"]:
        return {"enable_gqa": False, "backend": None, "why": "no grouped-query attention asked"}
    if device.type != "cuda":
        first = next(b for b in order if b in ("flash", "math"))
        return {
            "enable_gqa": True,
            "backend": first,
            "why": "the CPU flash and math kernels take enable_gqa",
        }
    checks = {
        "cudnn": torch.backends.cuda.can_use_cudnn_attention,
        "flash": torch.backends.cuda.can_use_flash_attention,
        "efficient": torch.backends.cuda.can_use_efficient_attention,
        "math": lambda params, _debug=False: True,
    }
    b, s, d = shapes["batch"], shapes["seq_len"], shapes["head_dim"]
    q = torch.empty(b, shapes["heads"], s, d, device=device, dtype=dtype, requires_grad=True)
    kv = torch.empty(b, shapes["kv_heads"], s, d, device=device, dtype=dtype, requires_grad=True)
    whole = torch.empty(b, shapes["heads"], s, d, device=device, dtype=dtype, requires_grad=True)
    params = torch.backends.cuda.SDPAParams
    for backend in order:
        check = checks[backend]
        if check(params(q, kv, kv, None, 0.0, True, True)):
            return {"enable_gqa": True, "backend": backend, "why": f"{backend} takes enable_gqa"}
        if check(params(q, whole, whole, None, 0.0, True, False)):
            return {
                "enable_gqa": False,
                "backend": backend,
                "why": f"{backend} runs these shapes without enable_gqa only: repeat_kv",
            }
    return {"enable_gqa": False, "backend": None, "why": "no backend of the order runs these"}


def set_gqa(model: torch.nn.Module, enabled: bool) -> int:
    """Set `enable_gqa` on every attention module that has the switch (the Llama family's);
    returns how many."""
    count = 0
    for module in model.modules():
        if hasattr(module, "enable_gqa"):
            module.enable_gqa = enabled
            count += 1
    return count


def _activities(device: torch.device) -> list:
    from torch.profiler import ProfilerActivity

    acts = [ProfilerActivity.CPU]
    if device.type == "cuda":
        acts.append(ProfilerActivity.CUDA)
    return acts


def profiled_ops(step, device: torch.device, sync) -> list[str]:
    """The operator (and, on a GPU, kernel) names of one `step()` under torch.profiler."""
    from torch.profiler import profile

    with profile(activities=_activities(device)) as prof:
        step()
        sync()
    return sorted({e.name for e in prof.events()})


def attention_kernel(step, device: torch.device, sync, order: tuple[str, ...]) -> dict:
    """Which attention kernel one step ran (profiled_ops, kernel_of), with the order asked."""
    started = time.perf_counter()
    try:
        found = kernel_of(profiled_ops(step, device, sync))
    except Exception as exc:  # noqa: BLE001 - a probe that fails is a missing fact
        return {"available": False, "reason": f"{type(exc).__name__}: {exc}"}
    return {
        "available": True,
        **found,
        "order": list(order) or None,
        "method": "torch.profiler operator names of one step after the timed window",
        "seconds": time.perf_counter() - started,
    }


NSYS_ENV = "NSYS_PROFILING_SESSION_ID"  # set by nsys in the processes it profiles


def trace(step, device: torch.device, sync, path, steps: int, nsys: bool) -> dict:
    """A Chrome/Perfetto trace of `steps` steps after one warm-up step (torch.profiler's
    schedule(wait=0, warmup=1, active=steps)), written to `path`; with `nsys` and the rank under
    Nsight Systems (NSYS_ENV), the same steps as its capture range (cudaProfilerStart/Stop)."""
    from torch.profiler import profile, schedule

    started = time.perf_counter()
    out = {"path": str(path), "steps": steps, "format": "chrome trace (Perfetto, chrome://tracing)"}
    under_nsys = nsys and device.type == "cuda" and NSYS_ENV in os.environ
    with profile(
        activities=_activities(device),
        schedule=schedule(wait=0, warmup=1, active=steps, repeat=1),
        on_trace_ready=lambda p: p.export_chrome_trace(str(path)),
        record_shapes=True,
    ) as prof:
        for i in range(steps + 1):
            if under_nsys and i == 1:
                torch.cuda.profiler.start()
            step()
            sync()
            prof.step()
        if under_nsys:
            torch.cuda.profiler.stop()
    out["nsys"] = (
        "capture range around the traced steps (cudaProfilerStart/Stop)"
        if under_nsys
        else ("asked, but the rank does not run under nsys" if nsys else None)
    )
    out["seconds"] = time.perf_counter() - started
    return out

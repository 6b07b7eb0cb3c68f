"""The attention kernels a PyTorch cell can ask scaled_dot_product_attention for (config
`attention`), the order `auto` tries them in per device class, and the operator names that say
which one ran. Pure Python: the schema, the parse-time checks and the report read it without
PyTorch; dlscale.frameworks.torch_attention turns it into torch.nn.attention.sdpa_kernel.

- null (the key's default): PyTorch's own choice of backend and grouped-query attention by
  repeating the key/value heads (repeat_kv), as every cell measured before the key; such a cell's
  identity leaves the key out.
- `auto`: one fixed order per device class (AUTO_ORDER), the first backend that can run the
  shapes wins (sdpa_kernel with set_priority=True).
- `cudnn`, `flash`, `efficient`, `math`: that backend alone (the cell fails if it cannot run).

A cell with a setting passes enable_gqa=True to scaled_dot_product_attention where the backend
that will run supports it (checked on the device: torch.backends.cuda.can_use_*; on a CPU flash
and math both do), else it repeats the key/value heads as before.
"""

from __future__ import annotations

ATTENTION = ("auto", "cudnn", "flash", "efficient", "math")
# The backends PyTorch 2.13 runs on a CPU: its flash kernel for CPUs and the math path.
CPU_BACKENDS = ("flash", "math")
# auto's order, by device class (device_class): cuDNN's attention first on Hopper, where it is
# reported 1.7-2.3x faster than flash 2; flash first before it; on a CPU the CPU flash kernel.
AUTO_ORDER = {
    "cuda_sm90": ("cudnn", "flash", "efficient", "math"),
    "cuda": ("flash", "efficient", "math"),
    "cpu": ("flash", "math"),
}
# The operator names (torch.profiler's, PyTorch's aten operators) that say which kernel ran; a
# name contains one of these (the CPU flash kernel is ..._flash_attention_for_cpu).
KERNEL_OPS = {
    "cudnn": ("_scaled_dot_product_cudnn_attention", "_cudnn_attention_forward"),
    "flash": ("_scaled_dot_product_flash_attention", "_flash_attention_forward"),
    "efficient": ("_scaled_dot_product_efficient_attention", "_efficient_attention_forward"),
    "math": ("_scaled_dot_product_attention_math",),
}


def allowed_on(device: str) -> tuple[str, ...]:
    """The settings a hardware entry of `device` (cpu, cuda) can run: every one on CUDA; auto
    and the CPU backends on a CPU."""
    if device == "cpu":
        return ("auto", *CPU_BACKENDS)
    return ATTENTION


def device_class(device: str, compute_capability: float | None = None) -> str:
    """AUTO_ORDER's key for a device: cpu, cuda (before 9.0 or unknown) or cuda_sm90."""
    if device != "cuda":
        return "cpu"
    if compute_capability is not None and float(compute_capability) >= 9.0:
        return "cuda_sm90"
    return "cuda"


def backend_order(
    attention: str, device: str, compute_capability: float | None = None
) -> tuple[str, ...]:
    """The backends a setting tries, in order: auto's order for the device class, or the one
    named."""
    if attention not in ATTENTION:
        raise ValueError(
            f"attention: {attention!r} is not allowed; allowed values: {', '.join(ATTENTION)}"
        )
    if attention == "auto":
        return AUTO_ORDER[device_class(device, compute_capability)]
    return (attention,)


def kernel_of(op_names) -> dict:
    """Which attention kernel ran, from the operator names a profiled step recorded:
    {"kernel": a KERNEL_OPS name, or None where no attention operator was seen, "ops": the
    attention operators seen}; several kernels (a model with two attentions) are joined by
    "+"."""
    seen = sorted({n for n in op_names if any(t in n for ts in KERNEL_OPS.values() for t in ts)})
    kernels = [k for k, tokens in KERNEL_OPS.items() if any(t in n for n in seen for t in tokens)]
    return {"kernel": "+".join(kernels) or None, "ops": seen}

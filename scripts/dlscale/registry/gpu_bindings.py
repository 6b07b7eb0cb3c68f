"""hardware.yaml `gpu_binding`: how the launcher binds a cuda cell's GPUs to its ranks, from the
entry to the srun options (dlscale.run.launch.gpu_step_options) and the device each rank then
takes (dlscale.rank.devices.pick_gpu). The schema's enum and default are filled from here.

Adding a binding: a record here (its srun options and what the rank sees), a test in
tests/unit for its options, and its line in docs/pages/gpu.md.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class GpuBinding:
    """One binding: `srun_options(ranks_per_node)` the launcher states (so no site default
    decides silently), and what each rank sees (`rank_sees`, for messages and the docs)."""

    name: str
    srun_options: Callable[[int], list[str]]
    rank_sees: str


GPU_BINDINGS = {
    b.name: b
    for b in (
        GpuBinding(
            "node",
            lambda ranks_per_node: [f"--gpus-per-node={ranks_per_node}"],
            "all of its node's allocated GPUs, and takes the one at its local rank (peer "
            "access between the ranks' GPUs, NVLink, is kept)",
        ),
        GpuBinding(
            "task",
            lambda ranks_per_node: ["--gpus-per-task=1"],
            "the one GPU Slurm binds to its task, as device 0 (peer access is lost unless the "
            "site lets tasks share devices)",
        ),
    )
}
DEFAULT_GPU_BINDING = "node"
assert DEFAULT_GPU_BINDING in GPU_BINDINGS

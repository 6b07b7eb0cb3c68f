"""The planner's partitions from the hardware file (nodes available, node-hour cost, power, the
memory one rank may use).
Pure Python, so rules/plan.smk reads them at parse time without importing pandas, scipy or
pulp (dlscale.decisions.planner, which solves, imports them; every Slurm job's snakemake parses the
workflow
again)."""

from __future__ import annotations

from dataclasses import dataclass

# The hardware file's key for the memory one rank may use (GiB): the planner's fit check
DEVICE_MEMORY_KEY = "device_memory_gib"
# ... and for what of it the measured peak does not see (GiB), subtracted before the check
HEADROOM_KEY = "memory_headroom_gib"
# The headroom where an entry states none, by device. A GPU rank's measured peak is PyTorch's
# caching allocator's (reserved memory); outside it the device holds the CUDA context (a few
# hundred MiB: the driver's and the kernels' images, more with eager module loading) and the
# communication library's buffers (NCCL: a few MiB per channel and peer, hundreds of MiB at 8
# GPUs and more with NVLS or many peers): 1 GiB covers both on the boards this project plans
# for; measure yours (nvidia-smi's used memory minus torch.cuda.memory_reserved()) and state it.
# A CPU rank's measured figure is its process's peak resident set, everything it held: none.
DEFAULT_HEADROOM_GIB = {"cuda": 1.0, "cpu": 0.0}


@dataclass(frozen=True)
class Partition:
    name: str
    nodes_available: int
    node_hour_cost: float = 1.0
    node_power_w: float | None = None
    # memory one rank may use for what the measured peak sees, MiB: (device_memory_gib -
    # memory_headroom_gib) x 1024; None: not checked
    device_memory_mb: float | None = None
    # the headroom subtracted (GiB) and whether the entry stated it (else DEFAULT_HEADROOM_GIB)
    headroom_gib: float = 0.0
    headroom_stated: bool = False
    device_memory_gib: float | None = None

    def limit_words(self) -> str:
        """Where the limit comes from, as the plan's memory check names it."""
        if not self.headroom_gib or self.device_memory_gib is None:
            return f"{self.name} {DEVICE_MEMORY_KEY}"
        stated = "" if self.headroom_stated else ", the default for its device"
        return (
            f"{self.name} {DEVICE_MEMORY_KEY} {self.device_memory_gib:g} - {HEADROOM_KEY} "
            f"{self.headroom_gib:g}{stated}"
        )


def partitions_from_hardware(hardware: dict) -> list[Partition]:
    """The planner's partitions: every hardware entry (nodes_available defaults to max_nodes;
    device_memory_gib absent or null: memory not checked; memory_headroom_gib absent or null:
    DEFAULT_HEADROOM_GIB of its device)."""
    out = []
    for name, hw in hardware.items():
        avail = hw.get("nodes_available")
        memory = hw.get(DEVICE_MEMORY_KEY)
        stated = hw.get(HEADROOM_KEY)
        headroom = (
            float(stated)
            if stated is not None
            else DEFAULT_HEADROOM_GIB.get(hw.get("device", "cpu"), 0.0)
        )
        out.append(
            Partition(
                name,
                int(avail if avail is not None else hw.get("max_nodes", 1)),
                float(hw.get("node_hour_cost", 1.0)),
                hw.get("node_power_w"),
                None if memory is None else max(float(memory) - headroom, 0.0) * 1024,
                headroom,
                stated is not None,
                None if memory is None else float(memory),
            )
        )
    return out

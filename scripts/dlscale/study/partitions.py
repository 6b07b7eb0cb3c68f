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


@dataclass(frozen=True)
class Partition:
    name: str
    nodes_available: int
    node_hour_cost: float = 1.0
    node_power_w: float | None = None
    # memory one rank may use, MiB (hardware file: device_memory_gib x 1024); None: not checked
    device_memory_mb: float | None = None


def partitions_from_hardware(hardware: dict) -> list[Partition]:
    """The planner's partitions: every hardware entry (nodes_available defaults to max_nodes;
    device_memory_gib absent or null: memory not checked)."""
    out = []
    for name, hw in hardware.items():
        avail = hw.get("nodes_available")
        memory = hw.get(DEVICE_MEMORY_KEY)
        out.append(
            Partition(
                name,
                int(avail if avail is not None else hw.get("max_nodes", 1)),
                float(hw.get("node_hour_cost", 1.0)),
                hw.get("node_power_w"),
                None if memory is None else float(memory) * 1024,
            )
        )
    return out

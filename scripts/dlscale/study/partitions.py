"""The planner's partitions from the hardware file (nodes available, node-hour cost, power).
Pure Python, so rules/plan.smk reads them at parse time without importing pandas, scipy or
pulp (dlscale.decisions.planner, which solves, imports them; every Slurm job's snakemake parses the
workflow
again)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Partition:
    name: str
    nodes_available: int
    node_hour_cost: float = 1.0
    node_power_w: float | None = None


def partitions_from_hardware(hardware: dict) -> list[Partition]:
    """The planner's partitions: every hardware entry (nodes_available defaults to max_nodes)."""
    out = []
    for name, hw in hardware.items():
        avail = hw.get("nodes_available")
        out.append(
            Partition(
                name,
                int(avail if avail is not None else hw.get("max_nodes", 1)),
                float(hw.get("node_hour_cost", 1.0)),
                hw.get("node_power_w"),
            )
        )
    return out

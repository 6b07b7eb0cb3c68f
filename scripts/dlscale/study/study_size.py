"""How many cells a study plans (`planned_cell_count`, computed without building them) and the
refusal of a study larger than its `max_cells` (`cell_count_problem`), checked by the matrix
(dlscale.study.matrix) before it builds any cell."""

from __future__ import annotations

import itertools
import math

from dlscale.study.cell import AXES
from dlscale.study.workloads import excluded, workload_axes, workload_repetitions


def planned_cell_count(config: dict) -> tuple[int, bool]:
    """(cells, exact): the number of cells a validated config plans over its workloads,
    computed without building them. Exact when nothing is excluded or the axes' product is
    small enough to count; otherwise the product (an upper bound) and False."""
    total, exact = 0, True
    reps = workload_repetitions(config)
    for workload, axes in workload_axes(config).items():
        # ranks per node: the axis's values, else one (each hardware's default)
        ranks = axes.get("ranks_per_node") or [None]
        product = math.prod(len(axes[a]) for a in AXES) * len(ranks)
        if workload == "script":  # a script's cells have its own model only
            from dlscale.study.script_workload import cell_count

            product = cell_count(config)
            exact = exact and not config["exclude"]
        elif config["exclude"] and product <= _COUNT_EXACTLY_UP_TO:
            product = sum(
                not excluded({**dict(zip(AXES, combo)), "ranks_per_node": rpn}, config["exclude"])
                for combo in itertools.product(*(axes[a] for a in AXES))
                for rpn in ranks
            )
        elif config["exclude"]:
            exact = False
        total += product * reps[workload]
    return total, exact


# Axes products up to this size are counted exactly (exclusions applied) before the cap check.
_COUNT_EXACTLY_UP_TO = 200_000


def cell_count_problem(config: dict) -> str | None:
    """The refusal of a study larger than `max_cells`, with its count and the limit."""
    count, exact = planned_cell_count(config)
    limit = config["max_cells"]
    if count <= limit:
        return None
    reps = workload_repetitions(config)
    sizes = " + ".join(
        " x ".join(f"{len(axes[a])} {a}" for a in AXES)
        + (f" x {len(axes['ranks_per_node'])} ranks_per_node" if axes["ranks_per_node"] else "")
        + f" x {reps[w]} repetitions"
        + ("" if w == "throughput" else f" ({w})")
        for w, axes in workload_axes(config).items()
    )
    how = "" if exact else " before `exclude`"
    return (
        f"max_cells: the study plans {count:,} cells{how} ({sizes}); the limit is {limit:,}. "
        f"Shrink the axes or exclude combinations, or raise max_cells to {count} (`max_cells: "
        f"{count}` in the study file) if the cluster can take it"
    )

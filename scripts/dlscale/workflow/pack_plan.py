"""A pack's plan (config `pack`, dlscale.workflow.packing): which cells share an allocation,
the order they run in, the allocation's shape and time, and the plan as printed.

Its cells run longest expected first (a cell's measured duration where a repetition of its
series was measured before, else its `runtime_min`; wider cells first among equals, then path
order) and are placed by list scheduling (`list_schedule`): each cell in that order starts as
soon as as many nodes as it needs are free and every cell before it has started, on the first
free nodes, never two cells on one node. The allocation takes the node count whose schedule
ends first, the fewest such nodes (`pack_shape`), and the time that schedule takes; packs
that start together share the nodes the entry may use at once (`share_widths`). With config
`pack_steps: serial` a pack runs one cell at a time on as many nodes as its largest cell, in
path order. The pack runner (dlscale.workflow.pack_runner) starts the cells in the same order.

Pure Python, no Slurm: the driver (dlscale.workflow.packing) gives it the partition's limits.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

# Seconds a pack adds per cell beyond the cell itself (the step's start, the launcher's
# checks) and once (the runner's start): part of its time limit.
STEP_OVERHEAD_S = 30
PACK_OVERHEAD_S = 60
# A measured duration is stretched by this factor before it sizes a pack (noise, a slower node).
MEASURED_MARGIN = 1.5
# config `pack_steps`: a pack's cells side by side on disjoint nodes, or one at a time
PACK_STEPS = ("concurrent", "serial")
# Node counts a pack's shape is chosen among at most (evenly spread where the range is wider).
SHAPES_TRIED = 64


def pack_setting(config: dict) -> int | None:
    """Cells per pack from config `pack` (validated by the schema): None (off: false, 0 or
    absent), an integer (at most that many cells in one allocation), or 0 for `true` (as many
    as the time limit holds)."""
    value = config.get("pack", False)
    if value is True:
        return 0
    if value in (False, None, 0):
        return None
    return int(value)


def pack_steps_setting(config: dict) -> bool:
    """Whether a pack runs its cells side by side (config `pack_steps`: concurrent, the
    default) or one at a time (serial)."""
    return config.get("pack_steps", PACK_STEPS[0]) == PACK_STEPS[0]


@dataclass
class PackCell:
    """One cell to pack: its metrics path, nodes, time limit as one job (minutes), the seconds
    it is expected to take (measured, or None), and what its job would run (jobstep payload)."""

    path: str
    nodes: int
    runtime_min: int
    measured_s: float | None = None
    payload: dict = field(default_factory=dict)

    @property
    def expected_s(self) -> float:
        if self.measured_s is not None:
            return min(self.measured_s * MEASURED_MARGIN, self.runtime_min * 60)
        return self.runtime_min * 60

    @property
    def limit_s(self) -> int:
        """The step's own time limit: what the cell's own job would get."""
        return self.runtime_min * 60


@dataclass(frozen=True)
class Step:
    """One cell's planned step in its pack: its index in the pack's order, when it is expected
    to start and end (seconds after the pack's start) and its nodes (indices into the
    allocation's node list)."""

    slot: int
    start_s: float
    end_s: float
    nodes: tuple[int, ...]


def step_seconds(cell: PackCell) -> float:
    """What a step is expected to take: the cell and its step overhead."""
    return cell.expected_s + STEP_OVERHEAD_S


def run_order(cells: list[PackCell], concurrent: bool = True) -> list[PackCell]:
    """The order a pack runs its cells in: longest expected first, wider cells first among
    equals, then path order (a series' repetitions together); serial: path order."""
    if not concurrent:
        return list(cells)
    return sorted(cells, key=lambda c: (-c.expected_s, -c.nodes, natural(c.path)))


def list_schedule(cells: list[PackCell], width: int, concurrent: bool = True) -> list[Step]:
    """List scheduling of `cells` in their order on `width` nodes, as the pack runner runs
    them: each cell starts once as many nodes as it needs are free and every cell before it
    has started, on the first free nodes (lowest index); serial: one cell at a time."""
    free_at = [0.0] * width
    last_start, steps = 0.0, []
    for slot, cell in enumerate(cells):
        if cell.nodes > width:
            raise ValueError(f"cell {cell.path} needs {cell.nodes} nodes, the pack has {width}")
        if concurrent:
            start = max(last_start, sorted(free_at)[cell.nodes - 1])
        else:
            start = max(free_at)
        nodes = tuple([i for i in range(width) if free_at[i] <= start][: cell.nodes])
        end = start + step_seconds(cell)
        for i in nodes:
            free_at[i] = end
        last_start = start
        steps.append(Step(slot, start, end, nodes))
    return steps


def schedule_minutes(steps: list[Step]) -> int:
    """A pack's time limit: its schedule's end and the runner's start."""
    seconds = PACK_OVERHEAD_S + max((s.end_s for s in steps), default=0.0)
    return max(1, math.ceil(seconds / 60))


def _widths(low: int, high: int) -> list[int]:
    if high - low + 1 <= SHAPES_TRIED:
        return list(range(low, high + 1))
    step = (high - low) / (SHAPES_TRIED - 1)
    return sorted({low + round(i * step) for i in range(SHAPES_TRIED)})


def width_range(
    cells: list[PackCell], max_width: int | None, concurrent: bool = True
) -> tuple[int, int]:
    """The node counts a pack of `cells` may take: from its largest cell's to `max_width`
    (None: unknown, the largest cell's) or the nodes its cells need all at once, whichever is
    fewer; serial: the largest cell's only."""
    low = max(c.nodes for c in cells)
    if not concurrent:
        return low, low
    return low, max(low, min(max_width or low, sum(c.nodes for c in cells)))


def pack_shape(
    cells: list[PackCell], max_width: int | None = None, concurrent: bool = True
) -> tuple[int, list[Step]]:
    """(nodes, schedule) of a pack of `cells` in run order: the node count of width_range whose
    schedule ends first (the fewest such nodes)."""
    low, high = width_range(cells, max_width, concurrent)
    if not concurrent:
        return low, list_schedule(cells, low, False)
    best = None
    for width in _widths(low, high):
        steps = list_schedule(cells, width)
        end = max(s.end_s for s in steps)
        if best is None or end < best[0] - 1e-9:
            best = (end, width, steps)
    return best[1], best[2]


@dataclass
class Pack:
    """A pack's cells in the order it runs them, the allocation's node count and their
    schedule on it (pack_shape)."""

    cells: list[PackCell]
    max_width: int | None = None
    concurrent: bool = True

    def __post_init__(self):
        self.cells = run_order(self.cells, self.concurrent)
        self.width, self.steps = pack_shape(self.cells, self.max_width, self.concurrent)

    def reshape(self, width: int) -> None:
        """The pack on `width` nodes (share_widths)."""
        self.width, self.steps = width, list_schedule(self.cells, width, self.concurrent)

    def end_on(self, width: int) -> float:
        """When the pack's schedule on `width` nodes ends (seconds)."""
        return max(s.end_s for s in list_schedule(self.cells, width, self.concurrent))

    @property
    def nodes(self) -> int:
        return self.width

    @property
    def time_min(self) -> int:
        return schedule_minutes(self.steps)


def pack_minutes(
    cells: list[PackCell], max_width: int | None = None, concurrent: bool = True
) -> int:
    """A pack's time limit: its cells' schedule on its chosen shape, with each step's overhead
    and the runner's."""
    return Pack(list(cells), max_width, concurrent).time_min


def widest_minutes(
    cells: list[PackCell], max_width: int | None = None, concurrent: bool = True
) -> int:
    """The time limit of `cells` on the widest shape they may take (the shortest schedule, one
    schedule computed: plan_packs asks at every cell)."""
    widest = width_range(cells, max_width, concurrent)[1]
    return schedule_minutes(list_schedule(run_order(cells, concurrent), widest, concurrent))


def plan_packs(
    cells: list[PackCell],
    per_pack: int,
    max_time_min: int | None,
    max_width: int | None = None,
    concurrent: bool = True,
) -> tuple[list[Pack], list[PackCell]]:
    """Packs of `cells` in their order (first fit: a new pack when the next cell would pass
    `per_pack` cells, 0 = no count limit, or the time limit `max_time_min`, None = none, on the
    widest shape `max_width` allows), each shaped by pack_shape, or several sharing
    `max_width` (share_widths), and the cells no pack can hold (alone above the time limit:
    they run as their own jobs)."""
    packs: list[Pack] = []
    alone: list[PackCell] = []
    current: list[PackCell] = []
    for cell in cells:
        if max_time_min is not None and pack_minutes([cell]) > max_time_min:
            alone.append(cell)
            continue
        full = per_pack and len(current) >= per_pack
        too_long = (
            max_time_min is not None
            and widest_minutes([*current, cell], max_width, concurrent) > max_time_min
        )
        if current and (full or too_long):
            packs.append(Pack(current, max_width, concurrent))
            current = []
        current.append(cell)
    if current:
        packs.append(Pack(current, max_width, concurrent))
    if concurrent and max_width and len(packs) > 1:
        share_widths(packs, max_width, max_time_min)
    return packs, alone


def share_widths(packs: list[Pack], max_width: int, max_time_min: int | None) -> None:
    """The nodes of `max_width` shared among packs that start together, so that together they
    ask for no more than the entry may use at once: each pack from the fewest nodes it needs
    (its largest cell's, or more where its time limit needs them), then one node at a time to
    the pack that ends last while that brings its end forward. Packs whose fewest nodes add up
    to more than `max_width` keep those (they wait for each other in the queue)."""

    def fits(pack: Pack, width: int) -> bool:
        return (
            max_time_min is None
            or schedule_minutes(list_schedule(pack.cells, width, pack.concurrent)) <= max_time_min
        )

    widths = []
    for pack in packs:
        width = max(c.nodes for c in pack.cells)
        while width < pack.width and not fits(pack, width):
            width += 1
        widths.append(width)
    ends = [pack.end_on(w) for pack, w in zip(packs, widths)]
    while sum(widths) < max_width:
        last = max(range(len(packs)), key=lambda i: ends[i])
        end = packs[last].end_on(widths[last] + 1)
        if end >= ends[last] - 1e-9:
            break  # the last pack ends no sooner with another node
        widths[last], ends[last] = widths[last] + 1, end
    for pack, width in zip(packs, widths):
        pack.reshape(width)


def plan_lines(pack_id: str, pack: Pack, runs_dir: str | None = None) -> list[str]:
    """The plan of one pack as the dry run and the driver print it: its nodes, time limit and
    the expected order of its steps (start after the pack's start, nodes by index)."""
    way = "side by side" if pack.concurrent else "one at a time"
    lines = [
        f"pack {pack_id}: {len(pack.cells)} cells {way} in one allocation of {pack.width} "
        f"node(s) and {pack.time_min} min"
    ]
    for step in pack.steps:
        cell = pack.cells[step.slot]
        name = cell.path
        if runs_dir and name.startswith(runs_dir):
            name = name[len(runs_dir) :].lstrip("/")
        name = name.removesuffix("/metrics.jsonl")
        nodes = ",".join(str(i + 1) for i in step.nodes)
        took = "measured" if cell.measured_s is not None else "runtime_min"
        lines.append(
            f"  {step.slot + 1:>3}. +{step.start_s / 60:.1f} min  node(s) {nodes}  {name} "
            f"(~{step_seconds(cell) / 60:.1f} min, {took})"
        )
    return lines


def natural(path: str) -> tuple:
    """Sort key of a cell path with its numbers as numbers (n2 before n10, r2 before r10)."""
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", path))

"""First contact: a cell's communicator set-up and first step, bounded by the launcher.

Each framework bounds its own collectives from inside the ranks (the collective timeout, the
first step's deadline), but a rank can block where none of them reaches: a communicator's
set-up inside NCCL, a rank that never arrives at the rendezvous. So every rank marks how far it
got in its rank folder (`mark`, one small JSON file per rank, MARK_FILE), at the one place every
framework's rank passes (dlscale.run.train):

  started          the process runs and knows who it is (its host, interfaces and the
                   communication variables it sees are recorded here: dlscale.run.diagnosis)
  setting up       it entered the framework's set-up (process group / communicator, model)
  first step       set-up returned; its first training step has not completed yet
  first step done  its first step completed (the hook before step 1, or the rank's end)

The launcher (dlscale.run.launch.wait_all, with a `Watch`) starts its clock when it first sees a
rank `setting up`, and stops every rank when not all of them reached `first step done` within
`deadline_s(cell)`; the failure names the ranks furthest behind. After that it waits without a
deadline (Slurm's time limit bounds the rest). Ranks alone before set-up (interpreter,
imports, staging a dataset) are not on this clock.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from dlscale.rank.timing import COLLECTIVE_TIMEOUT_S

PHASES = ("started", "setting up", "first step", "first step done")
STARTED, SETTING_UP, FIRST_STEP, FIRST_STEP_DONE = PHASES
MARK_FILE = "first_contact-{rank}.json"

# The launcher's deadline, from the first rank's set-up to every rank's first completed step:
# the longest set-up a framework allows itself (Horovod's rendezvous watchdog, 2 x the
# collective timeout + 60 s), the first step's own deadline (at least the collective timeout),
# and this margin above both, so a rank's own timeout (and its diagnosis) comes first.
SETUP_BOUND_S = 2 * COLLECTIVE_TIMEOUT_S + 60
MARGIN_S = 120
DEADLINE_ENV = "DLSCALE_FIRST_CONTACT_S"  # overrides deadline_s (seconds; tests)
POLL_S = 1.0  # how often the launcher reads the marks


def deadline_s(cell, env=os.environ) -> float | None:
    """Seconds the launcher allows from the first rank's set-up until every rank completed its
    first step; None for a single rank, which waits for no peer."""
    if cell.world_size == 1:
        return None
    if env.get(DEADLINE_ENV):
        return float(env[DEADLINE_ENV])
    return SETUP_BOUND_S + max(COLLECTIVE_TIMEOUT_S, cell.first_step_timeout_s) + MARGIN_S


def mark(rank_dir, rank: int, phase: str, **facts) -> None:
    """Record that `rank` reached `phase` (renamed into place whole); `facts` are kept with
    later phases."""
    path = Path(rank_dir) / MARK_FILE.format(rank=rank)
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        record = {}
    record.update(facts, phase=phase, time=time.time())
    tmp = path.with_name(f".{path.name}.tmp")
    path.parent.mkdir(parents=True, exist_ok=True)  # a rank started without the launcher
    tmp.write_text(json.dumps(record))
    os.replace(tmp, path)


def read_marks(rank_dir, world_size: int) -> dict[int, dict]:
    """Each rank's last mark; a rank with none is absent."""
    marks = {}
    for rank in range(world_size):
        try:
            marks[rank] = json.loads((Path(rank_dir) / MARK_FILE.format(rank=rank)).read_text())
        except (OSError, ValueError):
            continue
    return marks


def phase_of(marks: dict, rank: int) -> str:
    return marks[rank]["phase"] if rank in marks else "not started"


def step_hook(rank_dir, rank: int, before_step=None):
    """The rank's before-step hook: marks `first step done` before step 1 (the first step of
    every framework's loop completed), then runs `before_step` (fault injection) if given."""

    def hook(step) -> None:
        if step == 1:
            mark(rank_dir, rank, FIRST_STEP_DONE)
        if before_step:
            before_step(step)

    return hook


class Watch:
    """The launcher's first-contact clock over a cell's marks (see the module's text)."""

    def __init__(self, rank_dir, world_size: int, seconds: float):
        self.rank_dir, self.world_size, self.seconds = rank_dir, world_size, seconds
        self.since = None  # monotonic time the launcher first saw a rank setting up
        self.done = False
        self.next_read = 0.0

    def expired(self) -> bool:
        """Whether the deadline passed with a rank short of its first completed step (reads
        the marks at most every POLL_S)."""
        now = time.monotonic()
        if self.done or now < self.next_read:
            return False
        self.next_read = now + POLL_S
        marks = read_marks(self.rank_dir, self.world_size)
        phases = [phase_of(marks, r) for r in range(self.world_size)]
        self.done = all(p == FIRST_STEP_DONE for p in phases)
        if self.since is None and any(p not in (STARTED, "not started") for p in phases):
            self.since = now
        return not self.done and self.since is not None and now - self.since > self.seconds


def failure_reason(rank_dir, world_size: int, seconds: float) -> tuple[str, list[int]]:
    """Why the launcher stopped the cell, naming the ranks furthest behind (a rank the others
    wait for), and those ranks."""
    marks = read_marks(rank_dir, world_size)
    order = ("not started", *PHASES)
    phases = {r: phase_of(marks, r) for r in range(world_size)}
    last = min(order.index(p) for p in phases.values())
    behind = [r for r, p in phases.items() if order.index(p) == last]
    others = ", ".join(
        f"{p}: {[r for r in phases if phases[r] == p]}"
        for p in order[last + 1 :]
        if p in phases.values()
    )
    return (
        f"first contact: not every rank completed its first step within {seconds:g} s of the "
        f"first rank's communicator set-up ({DEADLINE_ENV}); furthest behind: rank(s) {behind} "
        f"({order[last]})" + (f"; the others: {others}" if others else ""),
        behind,
    )

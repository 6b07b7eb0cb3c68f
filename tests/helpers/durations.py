"""The tests' expected durations, from a measured run, so the scheduler (tests/conftest.py) hands
out the longest work first and no long test starts last on an otherwise idle machine.

tests/durations.json maps each test id that took 1 s or more to its seconds (setup, call and
teardown) in the run it was taken from; a test it does not name (new, or shorter) counts as
DEFAULT_S. The order it gives changes when tests run, never what they assert; a stale file only
orders less well. Refresh it from a run's timeline (DLSCALE_TEST_TIMELINE, written by the test
command):

    DLSCALE_TEST_TIMELINE=/tmp/timeline.json bash scripts/test.sh
    .venv/bin/python tests/helpers/durations.py /tmp/timeline.json
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path

FILE = Path(__file__).resolve().parents[1] / "durations.json"
DEFAULT_S = 0.1  # a test the file does not name (most take a fraction of a second)
RECORDED_FROM_S = 1.0  # shorter tests are left out of the file


def load(path: Path = FILE) -> dict[str, float]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def expected(nodeids, durations: dict[str, float]) -> float:
    """The expected seconds of a work unit (one test, or a group's tests)."""
    return sum(durations.get(n, DEFAULT_S) for n in nodeids)


def work_order(units: dict[str, list[str]], first: tuple[str, ...], durations) -> list[str]:
    """The order work units are handed out in: `first` (those present), then the others longest
    expected first (a longest-processing-time list schedule: the last handed out are the
    shortest, so the workers end together). `units`: each unit's test ids."""
    rest = [u for u in units if u not in first]
    rest.sort(key=lambda u: -expected(units[u], durations))
    return [u for u in first if u in units] + rest


def from_timeline(timeline: list[dict]) -> dict[str, float]:
    """Each test's seconds (all its phases) in a timeline, those of RECORDED_FROM_S or more."""
    seconds: dict[str, float] = defaultdict(float)
    for phase in timeline:
        seconds[phase["test"]] += phase["stop"] - phase["start"]
    return {t: round(s, 1) for t, s in sorted(seconds.items()) if s >= RECORDED_FROM_S}


def main(argv: list[str]) -> int:
    (timeline,) = argv
    durations = from_timeline(json.loads(Path(timeline).read_text()))
    FILE.write_text(json.dumps(durations, indent=0, sort_keys=True) + "\n")
    print(f"{FILE}: {len(durations)} tests, {sum(durations.values()):.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

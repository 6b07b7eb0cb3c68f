"""The order the test command hands work out in (tests/helpers/durations.py, the scheduler in
tests/conftest.py): the long cluster groups first, then the longest expected work, so a long
test never starts last beside idle workers."""

from __future__ import annotations

import json

from helpers import durations


def test_work_goes_out_long_groups_first_then_longest_expected_first(tmp_path):
    units = {
        "tests/unit/a.py::short": ["tests/unit/a.py::short"],
        "slurm": ["tests/slurm/x.py::t1", "tests/slurm/x.py::t2"],
        "tests/workflow/w.py::long": ["tests/workflow/w.py::long"],
        "tests/unit/m.py": ["tests/unit/m.py::a", "tests/unit/m.py::b", "tests/unit/m.py::c"],
        "tests/unit/new.py::unknown": ["tests/unit/new.py::unknown"],
    }
    known = {"tests/unit/a.py::short": 1.0, "tests/workflow/w.py::long": 55.0}
    known |= {"tests/unit/m.py::a": 20.0, "tests/unit/m.py::b": 20.0}
    order = durations.work_order(units, ("slurm", "slurm-b"), known)
    # a group's expected time is its tests' (a test the file does not name: DEFAULT_S)
    assert order == [
        "slurm",
        "tests/workflow/w.py::long",
        "tests/unit/m.py",
        "tests/unit/a.py::short",
        "tests/unit/new.py::unknown",
    ]
    assert durations.expected(units["tests/unit/m.py"], known) == 40.0 + durations.DEFAULT_S


def test_the_durations_file_is_written_from_a_runs_timeline_and_read_back(tmp_path):
    timeline = [
        {"test": "t::a", "when": "setup", "start": 0.0, "stop": 30.0},
        {"test": "t::a", "when": "call", "start": 30.0, "stop": 32.5},
        {"test": "t::quick", "when": "call", "start": 0.0, "stop": 0.2},
    ]
    assert durations.from_timeline(timeline) == {"t::a": 32.5}  # under 1 s: left out
    path = tmp_path / "timeline.json"
    path.write_text(json.dumps(timeline))
    out = tmp_path / "durations.json"
    out.write_text(json.dumps(durations.from_timeline(timeline)))
    assert durations.load(out) == {"t::a": 32.5}
    assert durations.load(tmp_path / "absent.json") == {}
    shipped = durations.load()  # the committed file: every entry a test id with its seconds
    assert shipped and all("::" in t and s >= durations.RECORDED_FROM_S for t, s in shipped.items())

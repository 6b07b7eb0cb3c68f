"""Every shipped study's cells, pinned: writes tests/fixtures/shipped_cells.json, which
tests/unit/study/test_shipped_cells.py compares with the cells the production planner plans.

A shipped study is config/config.yaml (the demo, read with no study_file), each
config/studies/*.yaml and tests/fixtures/tiny.yaml (SHIPPED_STUDY_FILES). Each is loaded as
the workflow loads it (dlscale.study.matrix.load_workflow_study, with `study_file` set to the
file but for config/config.yaml), and the fixture holds, per study file, the study's name and
config hash and, per cell path, the cell's config hash and its Cell.to_json() as parsed JSON
(one field a line, so a diff of the fixture shows which field moved). Cell.to_json() is
json.dumps(..., sort_keys=True), so `json.dumps(fields, sort_keys=True)` gives its text back
byte for byte; the generator checks that for every cell before it writes.

Regenerate, only when a change to a shipped cell's identity is deliberate (from the repository
root):

    .venv/bin/python tests/helpers/shipped_identities.py

or, from tests/: `../.venv/bin/python -m helpers.shipped_identities`. With `--check` it writes
nothing and exits 1 naming every cell that differs from the fixture.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from dlscale.study.matrix import Study, load_workflow_study

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests" / "fixtures" / "shipped_cells.json"
REGENERATE = ".venv/bin/python tests/helpers/shipped_identities.py"
DEFAULT_STUDY_FILE = "config/config.yaml"  # the workflow reads it without a study_file
ABOUT = (
    "Every shipped study's cells as the production planner plans them "
    "(dlscale.study.matrix.load_workflow_study, with study_file set to the file but for "
    "config/config.yaml): per study file its name and config hash, per cell path the cell's "
    "config hash and Cell.to_json() parsed (json.dumps(cell, sort_keys=True) is its text byte "
    "for byte). Written by `" + REGENERATE + "` from the repository root; checked by "
    "tests/unit/study/test_shipped_cells.py."
)
MAX_LISTED = 20  # cells named in a message; the rest counted


def shipped_study_files(root: Path = ROOT) -> list[str]:
    """The shipped study files, relative to `root`: the demo, config/studies/*.yaml, tiny."""
    studies = sorted(
        p.relative_to(root).as_posix() for p in (root / "config/studies").glob("*.yaml")
    )
    return [DEFAULT_STUDY_FILE, *studies, "tests/fixtures/tiny.yaml"]


def load_shipped(name: str, root: Path = ROOT, **cli) -> Study:
    """The study of shipped file `name` as the workflow plans it (`cli`: further --config)."""
    study_file = {} if name == DEFAULT_STUDY_FILE else {"study_file": name}
    return load_workflow_study({**study_file, **cli}, root)


def canonical(fields: dict) -> str:
    """A pinned cell's Cell.to_json() text (the same json.dumps call)."""
    return json.dumps(fields, sort_keys=True)


def pin(study: Study) -> dict:
    """A study's entry in the fixture."""
    cells = {}
    for cell in study.cells:
        text = cell.to_json()
        fields = json.loads(text)
        if canonical(fields) != text:
            raise ValueError(f"{cell.path}: Cell.to_json() does not round-trip through JSON")
        if cell.path in cells:
            raise ValueError(f"{cell.path}: two cells of study {study.config['study']!r}")
        cells[cell.path] = {"config_hash": cell.config_hash, "cell": fields}
    return {
        "study": study.config["study"],
        "config_hash": study.config_hash,
        "cells": dict(sorted(cells.items())),
    }


def snapshot(root: Path = ROOT) -> dict:
    """The whole fixture: every shipped study pinned."""
    return {
        "_about": ABOUT,
        "studies": {name: pin(load_shipped(name, root)) for name in shipped_study_files(root)},
    }


def field_changes(pinned: dict, planned: dict) -> list[str]:
    """`field: pinned -> planned` for each field that differs (`<absent>` where one lacks it)."""
    absent = "<absent>"
    return [
        f"{k}: {pinned.get(k, absent)!r} -> {planned.get(k, absent)!r}"
        for k in sorted(set(pinned) | set(planned))
        if pinned.get(k, absent) != planned.get(k, absent)
    ]


def differences(name: str, study: Study, pinned: dict) -> list[str]:
    """What differs between study file `name`'s planned study and its fixture entry `pinned`:
    one line per changed cell (its path and the fields that moved), per cell gained or lost,
    and for the study's name or config hash. Empty where every cell is pinned byte for byte."""
    out = []
    for key, now in (("study", study.config["study"]), ("config_hash", study.config_hash)):
        if pinned[key] != now:
            out.append(f"{name}: the study's {key}: {pinned[key]!r} -> {now!r}")
    planned = {c.path: c for c in study.cells}
    if len(planned) != len(study.cells):
        out.append(f"{name}: {len(study.cells) - len(planned)} cells share a path with another")
    gained = sorted(set(planned) - set(pinned["cells"]))
    lost = sorted(set(pinned["cells"]) - set(planned))
    out += [f"{name}: {path}: a cell not in the fixture (gained)" for path in gained]
    out += [f"{name}: {path}: a pinned cell no longer planned (lost)" for path in lost]
    for path in sorted(set(planned) & set(pinned["cells"])):
        cell, was = planned[path], pinned["cells"][path]
        text = cell.to_json()
        if text == canonical(was["cell"]) and cell.config_hash == was["config_hash"]:
            continue
        moved = field_changes(was["cell"], json.loads(text))
        hashed = any(m.startswith("config_hash:") for m in moved)
        if cell.config_hash != was["config_hash"] and not hashed:  # the entry's own hash
            moved.append(f"config_hash: {was['config_hash']!r} -> {cell.config_hash!r}")
        out.append(
            f"{name}: {path}: "
            + ("; ".join(moved) or "the same fields, but Cell.to_json()'s text differs")
        )
    return out


def report(problems: list[str]) -> str:
    """A failure message: the first MAX_LISTED problems, a count of the rest, and the command
    that regenerates the fixture where the change is deliberate."""
    listed = problems[:MAX_LISTED]
    if len(problems) > MAX_LISTED:
        listed.append(f"... and {len(problems) - MAX_LISTED} more")
    return (
        f"{len(problems)} difference(s) from {FIXTURE.relative_to(ROOT)}:\n  "
        + "\n  ".join(listed)
        + "\nIf the change of identity is deliberate (these cells are re-measured), regenerate "
        f"the fixture from the repository root: {REGENERATE}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--check", action="store_true", help="compare with the fixture, write nothing"
    )
    parser.add_argument("--output", type=Path, default=FIXTURE, help="where to write")
    args = parser.parse_args(argv)
    if args.check:
        pinned = json.loads(args.output.read_text())["studies"]
        problems = []
        names = shipped_study_files()
        if list(pinned) != names:
            problems.append(f"studies pinned {list(pinned)}, shipped {names}")
        for name in names:
            if name in pinned:
                problems += differences(name, load_shipped(name), pinned[name])
        print(report(problems) if problems else f"{args.output}: every shipped cell as pinned")
        return 1 if problems else 0
    data = snapshot()
    args.output.write_text(json.dumps(data, indent=1) + "\n")
    counts = {name: len(study["cells"]) for name, study in data["studies"].items()}
    for name, n in counts.items():
        print(f"{name}: {n} cells")
    print(f"{args.output}: {sum(counts.values())} cells pinned")
    return 0


if __name__ == "__main__":
    sys.exit(main())

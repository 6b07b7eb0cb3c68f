"""Every shipped study's cells keep their identity: each cell the production planner plans for a
shipped study file (the demo config/config.yaml, config/studies/*.yaml, tests/fixtures/tiny.yaml)
has the path, config hash and Cell.to_json() byte for byte that tests/fixtures/shipped_cells.json
pins, and no cell is gained or lost. A change that alters what any shipped cell measures fails
here, naming the study, the cell and the fields that moved; where it is deliberate (the cells are
re-measured), regenerate the fixture with the command in tests/helpers/shipped_identities.py
(`.venv/bin/python tests/helpers/shipped_identities.py`) and let the fixture's diff show the
fields. A key added later enters a cell's identity only where it is set away from its default
(dlscale.study.cell.LATER_FIELDS; for a hardware key dlscale.study.hashes.LATER_DEFAULTS), so
adding one changes no pinned cell."""

from __future__ import annotations

import copy
import json

import pytest

from dlscale.study.cell import Cell

from helpers.shipped_identities import (
    FIXTURE,
    REGENERATE,
    canonical,
    differences,
    load_shipped,
    report,
    shipped_study_files,
)

SHIPPED = shipped_study_files()
# The cells pinned per study file; a study that gains or loses cells changes this with the
# fixture (the test below says which cells).
PINNED_CELLS = {
    "config/config.yaml": 20,
    "config/studies/frameworks.yaml": 80,
    "config/studies/parallelism.yaml": 40,
    "tests/fixtures/tiny.yaml": 6,
}


@pytest.fixture
def pinned() -> dict:
    return json.loads(FIXTURE.read_text())["studies"]


def test_every_shipped_study_file_is_pinned(pinned):
    assert list(pinned) == SHIPPED, (
        f"shipped study files {SHIPPED}, pinned {list(pinned)}: regenerate the fixture with "
        f"{REGENERATE}"
    )
    counts = {name: len(study["cells"]) for name, study in pinned.items()}
    assert counts == PINNED_CELLS, f"cells pinned per study file {counts}: update PINNED_CELLS"


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_cells_keep_their_path_hash_and_json(root, pinned, name):
    assert name in pinned, f"{name}: a shipped study file not in the fixture; run {REGENERATE}"
    study = load_shipped(name, root)
    problems = differences(name, study, pinned[name])
    assert not problems, report(problems)
    # the same, stated directly: exactly the pinned paths, each byte for byte
    planned = {cell.path: cell for cell in study.cells}
    assert len(planned) == len(study.cells) == len(pinned[name]["cells"])
    assert set(planned) == set(pinned[name]["cells"])
    for path, was in pinned[name]["cells"].items():
        cell = planned[path]
        assert cell.to_json() == canonical(was["cell"]), (name, path)
        assert cell.config_hash == was["config_hash"] == was["cell"]["config_hash"], (name, path)
        assert Cell.from_json(cell.to_json()) == cell, (name, path)


def test_a_moved_field_a_gained_and_a_lost_cell_are_named(root, pinned):
    """The message names the study, each cell and the fields that moved, and the command that
    regenerates the fixture: here a decoder cell's AdamW eps moved (so its hash), a cell is
    planned that the fixture lacks, and a pinned one is not planned."""
    name = "config/studies/parallelism.yaml"
    study = load_shipped(name, root)
    entry = copy.deepcopy(pinned[name])
    decoder = next(p for p, c in entry["cells"].items() if c["cell"].get("optimizer") == "adamw")
    entry["cells"][decoder]["cell"]["adam_eps"] = 1e-07
    gained = sorted(p for p in entry["cells"] if p != decoder)[0]
    del entry["cells"][gained]
    lost = gained.replace("/r1/", "/r9/")
    entry["cells"][lost] = pinned[name]["cells"][gained]
    problems = differences(name, study, entry)
    assert problems == [
        f"{name}: {gained}: a cell not in the fixture (gained)",
        f"{name}: {lost}: a pinned cell no longer planned (lost)",
        f"{name}: {decoder}: adam_eps: 1e-07 -> 1e-08",
    ]
    message = report(problems)
    assert "3 difference(s) from tests/fixtures/shipped_cells.json" in message
    assert message.endswith(f"regenerate the fixture from the repository root: {REGENERATE}")
    # a setting that enters the cells (the optimizer's eps): every AdamW cell named, with its
    # moved fields (the setting and the hash), and the study's hash
    changed = load_shipped(name, root, optimizer={"eps": 1e-07})
    problems = differences(name, changed, pinned[name])
    adamw = sorted(p for p, c in pinned[name]["cells"].items() if c["cell"].get("optimizer"))
    assert adamw and all(pinned[name]["cells"][p]["cell"]["optimizer"] == "adamw" for p in adamw)
    assert problems[0].startswith(f"{name}: the study's config_hash: ")
    assert [p.split(": ")[1] for p in problems[1:]] == adamw
    for line, path in zip(problems[1:], adamw, strict=True):
        was = pinned[name]["cells"][path]["config_hash"]
        assert line.startswith(f"{name}: {path}: adam_eps: 1e-08 -> 1e-07; config_hash: '{was}'")

"""A measured cell is never silently destroyed: kept measurements, adoption of plain files,
the identity check that stops a run, and the migration from the layout before studies."""

from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path

import pytest

from dlscale.store import measurements as archive
from dlscale.store import metrics
from dlscale.store.migrate import migrate
from dlscale.study.cell import MEASUREMENTS_DIR, Cell

from helpers.cells import cell_dict
from helpers.synthetic_metrics import assembled


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_every_measurement_is_kept_and_metrics_jsonl_is_the_current_one(tmp_path):
    out = tmp_path / "cell" / "metrics.jsonl"
    first = archive.keep_measurement(out, assembled(), metrics.write_atomic, slurm_job_id="7")
    old = digest(out)
    assert first.name.endswith("-job7") and digest(first / "metrics.jsonl") == old
    out.unlink()  # what Snakemake does before re-running it
    second = archive.keep_measurement(out, assembled(wall_seconds=3.0), metrics.write_atomic)
    assert second != first and second.name.endswith(f"-pid{__import__('os').getpid()}")
    assert digest(first / "metrics.jsonl") == old  # the earlier one is intact
    assert (
        out.read_bytes()
        == (second / "metrics.jsonl").read_bytes()
        != first.joinpath("metrics.jsonl").read_bytes()
    )
    assert out.stat().st_ino == (second / "metrics.jsonl").stat().st_ino  # a hard link
    assert archive.earlier_measurements(out) == 1
    assert [p.name for p in archive.measurements(out)] == sorted([first.name, second.name])


def test_a_plain_metrics_file_is_adopted_without_change(tmp_path):
    out = tmp_path / "cell" / "metrics.jsonl"
    metrics.write_atomic(out, assembled())
    before = digest(out)
    assert archive.adopt_unarchived([out, tmp_path / "absent" / "metrics.jsonl"]) == [str(out)]
    kept = archive.measurements(out)
    assert len(kept) == 1 and kept[0].name.endswith("-adopted")
    assert digest(out) == before == digest(kept[0] / "metrics.jsonl")
    out.unlink()
    assert digest(kept[0] / "metrics.jsonl") == before  # survives the removal
    assert archive.adopt_unarchived([out]) == []  # nothing twice


def write_cell(cell: Cell, **cell_changes) -> Path:
    """The cell's metrics file, as if it had been measured with `cell_changes`."""
    records = assembled(cell=Cell.from_dict({**cell.as_dict(), **cell_changes}))
    path = Path(cell.path)
    metrics.write_atomic(path, records)
    return path


def test_a_changed_cell_is_named_with_its_fields(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    same = Cell.from_dict(cell_dict(rep=1))
    changed = Cell.from_dict(cell_dict(rep=2))
    never = Cell.from_dict(cell_dict(rep=3))
    write_cell(same)
    write_cell(changed, steps=5, launcher="srun")
    elsewhere = Cell.from_dict(cell_dict(rep=2, study="not-measured-yet"))
    found = archive.changed_cells([same, elsewhere, changed, never])
    assert [(c.rep, sorted(diff)) for c, diff in found] == [(2, ["launcher", "steps"])]
    assert found[0][1]["steps"] == (5, 2)
    command = "snakemake --profile profiles/local --config study_file=s.yaml remeasure=True"
    message = archive.describe_changes(found, command)
    assert changed.path in message and "steps: measured 5, now 2" in message
    assert f"\n  {command}" in message and "Nothing was run or removed" in message


def test_a_study_keeps_the_launcher_it_was_measured_with(tmp_path, monkeypatch):
    """A study measured with srun, planned now with the local launcher (the local profile): its
    cells are planned with srun, so rebuilding its tables runs no cell and nothing reads as a
    change to re-measure; a cell whose steps changed too is still a change. The messages name
    the study's launcher and print the command given, not remeasure=True."""
    monkeypatch.chdir(tmp_path)
    same, stepped, fresh = (Cell.from_dict(cell_dict(rep=r)) for r in (1, 2, 3))
    write_cell(same, launcher="srun")
    write_cell(stepped, launcher="srun", steps=5)
    changed = archive.changed_cells([same, stepped, fresh])
    cells, kept, left = archive.keep_measured_launchers([same, stepped, fresh], changed)
    assert kept == {same.path: "srun", stepped.path: "srun"}
    assert [c.launcher for c in cells] == ["srun", "srun", "local"]  # the new cell: the run's
    assert [(c.path, diff) for c, diff in left] == [(stepped.path, {"steps": (5, 2)})]
    assert archive.changed_cells(cells) == [(cells[1], {"steps": (5, 2)})]
    assert cells[0].config_hash == Cell.from_dict(cell_dict(rep=1, launcher="srun")).config_hash
    command = "snakemake --profile profiles/slurm --forcerun x --config launcher=srun"
    notice = archive.measured_launcher_notice("s", kept, "local", command)
    assert "measured with launcher 'srun' (2 cell(s))" in notice and f"\n  {command}" in notice
    refusal = archive.launcher_refusal("s", kept, "local", [same.path], command)
    assert "would be measured with launcher 'local'" in refusal and same.path in refusal
    assert "Nothing was run or removed" in refusal and refusal.endswith(f"\n  {command}")
    assert "remeasure" not in notice + refusal


def test_files_from_before_the_identity_fields_compare_what_they_record(tmp_path, monkeypatch):
    """A metrics file written before the cell carried launcher, hardware and environment: its
    launcher comes from its provenance; fields it does not record are not compared."""
    monkeypatch.chdir(tmp_path)
    cell = Cell.from_dict(cell_dict())
    path = write_cell(cell, launcher="srun")
    lines = path.read_text().splitlines()
    first = json.loads(lines[0])
    for key in ("launcher", "hardware_hash", "environment"):
        del first["value"]["cell"][key]
    path.unlink()
    path.write_text("\n".join([json.dumps(first), *lines[1:]]) + "\n")
    assert archive.changed_cells([cell])[0][1] == {"launcher": ("srun", "local")}
    assert archive.changed_cells([Cell.from_dict(cell_dict(launcher="srun"))]) == []


def legacy_cell(results: Path, study: str, rep: int) -> Path:
    """A cell in the layout before studies had their own folders (results/runs/...)."""
    cell = Cell.from_dict(cell_dict(study=study, rep=rep))
    path = results / "runs" / cell.path.split("/runs/", 1)[1]
    metrics.write_atomic(path, assembled(cell=cell))
    return path


def test_migration_moves_each_cell_to_its_study_and_deletes_nothing(tmp_path):
    results = tmp_path / "results"
    a = legacy_cell(results, "demo", 1)
    b = legacy_cell(results, "frameworks", 2)  # another study's cell
    (results / "tables").mkdir()
    (results / "tables" / "cells.csv").write_text("old table\n")
    # the new layout already holds a measurement of the demo's cell: it stays the current one
    current = results / "demo" / "runs" / a.relative_to(results / "runs")
    metrics.write_atomic(
        current, assembled(cell=Cell.from_dict(cell_dict(study="demo")), wall_seconds=9.0)
    )
    sums = {digest(a), digest(b), digest(current)}
    done = migrate(results, out=io.StringIO())
    assert done["cells"] == 2
    moved_b = results / "frameworks" / "runs" / b.relative_to(results / "runs")
    assert digest(moved_b) == digest(
        moved_b.parent / MEASUREMENTS_DIR / archive.measurements(moved_b)[0].name / "metrics.jsonl"
    )
    assert archive.earlier_measurements(current) == 1  # the old demo measurement
    kept = {digest(p) for p in results.rglob("metrics.jsonl")}
    assert sums <= kept  # every measurement is there
    assert not (results / "runs").exists() and not (results / "tables").exists()
    assert (Path(done["kept_in"]) / "tables" / "cells.csv").read_text() == "old table\n"
    out = io.StringIO()
    assert migrate(results, out=out) == {"cells": 0, "other": 0}
    assert "nothing to do" in out.getvalue()


def test_migration_dry_run_moves_nothing(tmp_path):
    results = tmp_path / "results"
    a = legacy_cell(results, "demo", 1)
    migrate(results, dry_run=True, out=io.StringIO())
    assert a.exists() and not (results / "demo").exists()


@pytest.mark.parametrize("tag, when, expected", [("job12", 0.0, "19700101T000000Z-job12")])
def test_measurement_ids_sort_by_time(tag, when, expected):
    assert archive.measurement_id(tag, when) == expected

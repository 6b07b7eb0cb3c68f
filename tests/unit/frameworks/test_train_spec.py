"""The rank's spec is derived from its cell (dlscale.frameworks.train_spec.TrainSpec.from_cell):
every field is the cell's field of the same name, but the ones DERIVED_FROM_CELL derives, so a
field added to both reaches the rank without a third copy, and one added to the spec alone
fails here, not in a rank."""

from __future__ import annotations

import dataclasses

import pytest

from dlscale.frameworks.train_spec import DERIVED_FROM_CELL, TrainSpec
from dlscale.study.cell import Cell

from helpers.cells import rank_spec, small_cell
from helpers.shipped_identities import load_shipped, shipped_study_files


def test_every_field_of_the_spec_is_the_cells_or_derived():
    cell_fields = {f.name for f in dataclasses.fields(Cell)}
    spec_fields = {f.name for f in dataclasses.fields(TrainSpec)}
    assert set(DERIVED_FROM_CELL) <= spec_fields
    assert spec_fields - set(DERIVED_FROM_CELL) <= cell_fields, (
        "TrainSpec fields the cell lacks (add them to the cell, or say in DERIVED_FROM_CELL "
        f"how they are derived): {sorted(spec_fields - set(DERIVED_FROM_CELL) - cell_fields)}"
    )
    # the derived ones are not silently the cell's (a field of both names would be ambiguous)
    assert not set(DERIVED_FROM_CELL) & cell_fields


@pytest.mark.parametrize("study", shipped_study_files())
def test_each_shipped_cells_spec_carries_the_cell(study):
    for cell in load_shipped(study).cells:
        spec = TrainSpec.from_cell(cell)
        for f in dataclasses.fields(TrainSpec):
            if f.name not in DERIVED_FROM_CELL:
                assert getattr(spec, f.name) == getattr(cell, f.name), (cell.path, f.name)
        assert (spec.threads, spec.seed) == (cell.cpus_per_rank, 0)
        assert spec.trace_path is None if not cell.trace_steps else spec.trace_path


def test_the_derived_fields_and_a_spec_written_directly():
    traced = TrainSpec.from_cell(small_cell(cpus_per_rank=3, trace_steps=2))
    assert traced.threads == 3 and traced.seed == 0
    assert traced.trace_path.endswith("/r1/trace.json")
    assert TrainSpec.from_cell(small_cell()).trace_path is None
    assert rank_spec(threads=2).threads == 2  # still constructible field by field
    with pytest.raises(TypeError):
        rank_spec(not_a_field=1)

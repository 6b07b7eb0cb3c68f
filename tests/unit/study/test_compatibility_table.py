"""The rules for what was measured before are listed in one documented table
(docs/pages/decisions/changed-defaults.md): every entry of each table in the code that holds
them is named there, so a key added to a table without a word in the docs fails here."""

from __future__ import annotations

from pathlib import Path

import pytest

from dlscale.analysis.collect import BEFORE_AXIS
from dlscale.study import hashes
from dlscale.study.cell import CHANGED_DEFAULTS

ROOT = Path(__file__).resolve().parents[3]
TABLE = ROOT / "docs" / "pages" / "decisions" / "changed-defaults.md"


def table_row(name: str) -> str:
    """The row of the table that names `name` (the code's table)."""
    text = TABLE.read_text()
    rows = [ln for ln in text.splitlines() if ln.startswith("|") and f".{name}`" in ln]
    assert len(rows) == 1, f"{name}: {len(rows)} rows of {TABLE.name}'s tables name it"
    return rows[0]


@pytest.mark.parametrize(
    "name, keys",
    [
        ("CHANGED_DEFAULTS", CHANGED_DEFAULTS),
        ("LATER_CONFIG_DEFAULTS", hashes.LATER_CONFIG_DEFAULTS),
        ("LATER_AXIS_DEFAULTS", hashes.LATER_AXIS_DEFAULTS),
        ("LATER_OPTIMIZER_DEFAULTS", hashes.LATER_OPTIMIZER_DEFAULTS),
        ("LATER_DEFAULTS", hashes.LATER_DEFAULTS),
        ("BEFORE_AXIS", BEFORE_AXIS),
    ],
)
def test_every_entry_of_each_table_is_documented(name, keys):
    row = table_row(name)
    missing = [k for k in keys if f"`{k}`" not in row]
    assert not missing, f"{name} entries missing from the documented table: {missing}"

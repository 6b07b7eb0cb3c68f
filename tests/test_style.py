"""Style is checked, not reviewed: ruff (lint and format, configured in pyproject.toml) over the
Python code and snakefmt over the Snakefile and rules. Fix with `.venv/bin/ruff check --fix .`,
`.venv/bin/ruff format .` and `.venv/bin/snakefmt Snakefile rules/`."""

from __future__ import annotations

import subprocess

import pytest

from helpers.checkout import BIN, ROOT


@pytest.mark.parametrize(
    "command",
    [
        ["ruff", "check", "."],
        ["ruff", "format", "--check", "."],
        ["snakefmt", "--check", "Snakefile", "rules/"],
    ],
)
def test_style(command):
    proc = subprocess.run(
        [str(BIN / command[0]), *command[1:]], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


def test_no_two_test_modules_share_a_name():
    """A reader finds a test module by its name: no basename twice under tests/ (tests/unit's
    folders are packages, so pytest would import two, but `-k`, --durations and the docs name
    modules by their basename)."""
    names = {}
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        names.setdefault(path.name, []).append(str(path.relative_to(ROOT)))
    assert {n: ps for n, ps in names.items() if len(ps) > 1} == {}

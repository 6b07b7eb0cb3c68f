"""Style is checked, not reviewed: ruff (lint and format, configured in pyproject.toml) over the
Python code and snakefmt over the Snakefile and rules. Fix with `.venv/bin/ruff check --fix .`,
`.venv/bin/ruff format .` and `.venv/bin/snakefmt Snakefile rules/`."""

from __future__ import annotations

import subprocess

import pytest

from conftest import BIN, ROOT


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

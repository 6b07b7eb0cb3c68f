"""One set of helpers for the tests and the benchmarks, under tests/helpers/ (imported as
helpers.<module>): cells and rank specs (cells.py), synthetic metrics files (synthetic_metrics.py)
and the workflow's copies with the repository's paths (checkout.py). Fixtures stay fixtures in
tests/conftest.py, which imports the helpers too.

Over every Python file git tracks under tests/ and benchmarks/:
- no module imports conftest (a test that needs a plain function or a constant imports it from
  its helper module);
- no Cell is written out by calling the class outside tests/helpers/ (a test or a benchmark
  names what it changes of helpers.cells.small_cell, or of cell_dict);
- each shared helper is defined once, in its module (SHARED), and a rank_start record's value
  is spelled out only by helpers.synthetic_metrics.
The last test feeds the checks a small tree with one break of each kind, its examples built so
that this file's own text does not match them."""

from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("tests", "benchmarks")
HELPERS = "tests/helpers/"
CONFTEST = "tests/conftest.py"
CELL_LITERAL = re.compile(r"\bCell\(")
# what only one module may write -> that module
SHARED = {
    re.compile(r"^\s*def copy_workflow\("): "tests/helpers/checkout.py",
    re.compile(r"^\s*WORKFLOW_PARTS\s*="): "tests/helpers/checkout.py",  # what a copy holds
    re.compile(r"^\s*def tiny_study\("): "tests/helpers/checkout.py",
    re.compile(r"^\s*def path_without_tex\("): "tests/helpers/checkout.py",
    re.compile(r"^\s*def cell_dict\("): "tests/helpers/cells.py",
    # a key only a rank_start value has: its fields written out
    re.compile(r"[\"']dlscale_version[\"']\s*:"): "tests/helpers/synthetic_metrics.py",
}


def tracked_python(root: Path, folders=SCANNED) -> list[str]:
    """The .py files git tracks under `folders` (relative to `root`) that the tree holds."""
    proc = subprocess.run(
        ["git", "-C", str(root), "ls-files", "-z", "--", *folders],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, f"`git ls-files` failed in {root}: {proc.stderr.strip()}"
    return [p for p in proc.stdout.split("\0") if p.endswith(".py") and (root / p).is_file()]


def conftest_imports(root: Path, paths: list[str]) -> list[str]:
    """`path:line` of every import of conftest outside conftest.py itself."""
    found = []
    for rel in paths:
        if rel == CONFTEST:
            continue
        for node in ast.walk(ast.parse((root / rel).read_text(), rel)):
            names = []
            if isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            if any(name.split(".")[0] == "conftest" for name in names):
                found.append(f"{rel}:{node.lineno}")
    return found


def cell_literals(root: Path, paths: list[str]) -> list[str]:
    """`path:line` of every call of Cell by name outside tests/helpers/ (code and the programs
    tests start)."""
    return [
        f"{rel}:{number}"
        for rel in paths
        if not rel.startswith(HELPERS)
        for number, line in enumerate((root / rel).read_text().splitlines(), start=1)
        if CELL_LITERAL.search(line)
    ]


def second_copies(root: Path, paths: list[str]) -> list[str]:
    """`path:line: what` of every SHARED definition outside its one module."""
    return [
        f"{rel}:{number}: {pattern.pattern} (its home: {home})"
        for rel in paths
        for number, line in enumerate((root / rel).read_text().splitlines(), start=1)
        for pattern, home in SHARED.items()
        if rel != home and pattern.search(line)
    ]


def test_no_test_or_benchmark_imports_conftest():
    found = conftest_imports(ROOT, tracked_python(ROOT))
    assert found == [], (
        "import plain functions and constants from tests/helpers/ (ROOT, copy_workflow, "
        "snakemake, tiny_study: helpers.checkout), never from conftest:\n" + "\n".join(found)
    )


def test_no_cell_is_written_out_outside_the_helpers():
    found = cell_literals(ROOT, tracked_python(ROOT))
    assert found == [], (
        "write a cell as helpers.cells.small_cell(<what differs>) (or cell_dict):\n"
        + "\n".join(found)
    )


def test_each_shared_helper_is_written_once():
    found = second_copies(ROOT, tracked_python(ROOT))
    assert found == [], "a second copy of a shared helper; import it instead:\n" + "\n".join(found)


def test_the_checks_see_each_break(tmp_path):
    """A small tree: a test importing conftest, a benchmark with a Cell literal, a second
    copy_workflow and WORKFLOW_PARTS, and a rank_start value written out; the helpers' own
    Cell literal and rank_start value, and conftest.py itself, pass."""
    call, key = "Cell" + "(", "'dlscale" + "_version'"  # kept out of this file's own text
    files = {
        "tests/conftest.py": "import os\n",
        "tests/helpers/cells.py": f"def cell_dict():\n    return {call}hardware='cpu')\n",
        "tests/helpers/synthetic_metrics.py": f"START = {{{key}: '0.1.0'}}\n",
        "tests/unit/test_a.py": "import json\n\nfrom conftest import ROOT\n",
        "tests/unit/test_b.py": "def f():\n    import conftest\n",
        "benchmarks/bench.py": f"cell = {call}\n    hardware='cpu',\n)\n",
        "benchmarks/other.py": f"def copy_workflow(dest):\n    return {{{key}: 1}}\n",
        "benchmarks/third.py": "WORKFLOW_PARTS = ('Snakefile',)\n",
    }
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    paths = sorted(files)
    assert conftest_imports(tmp_path, paths) == ["tests/unit/test_a.py:3", "tests/unit/test_b.py:2"]
    assert cell_literals(tmp_path, paths) == ["benchmarks/bench.py:1"]
    copies = second_copies(tmp_path, paths)
    assert [c.split(":")[:2] for c in copies] == [
        ["benchmarks/other.py", "1"],
        ["benchmarks/other.py", "2"],
        ["benchmarks/third.py", "1"],
    ]
    assert "tests/helpers/checkout.py" in copies[0]
    assert "tests/helpers/synthetic_metrics.py" in copies[1]

"""Benchmarks that cannot rot: every script in benchmarks/ runs its smallest
case here, as a user runs it (a fresh process, PYTHONPATH=scripts), so a changed API breaks a
test, not a user (benchmarks/aggregate.py had stopped at its first cell: `Cell.__init__()
missing 1 required positional argument: 'mode'`). Each case asserts its exit status and the
line that carries its result; the numbers themselves are the benchmarks' to judge on an idle
machine (benchmarks/reports/, indexed in benchmarks/README.md: the last test checks the index).

Some scripts cannot run their smallest case in seconds here, and run `--help` instead (their
imports and argument parser): slurm_overhead.py, submission.py, packing.py and
network_faults.py need a running local Slurm cluster (packing.py one with fair share and a
second user, network_faults.py one of separate hosts), cluster_layout.py starts and stops
local clusters as root, noop_rerun.py builds a
study's whole downstream (collect, figures, the PDF) once before it measures (5.6 min for 8
cells on this 2-core VM). rank0_lag.py is a reproduction aid, not a
benchmark: its process lookup is called once.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
BENCH = ROOT / "benchmarks"
REPORTS = BENCH / "reports"
# a row of benchmarks/README.md's index: | date | [title](reports/<date>-<slug>.md) | scripts |
# headline |
INDEX_ROW = re.compile(
    r"^\| (\d{4}-\d\d-\d\d) \| \[([^\]]+)\]\(reports/((\d{4}-\d\d-\d\d)-([a-z0-9-]+)\.md)\) "
    r"\| ([^|]+) \| ([^|]+) \|$"
)

# script -> (smallest-case arguments, a line its output must hold); {tmp}: the test's folder
SMALLEST = {
    "aggregate.py": (
        ["--cells", "20", "--repeats", "1", "--workdir", "{tmp}"],
        "collect: 20 cells",
    ),
    "bad_inputs.py": (["--cases", "2"], "2 bad inputs, each in a fresh process"),
    "cell_phases.py": (
        ["--frameworks", "pytorch", "--repeats", "1", "--steps", "1", "--warmup", "1"],
        "n = 1 per framework",
    ),
    "gpu_fidelity.py": (
        ["--device", "cpu", "--repeats", "1", "--steps", "1", "--warmup", "0", "--modes", "eager"],
        "cnn_small:fp32:8",
    ),
    "loader_throughput.py": (
        ["--repeats", "1", "--steps", "2", "--batches", "2", "--warmup", "1", "--workers", "0"]
        + ["--formats", "cifar_binary"],
        "loader cifar_binary w0",
    ),
    "history_database.py": (
        ["--trials", "5", "--rows", "600", "--land-every", "0.02", "--busy-rounds", "1"]
        + ["--workdir", "{tmp}"],
        "busy driver, recorder on its own process: per landed cell median",
    ),
    "plan_solve.py": (["--repeats", "1", "--frameworks", "1", "--models", "1"], "binding:"),
    "planning.py": (
        ["--cells", "10", "--rounds", "1", "--parse-repeats", "1", "--max-nodes", "2"]
        + ["--workdir", "{tmp}"],
        "ratio project/bare-min wall",
    ),
    "probe_cost.py": (["--repeat", "1"], '"framework": "pytorch", "n": 1'),
    # --help only (see the module docstring)
    "noop_rerun.py": (["--help"], "--cells"),
    "packing.py": (["--help"], "--pack"),
    "slurm_overhead.py": (["--help"], "--cells"),
    "cluster_layout.py": (["--help"], "--rounds"),
    "network_faults.py": (["--help"], "--scenarios"),
    "submission.py": (["--help"], "--cells"),
    # a local Slurm cluster and minutes: its study and the wall times
    # (benchmarks/reports/2026-11-29-your-script-as-a-cell.md)
    "script_cells.py": (["--help"], "--rounds"),
    # a local Slurm cluster and minutes: the zoo's models as cells at 1 and 2 nodes
    "zoo_cells.py": (["--help"], "--reps"),
    # 8 ranks (a minute): its 4-rank combination is tests/unit/frameworks/test_torch_pipeline.py
    "pipeline_combinations.py": (["--help"], "--strategies"),
}
# a generous bound per script (the slowest smallest case takes ~15 s on an idle 2-core VM):
# it catches a benchmark that hangs, not one that is slow
HANG_SECONDS = 300


# benchmarks whose smallest case a test module of their own runs
OWN_TEST = {
    "gpu_suite.py": "tests/unit/benchmarks/test_gpu_suite.py (its CPU path, every row it can run)",
    "loss_breaks.py": "tests/unit/benchmarks/test_loss_breaks.py (one break on one real check)",
    "demo_time.py": "tests/unit/benchmarks/test_demo_time.py (the breakdown of a kept run, --help)",
}


def test_every_benchmark_has_its_smallest_case():
    scripts = {p.name for p in BENCH.glob("*.py") if not p.name.startswith("_")}
    assert scripts == {*SMALLEST, *OWN_TEST, "rank0_lag.py"}
    for test in OWN_TEST.values():
        assert (ROOT / test.split()[0]).is_file()


@pytest.mark.parametrize("script", sorted(SMALLEST))
def test_the_smallest_case_runs(tmp_path, script):
    args, expected = SMALLEST[script]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "scripts")}
    proc = subprocess.run(
        [sys.executable, str(BENCH / script), *(a.format(tmp=tmp_path) for a in args)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=HANG_SECONDS,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert expected in out, out[-3000:]


def test_the_rank0_lag_aid_imports_and_lists_rank_processes():
    """Never run here (it stops processes: other tests' ranks would be its targets); its
    lookup returns the process ids of ranks 0 of this machine (none of this test's own)."""
    sys.path.insert(0, str(BENCH))
    try:
        import rank0_lag
    finally:
        sys.path.remove(str(BENCH))
    pids = rank0_lag.rank0_pids()
    assert isinstance(pids, list) and os.getpid() not in pids


def test_the_index_lists_every_report_newest_first():
    """benchmarks/README.md is the index of the dated reports: every file of benchmarks/reports/
    has one row, by its date and its own title, newest first; each report starts with its title
    and, on the next line, where and when it was measured; a script a row names exists. The
    README holds no dated section of its own."""
    readme = (BENCH / "README.md").read_text()
    rows = [m.groups() for line in readme.splitlines() if (m := INDEX_ROW.match(line))]
    names = [row[2] for row in rows]
    assert len(names) == len(set(names))
    assert sorted(names) == sorted(p.name for p in REPORTS.iterdir())
    dates = [row[0] for row in rows]
    assert dates == sorted(dates, reverse=True)
    for date, title, name, named_date, slug, scripts, headline in rows:
        assert named_date == date and len(slug.split("-")) <= 6, name
        first, second = (REPORTS / name).read_text().split("\n")[:2]
        assert first == f"# {title}", name
        assert second.startswith("Measured: ") and date in second, name
        named = re.findall(r"`benchmarks/([\w.]+\.py)`", scripts)
        assert named or scripts.strip() == "-", name
        assert all((BENCH / script).is_file() for script in named), name
        assert headline.strip(), name
    assert not re.search(r"(?m)^## .*\d{4}-\d\d-\d\d", readme)
    assert len(readme.splitlines()) < 250

"""benchmarks/demo_time.py without a demo (one takes minutes): its breakdown of a kept run's
folder (the set-up's trace, snakemake's stamped output, the cells' records) and its --help."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "benchmarks"))
try:
    import demo_time
finally:
    sys.path.remove(str(ROOT / "benchmarks"))

T0 = 1_800_000_000.0
TRACE = [
    (0.00, "+", "set -euo pipefail"),
    (0.01, "+", "bash scripts/setup.sh none"),
    (0.30, "++", "/usr/bin/python3.11 -m dlscale.registry environments cpu"),
    (0.40, "+", "/usr/bin/python3 -m venv /c/.venv"),
    (2.40, "+", "PYTHONPATH=scripts /usr/bin/python3.11 -m dlscale.workflow.installer check"),
    (2.70, "+", "/c/.venv/bin/python -m pip install -q --target /h/dlscale/uv-0.1.XX uv==0.1"),
    (3.70, "+", "dlscale.workflow.installer install --venv /c/.venv --uv uv -- pip>=24 -r a"),
    (33.70, "+", "dlscale.workflow.installer install --venv /c/.venv --uv uv -- --no-deps -e ."),
    (35.70, "+", "/c/.venv/bin/python -m compileall -q -j0 scripts"),
    (36.20, "+", "exec .venv/bin/snakemake --profile profiles/local"),
]
CELL = "results/demo/runs/cpu/pytorch/cnn_small/weak/fp32/eager/n1/r1/metrics.jsonl"
LOG = [
    (36.5, "Building DAG of jobs..."),
    (38.0, "[Sun Nov 29 06:00:00 2026]"),
    (38.0, "localrule train_cpu_n1:"),
    (38.0, f"    output: {CELL}"),
    (38.0, "    jobid: 3"),
    (45.0, "Finished jobid: 3 (Rule: train_cpu_n1)"),
    (45.1, "localrule figure:"),
    (45.1, "    jobid: 7"),
    (46.1, "Finished jobid: 7 (Rule: figure)"),
    (46.1, "localrule report_pdf:"),
    (46.1, "    jobid: 9"),
    (48.1, "Finished jobid: 9 (Rule: report_pdf)"),
]


@pytest.fixture
def run_folder(tmp_path: Path) -> Path:
    (tmp_path / "trace").write_text(
        "".join(f"{d} {T0 + t:.6f} {cmd}\n" for t, d, cmd in TRACE) + "not a trace line\n"
    )
    (tmp_path / "demo.log").write_text("".join(f"{t:.3f} {text}\n" for t, text in LOG))
    phases = {"framework_import": 1.0, "setup": 1.5, "idle_probe": 0.5}
    (tmp_path / "cells.json").write_text(
        json.dumps([{"path": CELL, "wall_seconds": 6.5, "phases": phases}])
    )
    meta = {"label": "after", "source": "/c", "commit": "abc", "exit": 0, "wall_s": 48.5}
    meta.update(noop_exit=0, noop_s=1.2, load=[1.0, 2.0], started=T0)
    meta.update(caches="fresh-machine", caches_warm=False)
    (tmp_path / "run.json").write_text(json.dumps(meta))
    return tmp_path


def test_the_breakdown_of_a_kept_run(run_folder, capsys):
    b = demo_time.breakdown(run_folder)
    assert b["setup_s"] == pytest.approx(36.2) and b["workflow_s"] == pytest.approx(12.3)
    kinds = b["setup_kinds"]
    assert kinds["venv"] == pytest.approx(2.0) and kinds["packages"] == pytest.approx(30.0)
    assert kinds["installer (uv)"] == pytest.approx(1.0)
    assert kinds["editable dlscale"] == pytest.approx(2.0)
    assert kinds["checks"] == pytest.approx(0.3)  # the installer's check
    assert b["snakemake_start_s"] == pytest.approx(1.8)  # exec to the first job
    assert b["cells_window_s"] == pytest.approx(7.0) and b["downstream_s"] == pytest.approx(3.1)
    assert b["job_kinds"] == pytest.approx(
        {"throughput cells": 7.0, "figures": 1.0, "report_pdf": 2.0}
    )
    assert b["cell_beyond_wall_s"] == pytest.approx(0.5)  # 7.0 s of job, 6.5 s of cell
    assert b["cell_phases"] == {"framework_import": 1.0, "idle_probe": 0.5, "setup": 1.5}
    assert b["latex_s"] == pytest.approx(2.0) and b["tail_s"] == pytest.approx(0.4)
    demo_time.print_run(b)
    demo_time.print_summary([b, {**b, "label": "before", "wall_s": 97.0}])
    out = capsys.readouterr().out
    assert "set-up 36.2 s" in out and "no-op rerun 1.20 s" in out
    assert "caches fresh-machine (empty)" in out
    assert "total          after 48.5 s [48.5] | before 97.0 s [97.0] (2.00x)" in out


def test_help_runs_without_a_venv():
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks/demo_time.py"), "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0 and "--rounds" in proc.stdout and "--variant" in proc.stdout

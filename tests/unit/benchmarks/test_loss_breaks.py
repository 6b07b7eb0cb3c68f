"""benchmarks/loss_breaks.py, as a user runs it (a fresh process, PYTHONPATH=scripts): its
argument parser, the tests each break runs still exist, and its smallest real case: one break
(no_average: the data-parallel gradients summed, not averaged) injected into the ranks of one
test (gpt2_tiny under ddp on 2 ranks, AdamW and then plain SGD in the same processes), whose
table shows the plain-SGD check catching it and the AdamW check missing it (without the
script's run of the same test without a break: half the time). The full run (4 breaks, 10
tests, and each once without a break) takes minutes: the benchmark's own command."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "benchmarks" / "loss_breaks.py"
HANG_SECONDS = 300  # a bound that catches a hang, not a slow machine (the case: 10-20 s)


def run(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "scripts")}
    env.pop("DLSCALE_TEST_BREAK", None)  # the script sets it for the tests it runs
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=HANG_SECONDS,
    )


def test_the_help_names_the_breaks(tmp_path):
    proc = run("--help", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for word in ("--breaks", "--select", "no_average", "skip_microbatch_scale", "no_sync"):
        assert word in proc.stdout


def test_every_test_a_break_runs_exists(tmp_path):
    proc = run("--collect", cwd=tmp_path)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert "MISSING" not in out and "10 tests collected for 4 breaks" in out


def test_a_missed_average_is_caught_by_plain_sgd_and_missed_by_adamw(tmp_path):
    # without the run without a break (the same processes once more): half the time
    proc = run(
        "--breaks", "no_average", "--select", "gpt2_tiny-ddp-", "--no-baseline", cwd=tmp_path
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    # the table's columns: break, test, check, kind, optimizer, loss diff, without break,
    # tolerance, verdict
    rows = [
        re.split(r"\s{2,}", line)
        for line in out.splitlines()
        if line.startswith("(a) no_average  ")  # a row; the progress and summary lines: "(a) x:"
    ]
    by_check = {row[2]: row for row in rows}
    adamw = by_check["gpt2_tiny ddp 2x1 adamw"]
    assert adamw[3:5] == ["old", "adamw"] and adamw[8] == "missed (test failed)", adamw
    assert 1e-5 < float(adamw[5]) < float(adamw[7])  # moved (a few 1e-5), within its tolerance
    sgd0 = by_check["gpt2_tiny ddp/sgd0 2x1"]
    assert sgd0[3:5] == ["sighted", "sgd0"] and sgd0[8] == "CAUGHT (test failed)", sgd0
    assert float(sgd0[5]) > 10 * float(sgd0[7])  # the difference seen, against the tolerance
    assert adamw[6] == sgd0[6] == "-"  # no run without a break
    assert "old adamw checks caught 0, missed 1; sighted checks caught 1, missed 0" in out

"""Where a cell's time goes: one 1-node, 1-rank throughput cell per framework through the
project's launcher (`python -m dlscale.run.launch`, as a cell's job runs it), repeated, its wall
time
split into phases.

    .venv/bin/python benchmarks/cell_phases.py [--frameworks pytorch,tensorflow,keras,horovod,mxnet]
                                               [--repeats 5] [--steps 10] [--warmup 2]

A `git worktree` of another commit (with .venv and .venvs linked) measures "before": its own
dlscale runs in the launcher and the ranks (PYTHONPATH). The cells are the 1-node cells of
config/studies/frameworks.yaml (cnn_small, fp32, eager; the
real environment of each framework: .venv for PyTorch, .venvs/<env> for the others), with
--steps/--warmup. Frameworks alternate within each repetition. Phases, from the rank's own
record (rank_end `phases`, dlscale.run.train and run_timed) and the launcher's wall time measured
here around the child process:

  launcher start   the launcher process until its rank's process started (wall - the rest)
  interpreter      the rank's interpreter and dlscale's imports (process start to main)
  framework import importing the adapter's framework (torch, tensorflow, mxnet, horovod)
  setup            process group, model and optimizer
  describe node    the node's probes (local rank 0)
  warm-up, idle probe (with the meters' set-up), re-warm, timed window, breakdown, allreduce
  end              from the rank's last record to the launcher's exit (the rank's exit, the
                   launcher's merge, validation and write of metrics.jsonl)

Prints per framework the median (min-max) of each phase and of the wall time, n each, and the
overhead that is not the framework's own work: wall - (framework import + setup + warm-up +
timed window + breakdown) (target: <= 1.5 s for 1-node CPU cells of PyTorch). Setup
counts as the framework's own: it is the framework building its process group, model and
optimizer (PyTorch's first optimizer imports torch._dynamo, ~2 s here).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))

from dlscale.registry.frameworks import environment_name  # noqa: E402
from dlscale.study.matrix import load_study  # noqa: E402

RANK_PHASES = [
    "interpreter_and_imports",
    "framework_import",
    "setup",
    "describe_node",
    "warmup",
    "idle_probe",
    "rewarm",
    "timed_window",
    "breakdown",
    "allreduce_probe",
]
FRAMEWORK_OWN = ["framework_import", "setup", "warmup", "timed_window", "breakdown"]
COLUMNS = ["launcher_start", *RANK_PHASES, "end", "wall", "not_framework"]


def cells(frameworks: list[str], steps: int, warmup: int) -> dict:
    config = yaml.safe_load((REPO / "config" / "studies" / "frameworks.yaml").read_text())
    study = load_study(config, REPO)
    chosen = {}
    for cell in study.cells:
        if cell.nodes == 1 and cell.rep == 1 and cell.framework in frameworks:
            if cell.workload == "throughput" and cell.framework not in chosen:
                chosen[cell.framework] = dataclasses.replace(
                    cell, steps=steps, warmup_steps=warmup, study="cell-phases"
                )
    missing = sorted(set(frameworks) - set(chosen))
    if missing:
        raise SystemExit(f"no 1-node throughput cell of {missing} in frameworks.yaml")
    return chosen


def python_of(framework: str) -> str:
    name = environment_name(framework)
    return sys.executable if name is None else str(REPO / ".venvs" / name / "bin" / "python")


def run_once(cell, work: Path) -> dict:
    out = work / "metrics.jsonl"
    argv = [
        sys.executable,
        "-m",
        "dlscale.run.launch",
        "--cell-json",
        cell.to_json(),
        "--output",
        str(out),
        "--git-commit",
        "",
        "--python",
        python_of(cell.framework),
    ]
    started = time.time()
    # this checkout's dlscale in the launcher and its ranks (a `git worktree` measures "before")
    env = dict(os.environ, PYTHONPATH=str(REPO / "scripts"))
    proc = subprocess.run(argv, capture_output=True, text=True, cwd=REPO, env=env)
    ended = time.time()
    if proc.returncode != 0:
        raise SystemExit(f"{cell.framework}: the cell failed\n{proc.stderr[-3000:]}")
    records = [json.loads(line) for line in out.read_text().splitlines()]
    end = next(r for r in records if r["event"] == "rank_end")
    phases = end["value"]["phases"]
    rank_seconds = sum(v for v in phases.values() if v is not None)
    row = {p: phases.get(p) or 0.0 for p in RANK_PHASES}
    row["end"] = ended - end["time"]
    row["wall"] = ended - started
    row["launcher_start"] = row["wall"] - rank_seconds - row["end"]
    row["not_framework"] = row["wall"] - sum(row[p] for p in FRAMEWORK_OWN)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--frameworks", default="pytorch,tensorflow,keras,horovod,mxnet")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    args = parser.parse_args()
    frameworks = args.frameworks.split(",")
    chosen = cells(frameworks, args.steps, args.warmup)
    rows: dict[str, list[dict]] = {f: [] for f in frameworks}
    with tempfile.TemporaryDirectory(prefix="dlscale-phases-") as tmp:
        for i in range(args.repeats):
            for fw in frameworks if i % 2 == 0 else reversed(frameworks):
                work = Path(tmp) / f"{fw}-{i}"
                work.mkdir()
                rows[fw].append(run_once(chosen[fw], work))
    print(
        f"1-node, 1-rank cells (cnn_small fp32 eager, {args.warmup} warm-up + {args.steps} "
        f"timed steps), {args.repeats} repetitions per framework, frameworks alternating; "
        "seconds, median (min-max)"
    )
    print(f"{'phase':24s}" + "".join(f"{fw:>22s}" for fw in frameworks))
    for column in COLUMNS:
        line = f"{column:24s}"
        for fw in frameworks:
            values = [r[column] for r in rows[fw]]
            line += f"{statistics.median(values):8.2f} ({min(values):.2f}-{max(values):.2f})"
        print(line)
    print(f"n = {args.repeats} per framework")


if __name__ == "__main__":
    main()

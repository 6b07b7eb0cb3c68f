"""Submission at scale: a study of many short cells through the Slurm profile on the project's
local cluster, one Slurm job per cell against job arrays, side by side in one run.

    bash scripts/slurm/cluster-up.sh --nodes 2
    .venv/bin/python benchmarks/submission.py [--cells 200] [--rounds 1]

Variants (the same workflow copy and study, fresh results each run):
  per-cell  one sbatch per cell, `jobs: 100`, the default ILP scheduler: the earlier
            profiles/slurm (the greedy scheduler removed)
  arrays    profiles/slurm with the opt-in job arrays (ARRAYS): the ready cells of each train
            rule (resource class) as arrays of 40, greedy scheduler

The study: pytorch cnn_small on the `cpu` hardware, 1 node, weak and strong, `--cells / 2`
repetitions each, 1 warm-up and 2 timed steps: short cells, whose cost is mostly the job
around them. On the local cluster (2 nodes of 1 CPU on this host) two cells run at a time.

Prints per run: the wall time of `snakemake --profile ...` to the finished report, the time to
the last cell's metrics file, sbatch calls, the cells' own summed wall time (their launchers'
wall_seconds) and the overhead per cell, then medians and the arrays / per-cell ratios.
"""

from __future__ import annotations

import argparse
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import REPO, Run, bench_checkout, child_env, default_venvs, run_child  # noqa: E402

SNAKEMAKE = REPO / ".venv" / "bin" / "snakemake"
CELLS_CSV = "results/submission/tables/cells.csv"  # the study below


def study_config(cells: int) -> dict:
    config = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    config.update(
        study="submission",
        repetitions=cells // 2,
        warmup_steps=1,
        steps=2,
        per_rank_batch=8,
        global_batch=None,
        exclude=[],
        workloads=["throughput"],
    )
    config["axes"] = {
        "framework": ["pytorch"],
        "model": ["cnn_small"],
        "hardware": ["cpu"],
        "nodes": [1],
        "policy": ["weak", "strong"],
        "precision": ["fp32"],
    }
    return config


# job arrays, opt-in on top of profiles/slurm (see its comments)
ARRAYS = ["--dlscale-array-jobs", "all", "--dlscale-array-limit", "40", "--jobs", "20000"]


def per_cell_profile(work: Path) -> str:
    """profiles/slurm without the greedy scheduler and with jobs: 100: the earlier profile."""
    profile = yaml.safe_load((work / "profiles" / "slurm" / "config.yaml").read_text())
    for key in ("dlscale-array-jobs", "dlscale-array-limit", "scheduler", "scheduler-subsample"):
        profile.pop(key, None)
    profile["jobs"] = 100
    dest = work / "profiles" / "slurm-per-cell"
    dest.mkdir(exist_ok=True)
    (dest / "config.yaml").write_text(yaml.safe_dump(profile, sort_keys=False))
    return "profiles/slurm-per-cell"


def cluster_ready() -> None:
    try:
        out = subprocess.run(
            ["sinfo", "-h", "-o", "%D %t"], capture_output=True, text=True, timeout=20
        )
    except (OSError, subprocess.SubprocessError) as exc:
        raise SystemExit(
            f"no Slurm here ({exc}); start the local cluster first: "
            "bash scripts/slurm/cluster-up.sh --nodes 2"
        ) from None
    if out.returncode != 0 or "idle" not in out.stdout:
        raise SystemExit(
            "the local Slurm cluster is not up and idle (sinfo: "
            f"{out.stdout.strip() or out.stderr.strip()}); start it with: "
            "bash scripts/slurm/cluster-up.sh --nodes 2"
        )
    queued = subprocess.run(["squeue", "-h"], capture_output=True, text=True).stdout.strip()
    if queued:
        raise SystemExit(f"the cluster is busy; these jobs would distort the timing:\n{queued}")


def measure(work: Path, args: list[str], cells: int, log: Path) -> dict:
    for path in ("results", ".snakemake"):
        shutil.rmtree(work / path, ignore_errors=True)
    start = time.time()
    run: Run = run_child([str(SNAKEMAKE), *args], work, child_env(work, SNAKEMAKE), log)
    text = log.read_text(errors="replace")
    if run.rc != 0:
        raise SystemExit(f"{args}: snakemake failed (exit {run.rc}); log {log}:\n{text[-3000:]}")
    table = pd.read_csv(work / CELLS_CSV)
    if len(table) != cells:
        raise SystemExit(f"{args}: {len(table)} cells in {CELLS_CSV}, expected {cells}")
    metrics = list((work / "results" / "runs").rglob("metrics.jsonl"))
    single = len(re.findall(r"has been submitted with SLURM jobid", text))
    arrays = re.findall(
        r"Submitted array job with .*? The individual task IDs are (\d+)-(\d+)", text
    )
    tasks = sum(int(b) - int(a) + 1 for a, b in arrays)
    cell_seconds = float(table["wall_seconds"].sum())
    return {
        "wall_s": run.wall_s,
        "cells_done_s": max(p.stat().st_mtime for p in metrics) - start,
        "sbatch": single + len(arrays),
        "array_tasks": tasks,
        "single_jobs": single,
        "cell_seconds": cell_seconds,
        # two cells run at once on the 2-node cluster: the ideal wall is half their sum
        "overhead_per_cell_s": (run.wall_s - cell_seconds / 2) / cells,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cells", type=int, default=200, help="an even number, at most 200")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--workdir", type=Path, default=None)
    p.add_argument(
        "--variants",
        default="per-cell,arrays",
        help="which to run (comma-separated; the ratio needs both)",
    )
    a = p.parse_args()
    if a.cells % 2 or not 2 <= a.cells <= 200:
        raise SystemExit(
            "--cells: an even number from 2 to 200 (2 policies x at most 100 "
            "repetitions, config.schema.json)"
        )
    cluster_ready()
    root = a.workdir or Path(tempfile.mkdtemp(prefix="dlscale-submission-", dir="/var/tmp"))
    shutil.rmtree(root / "workflow", ignore_errors=True)
    work = bench_checkout(REPO, root / "workflow", default_venvs(REPO))
    (work / "config" / "config.yaml").write_text(yaml.safe_dump(study_config(a.cells)))
    variants = {
        name: args
        for name, args in (
            ("per-cell", ["--profile", per_cell_profile(work)]),
            ("arrays", ["--profile", "profiles/slurm", *ARRAYS]),
        )
        if name in a.variants.split(",")
    }
    print(
        f"{a.cells} short cells (pytorch cnn_small, cpu, 1 node, 2 timed steps) on the local "
        f"cluster; work in {work}",
        flush=True,
    )
    results: dict[str, list[dict]] = {name: [] for name in variants}
    for k in range(a.rounds):
        order = list(variants) if k % 2 == 0 else list(reversed(variants))
        for name in order:
            r = measure(work, variants[name], a.cells, root / f"{name}-{k + 1}.log")
            results[name].append(r)
            print(
                f"  round {k + 1} {name:8s} wall {r['wall_s']:7.1f} s, cells done after "
                f"{r['cells_done_s']:7.1f} s, {r['sbatch']} sbatch calls ({r['single_jobs']} "
                f"single jobs, {r['array_tasks']} array tasks), cells' own wall "
                f"{r['cell_seconds']:.1f} s, overhead {r['overhead_per_cell_s']:.2f} s/cell",
                flush=True,
            )
    med = {
        name: {key: statistics.median(r[key] for r in runs) for key in runs[0]}
        for name, runs in results.items()
    }
    for name, m in med.items():
        print(
            f"{name:8s} median over {a.rounds} round(s): wall {m['wall_s']:.1f} s, cells done "
            f"{m['cells_done_s']:.1f} s, {m['sbatch']:.0f} sbatch calls, overhead "
            f"{m['overhead_per_cell_s']:.2f} s per cell"
        )
    if len(med) < 2:
        return
    before, after = med["per-cell"], med["arrays"]
    print(
        f"ratio arrays / per-cell: wall {after['wall_s'] / before['wall_s']:.2f}, cells done "
        f"{after['cells_done_s'] / before['cells_done_s']:.2f}, sbatch calls "
        f"{after['sbatch'] / before['sbatch']:.3f}"
    )


if __name__ == "__main__":
    main()

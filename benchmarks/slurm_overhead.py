"""Per-cell overhead of the Slurm route: N trivial cells through dlscale's profile against the
same N cells through a plain `sbatch` + `squeue` polling loop written here, interleaved, on the
project's local cluster.

    bash scripts/slurm/cluster-up.sh --nodes 2
    .venv/bin/python benchmarks/slurm_overhead.py [--cells 20] [--rounds 3]

The cells: pytorch cnn_small on `cpu`, 1 node, 1 rank, weak and strong, N / 2 repetitions each,
1 warm-up and 1 timed step (well under a second of training; a cell's launcher, rank start-up
included, takes a few seconds). Both routes run exactly the same cells with the same command
(`python -m dlscale.run.launch --cell-json ... --output ...`, launcher srun) and the same Slurm
request (1 node, 1 task, 1 CPU, the cell's memory and time limit):

  dlscale   `snakemake --profile profiles/slurm` to the finished report (as a user runs it);
            `--train-only` variant: the cells' metrics files only (no tables, figures, report)
  poll10    (--old-polling) dlscale with the earlier status polling intervals (10 s, 10 s)
  sbatch    one `sbatch --wrap` per cell, all submitted at once, then `squeue` every second
            until none is left (what a user would write by hand)

Per run: wall time, and the wall to the last cell (the command's start to the last metrics
file written: the target's measure); the cells' own work (their launchers' wall_seconds, from
the metrics); the overhead per cell, (wall - work / 2) / N, since the 2-node cluster runs two
1-node cells at once; the tail, from the last metrics file written to the command's exit; the
in-job extra, the median of each cell's Slurm job length minus its launcher's wall_seconds
(what runs around the ranks inside the allocation); when the first and the last job were
submitted and the first started, after the command's start (slurmctld's whole seconds). Printed:
each run, then medians over the rounds and the dlscale / sbatch ratios.
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from dlscale.workflow.jobstep import IN_JOB_ENV

sys.path.insert(0, str(Path(__file__).resolve().parent))
from submission import cluster_ready, study_config  # noqa: E402

from _common import (  # noqa: E402
    REPO,
    alternate,
    bench_checkout,
    child_env,
    default_venvs,
    run_child,
)

SNAKEMAKE = REPO / ".venv" / "bin" / "snakemake"
SLOTS = 2  # the local cluster runs two 1-node cells at once


def cell_files(work: Path) -> list[Path]:
    """The cells' metrics files that exist (each links to its one measurement)."""
    return [work / p for p in planned_outputs(work) if (work / p).exists()]


def cells_work(paths: list[Path]) -> float:
    """The cells' own work: each launcher's wall_seconds (its last record, the cell summary)."""
    total = 0.0
    for path in paths:
        last = json.loads(path.read_text().splitlines()[-1])
        total += last["value"]["wall_seconds"]
    return total


def job_times(job_id: str) -> dict[str, float] | None:
    """SubmitTime, StartTime and EndTime of a finished job as slurmctld reports them (whole
    seconds; the local cluster keeps finished jobs for MinJobAge = 600 s): one query per job."""
    out = subprocess.run(
        ["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True
    ).stdout
    fields = dict(t.partition("=")[::2] for t in out.split() if "=" in t)
    try:
        return {
            k: time.mktime(time.strptime(fields[k], "%Y-%m-%dT%H:%M:%S"))
            for k in ("SubmitTime", "StartTime", "EndTime")
        }
    except (KeyError, ValueError):
        return None


def timeline(start: float, times: list[dict[str, float]]) -> dict:
    """When, after the command's start, the first and the last job were submitted and the first
    started (slurmctld's whole seconds)."""
    if not times:
        return {"first_submit_s": None, "last_submit_s": None, "first_start_s": None}
    return {
        "first_submit_s": min(t["SubmitTime"] for t in times) - start,
        "last_submit_s": max(t["SubmitTime"] for t in times) - start,
        "first_start_s": min(t["StartTime"] for t in times) - start,
    }


def in_job_extra(paths: list[Path], times: list[dict[str, float] | None]) -> float | None:
    """Median over cells of (job length - the launcher's wall_seconds): what the job runs around
    the cell's ranks (dlscale: the plugin's batch snakemake, its job step's snakemake and the
    launcher's start; sbatch: the launcher's start)."""
    extra = []
    for path, t in zip(paths, times, strict=True):
        if t is None:
            continue
        last = json.loads(path.read_text().splitlines()[-1])
        extra.append(t["EndTime"] - t["StartTime"] - last["value"]["wall_seconds"])
    return statistics.median(extra) if extra else None


def median_or_none(values) -> float | None:
    """The median of the values that were measured (None where a job had left slurmctld)."""
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def summarize(
    wall: float, start: float, end: float, paths: list[Path], cells: int, jobs: list[str]
) -> dict:
    if len(paths) != cells:
        raise SystemExit(f"{len(paths)} metrics files, expected {cells}")
    work = cells_work(paths)
    last = max(p.stat().st_mtime for p in paths)
    times = [job_times(job) for job in jobs]
    return {
        "wall_s": wall,
        "to_last_cell_s": last - start,
        "work_s": work,
        "overhead_per_cell_s": (wall - work / SLOTS) / cells,
        "tail_s": end - last,
        "in_job_extra_s": in_job_extra(paths, times),
        **timeline(start, [t for t in times if t]),
    }


def polling_profile(work: Path, init_s: int, between_s: int) -> str:
    """profiles/slurm with other status polling intervals (the profile's earlier ones: 10 s
    and Snakemake's default 10 s)."""
    profile = yaml.safe_load((work / "profiles" / "slurm" / "config.yaml").read_text())
    profile["dlscale-init-seconds-before-status-checks"] = init_s
    profile["seconds-between-status-checks"] = between_s
    dest = work / "profiles" / f"slurm-poll{init_s}"
    dest.mkdir(exist_ok=True)
    (dest / "config.yaml").write_text(yaml.safe_dump(profile, sort_keys=False))
    return str(dest.relative_to(work))


def run_dlscale(
    work: Path, log: Path, cells: int, train_only: bool, profile: str, in_job: bool = False
) -> dict:
    for path in ("results", ".snakemake"):
        shutil.rmtree(work / path, ignore_errors=True)
    args = [str(SNAKEMAKE), "--profile", profile]
    if train_only:
        args += [str(p) for p in planned_outputs(work)]
    env = child_env(work, SNAKEMAKE)
    if in_job:
        env[IN_JOB_ENV] = "1"
    start = time.time()
    run = run_child(args, work, env, log)
    end = time.time()
    if run.rc != 0:
        raise SystemExit(f"dlscale run failed (exit {run.rc}); log {log}:\n{run.tail()}")
    paths = cell_files(work)
    jobs = [json.loads((p.parent / "slurm_job.json").read_text())["slurm_job_id"] for p in paths]
    return summarize(run.wall_s, start, end, paths, cells, jobs)


def planned_cells(work: Path):
    """The study's cells as the workflow plans them (launcher srun, as the profile sets it)."""
    sys.path.insert(0, str(work / "scripts"))
    from dlscale.study.matrix import load_workflow_study

    return load_workflow_study({"launcher": "srun"}, work).cells


def planned_outputs(work: Path) -> list[Path]:
    return [Path(c.path) for c in planned_cells(work)]


def run_sbatch_loop(work: Path, log: Path, cells: int) -> dict:
    """The baseline: every cell's launcher submitted with its own sbatch, squeue every second."""
    shutil.rmtree(work / "results", ignore_errors=True)
    planned = planned_cells(work)
    hw = yaml.safe_load((work / "config" / "hardware.yaml").read_text())["cpu"]
    python = str(REPO / ".venv" / "bin" / "python")
    env = child_env(work, SNAKEMAKE)
    start = time.time()
    t0 = time.perf_counter()
    jobs = []
    with log.open("w") as out:
        for cell in planned:
            output = work / cell.path
            output.parent.mkdir(parents=True, exist_ok=True)
            launch = shlex.join(
                [
                    python,
                    "-m",
                    "dlscale.run.launch",
                    "--cell-json",
                    cell.to_json(),
                    "--output",
                    str(output),
                ]
            )
            proc = subprocess.run(
                [
                    "sbatch",
                    "--parsable",
                    "--nodes=1",
                    "--ntasks=1",
                    "--cpus-per-task=1",
                    f"--mem={hw['mem_mb_per_rank']}",
                    f"--time={hw['runtime_min']}",
                    f"--output={output.parent / 'sbatch.log'}",
                    f"--wrap={launch}",
                ],
                cwd=work,
                env=env,
                capture_output=True,
                text=True,
                check=True,
            )
            jobs.append(proc.stdout.strip().split(";")[0])
            out.write(f"submitted {jobs[-1]}\n")
        while True:
            queued = subprocess.run(
                ["squeue", "-h", "-j", ",".join(jobs), "-o", "%i"],
                capture_output=True,
                text=True,
            ).stdout.split()
            if not queued:
                break
            time.sleep(1.0)
    wall = time.perf_counter() - t0
    return summarize(wall, start, time.time(), cell_files(work), cells, jobs)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cells", type=int, default=20, help="an even number, at most 200")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--train-only", action="store_true", help="dlscale to the metrics files only")
    p.add_argument(
        "--old-polling",
        action="store_true",
        help="also run dlscale with the earlier polling intervals (10 s, 10 s)",
    )
    p.add_argument(
        "--snakemake-in-job",
        action="store_true",
        help="also run dlscale with the plugin's own job command (Snakemake started twice in "
        f"every job, {IN_JOB_ENV}=1), as before dlscale.workflow.jobstep",
    )
    p.add_argument("--workdir", type=Path, default=None)
    a = p.parse_args()
    if a.cells % 2 or not 2 <= a.cells <= 200:
        raise SystemExit("--cells: an even number from 2 to 200")
    cluster_ready()
    root = a.workdir or Path(tempfile.mkdtemp(prefix="dlscale-overhead-", dir="/var/tmp"))
    shutil.rmtree(root / "workflow", ignore_errors=True)
    work = bench_checkout(REPO, root / "workflow", default_venvs(REPO))
    config = study_config(a.cells)
    config.update(warmup_steps=1, steps=1)
    (work / "config" / "config.yaml").write_text(yaml.safe_dump(config))
    print(
        f"{a.cells} trivial cells (pytorch cnn_small, cpu, 1 node, 1 timed step) on the local "
        f"cluster, {a.rounds} round(s), dlscale to the "
        f"{'metrics' if a.train_only else 'report'}; work in {work}",
        flush=True,
    )
    variants = {
        "dlscale": lambda k: run_dlscale(
            work, root / f"dlscale-{k + 1}.log", a.cells, a.train_only, "profiles/slurm"
        ),
        "sbatch": lambda k: run_sbatch_loop(work, root / f"sbatch-{k + 1}.log", a.cells),
    }
    if a.snakemake_in_job:
        variants["in-job"] = lambda k: run_dlscale(
            work, root / f"in-job-{k + 1}.log", a.cells, a.train_only, "profiles/slurm", True
        )
    if a.old_polling:
        old = polling_profile(work, 10, 10)
        variants["poll10"] = lambda k: run_dlscale(
            work, root / f"poll10-{k + 1}.log", a.cells, a.train_only, old
        )

    def fmt(seconds: float | None) -> str:
        return "?" if seconds is None else f"{seconds:.0f}"

    def show(k: int, name: str, r: dict) -> None:
        print(
            f"  round {k + 1} {name:8s} wall {r['wall_s']:6.1f} s, cells' work "
            f"{r['work_s']:6.1f} s, overhead {r['overhead_per_cell_s']:5.2f} s/cell, "
            f"tail {r['tail_s']:5.1f} s, in-job extra {r['in_job_extra_s']:.1f} s; to the last "
            f"cell {r['to_last_cell_s']:6.1f} s; submitted {fmt(r['first_submit_s'])}.."
            f"{fmt(r['last_submit_s'])} s, first start {fmt(r['first_start_s'])} s",
            flush=True,
        )

    results = alternate(a.rounds, variants, show)
    med = {
        name: {key: median_or_none(r[key] for r in runs) for key in runs[0]}
        for name, runs in results.items()
    }
    for name, m in med.items():
        spread = [r["overhead_per_cell_s"] for r in results[name]]
        print(
            f"{name:8s} median of {a.rounds}: wall {m['wall_s']:.1f} s, overhead "
            f"{m['overhead_per_cell_s']:.2f} s/cell (range {min(spread):.2f}-{max(spread):.2f}), "
            f"tail {m['tail_s']:.1f} s, in-job extra {m['in_job_extra_s']:.1f} s per cell; to "
            f"the last cell {m['to_last_cell_s']:.1f} s; submitted {fmt(m['first_submit_s'])}.."
            f"{fmt(m['last_submit_s'])} s, first start {fmt(m['first_start_s'])} s"
        )
    s = med["sbatch"]
    for name in [v for v in med if v != "sbatch"]:
        d = med[name]
        print(
            f"ratio {name} / sbatch: overhead per cell "
            f"{d['overhead_per_cell_s'] / s['overhead_per_cell_s']:.2f}, wall "
            f"{d['wall_s'] / s['wall_s']:.2f}, wall to the last cell "
            f"{d['to_last_cell_s'] / s['to_last_cell_s']:.2f} (target: <= 1.1)"
        )


if __name__ == "__main__":
    main()

"""The results database's test kit: study folders of valid metrics files written in seconds
(the real format: dlscale.store.metrics.assemble, kept as dlscale.store.measurements keeps
them), synthetic measurement rows for history queries, and the run's own PostgreSQL server
(scripts/postgres/up.sh and down.sh, named after the test run: tests/helpers/run_names.py)."""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
from datetime import datetime, timedelta
from pathlib import Path

import numpy as np

from dlscale.store import measurements as kept
from dlscale.store import metrics
from dlscale.store.result_rows import identity_hashes, stack_hash
from dlscale.study.cell import Cell

from helpers import run_names
from helpers.cells import small_cell
from helpers.synthetic_metrics import rank_end, rank_start, step_records

ROOT = Path(__file__).resolve().parents[2]
UP = ROOT / "scripts" / "postgres" / "up.sh"
DOWN = ROOT / "scripts" / "postgres" / "down.sh"
PG_PART = "postgres"  # the server's folder: run_names.run_path(PG_PART)
PG_PORT_BASE = 15430  # + the run's slot: names the socket (no TCP port is opened)


def cell_of(study: str, nodes: int = 1, rep: int = 1, model: str = "cnn_small", **changes):
    """A CPU cell of `study` (helpers.cells.small_cell: 8 samples a rank, 3 timed steps)."""
    fields = dict(
        model=model,
        nodes=nodes,
        rep=rep,
        per_rank_batch=8,
        global_batch=8 * nodes,
        steps=3,
        environment="pytorch:e1",
        study=study,
    )
    return small_cell(**{**fields, **changes})


def cell_records(cell: Cell, rank_throughput: float = 100.0, torch: str = "2.13.0") -> list:
    """A valid metrics file's records of `cell`, each rank at `rank_throughput` samples/s."""
    step = cell.per_rank_batch / rank_throughput
    ranks = {}
    for rank in range(cell.world_size):
        start = rank_start(  # helpers.synthetic_metrics' rank, on node<rank>
            rank,
            node=f"node{rank}",
            pid=1000 + rank,
            device_model="synthetic CPU",
            loadavg_1m=0.1,
            per_rank_batch=cell.per_rank_batch,
            param_count=1,
            libraries={"torch": torch, "numpy": "2.4.6"},
            python="3.11",
            cpu_model="synthetic",
        )
        secs = [step] * cell.steps
        ranks[rank] = [
            metrics.make_record("rank_start", rank, start),
            *step_records(rank, secs, 8),
            metrics.make_record(
                "rank_end", rank, rank_end(secs, cell.per_rank_batch, reason="synthetic")
            ),
        ]
    return metrics.assemble(
        cell=cell,
        git_commit="c0ffee",
        slurm_job_id=None,
        rank_records=ranks,
        wall_seconds=1.0,
        started=time.time(),
    )


def measure(results: Path, cell: Cell, **kwargs) -> Path:
    """One measurement of `cell` under `results` (a checkout's results/ parent: the cell's path
    is relative to it), kept in its own folder as the launcher keeps it; returns the folder."""
    output = results / cell.path
    output.parent.mkdir(parents=True, exist_ok=True)
    folder = kept.keep_measurement(output, cell_records(cell, **kwargs), metrics.write_atomic)
    time.sleep(0.002)  # measurement folders are named by the second and the process: apart
    return folder


def write_study(work: Path, study: str, nodes=(1, 2), reps: int = 2, **kwargs) -> Path:
    """A study folder (work/results/<study>) of nodes x reps measured cells; returns it."""
    for n in nodes:
        for rep in range(1, reps + 1):
            measure(work, cell_of(study, n, rep), **kwargs)
    return work / "results" / study


def unique_measurement(work: Path, cell: Cell, tag: str, **kwargs) -> Path:
    """A measurement with a given folder name (several of one cell within a second)."""
    output = work / cell.path
    output.parent.mkdir(parents=True, exist_ok=True)
    folder = output.parent / kept.MEASUREMENTS_DIR / tag
    folder.mkdir(parents=True)
    metrics.write_atomic(folder / kept.METRICS_FILE, cell_records(cell, **kwargs))
    kept.link_current(folder, output)
    return folder


# ---- synthetic rows (history queries, without metrics files) ----------------------------------
def synthetic_rows(
    series: list[dict],
    runs: int,
    reps: int,
    *,
    slowdown_at: int | None = None,
    slowdown: float = 0.10,
    noise: float = 0.02,
    seed: int = 0,
    start: datetime = datetime(2026, 1, 5),
) -> list[dict]:
    """`measurements` rows: per series (a dict of axis values) `runs` weekly runs (studies
    week<k>) of `reps` repetitions with `noise` run-to-run noise (coefficient of variation);
    from run `slowdown_at` on, `slowdown` slower and torch 2.14.0 instead of 2.13.0."""
    rng = np.random.default_rng(seed)
    rows = []
    for s in series:
        cell = {
            "hardware": "h100",
            "framework": "pytorch",
            "model": "llama3_8b",
            "policy": "weak",
            "precision": "bf16",
            "mode": "eager",
            "parallelism": "ddp",
            "nodes": 8,
            "ranks_per_node": 8,
            "per_rank_batch": 4,
            "steps": 50,
            "environment": "pytorch:e1",
            **s,
        }
        base = float(s.get("base", 1000.0))
        for run in range(runs):
            slow = slowdown_at is not None and run >= slowdown_at
            software = {
                "torch": "2.14.0" if slow else "2.13.0",
                "python": "3.11.7",
                "dlscale commit": f"commit{run:04d}",
                "nodes": f"node{run % 3}",
            }
            env = "pytorch:e2" if slow else "pytorch:e1"
            series_hash, configuration = identity_hashes({**cell, "environment": env})
            for rep in range(1, reps + 1):
                value = base * (1 - slowdown if slow else 1) * rng.normal(1, noise)
                rows.append(
                    {
                        "study": f"week{run:03d}",
                        "cell": f"runs/{cell['hardware']}/{cell['model']}/n{cell['nodes']}/r{rep}",
                        "measurement": f"m{rep}",
                        "metrics_sha256": f"{run}-{rep}-{series_hash}",
                        "workload": "throughput",
                        **{
                            k: str(cell[k])
                            for k in (
                                "hardware",
                                "framework",
                                "model",
                                "policy",
                                "precision",
                                "mode",
                                "parallelism",
                            )
                        },  # fmt: skip
                        "nodes": int(cell["nodes"]),
                        "ranks_per_node": int(cell["ranks_per_node"]),
                        "rep": rep,
                        "world_size": int(cell["nodes"]) * int(cell["ranks_per_node"]),
                        "per_rank_batch": 4,
                        "global_batch": 4 * int(cell["nodes"]) * int(cell["ranks_per_node"]),
                        "series": series_hash,
                        "configuration": configuration,
                        "cell_hash": series_hash,
                        "environment": env,
                        "launcher": "srun",
                        "measured_at": start + timedelta(days=7 * run, minutes=rep),
                        "throughput_samples_per_s": value,
                        "competing": False,
                        "git_commit": software["dlscale commit"],
                        "software": json.dumps(software, sort_keys=True),
                        "stack": stack_hash(software),
                        "cell_json": json.dumps(cell, sort_keys=True),
                        "summary_json": "{}",
                        "recorded_at": start + timedelta(days=7 * run, minutes=30),
                    }
                )
    return rows


# ---- the run's PostgreSQL server ---------------------------------------------------------------
def postgres_dir() -> Path:
    return run_names.run_path(PG_PART)


@contextlib.contextmanager
def postgres_server():
    """The test run's PostgreSQL server (Debian's, by the project's scripts/postgres/up.sh):
    socket only, its data and socket folders and its port named after the run; stopped and its
    folder removed at the end. Yields its URL."""
    folder = postgres_dir()
    port = PG_PORT_BASE + run_names.slot()
    up = subprocess.run(
        ["bash", str(UP), "--dir", str(folder), "--port", str(port)],
        capture_output=True,
        text=True,
        timeout=180,
    )
    if up.returncode != 0:
        subprocess.run(["bash", str(DOWN), "--dir", str(folder), "--purge"], timeout=120)
        raise RuntimeError(f"scripts/postgres/up.sh failed:\n{up.stdout}\n{up.stderr}")
    try:
        yield up.stdout.strip().splitlines()[-1]
    finally:
        subprocess.run(
            ["bash", str(DOWN), "--dir", str(folder), "--purge"],
            capture_output=True,
            timeout=120,
        )

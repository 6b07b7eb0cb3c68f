"""Cells and specs for the tests and the benchmarks: the one place a Cell or a rank's TrainSpec
is written out field by field (tests/unit/test_shared_helpers.py keeps it so). A test or a
benchmark names only what it changes: small_cell(device="cuda", ...), cell_dict(...) for the
dict a study's Cell serialises to (Cell.as_dict), rank_spec(...) for one rank's spec.

dlscale is imported from the package the caller runs (a benchmark may measure another
checkout's), its launcher and adapters only where a function needs them."""

from __future__ import annotations

import json
from pathlib import Path

from dlscale.study.cell import Cell

# A 2-node, 1-rank-per-node CPU cell of cnn_small (weak, fp32, batch 4, 1 + 2 steps)
SMALL_CELL = {
    "hardware": "cpu",
    "framework": "pytorch",
    "model": "cnn_small",
    "policy": "weak",
    "precision": "fp32",
    "mode": "eager",
    "nodes": 2,
    "rep": 1,
    "device": "cpu",
    "ranks_per_node": 1,
    "per_rank_batch": 4,
    "global_batch": 8,
    "cpus_per_rank": 1,
    "warmup_steps": 1,
    "steps": 2,
    "learning_rate": 0.01,
    "momentum": 0.9,
    "launcher": "local",
    "hardware_hash": "h",
    "environment": "pytorch:e",
    "study": "t",
}


def small_cell(**changes) -> Cell:
    """SMALL_CELL with `changes` (any Cell field)."""
    return Cell(**{**SMALL_CELL, **changes})


def cell_dict(**changes) -> dict:
    """small_cell(**changes) as the dict it serialises to."""
    return small_cell(**changes).as_dict()


def rank_spec(**changes):
    """A rank's TrainSpec (dlscale.frameworks.base) of one CPU rank of cnn_small (fp32, batch 4,
    1 + 2 steps, SGD 0.01 with momentum 0.9, one thread), with `changes`."""
    from dlscale.frameworks.train_spec import TrainSpec

    fields = {
        "framework": "pytorch",
        "model": "cnn_small",
        "per_rank_batch": 4,
        "warmup_steps": 1,
        "steps": 2,
        "precision": "fp32",
        "device": "cpu",
        "threads": 1,
        "learning_rate": 0.01,
        "momentum": 0.9,
    }
    return TrainSpec(**{**fields, **changes})


def launch_cell(tmp_path: Path, cell: dict, python=None) -> tuple[int, Path]:
    """Run a cell through the launcher as a study does (its metrics under tmp_path/cell);
    `python`: the interpreter of the cell's framework environment. Returns (exit code, path)."""
    from dlscale.run import launch

    out = tmp_path / "cell" / "metrics.jsonl"
    argv = ["--cell-json", json.dumps(cell), "--output", str(out), "--git-commit", ""]
    if python is not None:
        argv += ["--python", str(python)]
    return launch.main(argv), out


def wait_ranks(procs, timeout: float) -> list[int]:
    """The exit codes of ranks started in their own sessions, waited for as the local launcher
    waits (launch.wait_all): all are stopped once one has failed (a peer that died at start-up
    leaves a TensorFlow survivor waiting for it with no deadline of its own), and all at
    `timeout` s. A stopped rank's code is negative (its signal)."""
    from dlscale.run import launch

    launch.wait_all(list(enumerate(procs)), timeout=timeout)
    return [p.returncode for p in procs]


def plugin_sbatch(res: dict, threads: int) -> str:
    """The sbatch command line the Slurm executor plugin builds for a job with `res`, from the
    plugin's own functions (submit string, GRES string, slurm_extra check)."""
    from types import SimpleNamespace

    from snakemake_executor_plugin_slurm.submit_string import get_submit_command
    from snakemake_executor_plugin_slurm.utils import set_gres_string
    from snakemake_executor_plugin_slurm.validation import validate_slurm_extra

    class Resources(dict):
        __getattr__ = dict.__getitem__

    resources = Resources({k: (v(None, 1) if callable(v) else v) for k, v in res.items()})
    job = SimpleNamespace(resources=resources, threads=threads)
    validate_slurm_extra(job)  # raises WorkflowError for options the plugin owns
    params = dict(
        run_uuid="u", slurm_logfile="log", comment_str="c", account="", partition="", workdir=""
    )
    return get_submit_command(job, params) + set_gres_string(job)


def measured_before(root: Path, cell: Cell) -> Path:
    """The metrics file of `cell` as a measurement made before a later field existed leaves it:
    its run_start line, the cell as it was (dlscale.store.measurements.changed_cells reads it)."""
    path = Path(root) / cell.path
    path.parent.mkdir(parents=True, exist_ok=True)
    start = {
        "event": "run_start",
        "value": {"cell": cell.as_dict(), "provenance": {"launcher": "local"}},
    }
    path.write_text(json.dumps(start) + "\n")
    return path

"""Corrupt, truncated, empty, wrong-version, misplaced and duplicated metrics files are
quarantined and listed, never a crash; absent cells are missing or failed (status.csv)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dlscale.analysis.collect import collect
from dlscale.rank.provenance import REDACTED, environment

from helpers.synthetic_metrics import CELL, assembled

GOOD = "results/t/runs/cpu/pytorch/cnn_small/weak/fp32/eager/n2/r1/metrics.jsonl"


def cell_path(**changes) -> str:
    cell = {**CELL, **changes}
    return (
        f"results/{cell['study']}/runs/{cell['hardware']}/{cell['framework']}/{cell['model']}/"
        f"{cell['policy']}/{cell['precision']}/{cell['mode']}/n{cell['nodes']}/r{cell['rep']}"
        "/metrics.jsonl"
    )


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


def write(path: str, text: str) -> str:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(text)
    return path


def lines(records) -> str:
    return "".join(json.dumps(r) + "\n" for r in records)


def test_bad_files_are_quarantined_and_listed(workdir):
    good = lines(assembled())
    wrong_version = [{**r, "version": 9} for r in assembled()]
    paths = [
        write(GOOD, good),
        write(cell_path(rep=2), good),  # misplaced: holds rep 1
        write(cell_path(rep=3), good[: len(good) // 2]),  # truncated
        write(cell_path(rep=4), ""),  # empty
        write(cell_path(rep=5), "{corrupt\n"),  # not JSON
        write(cell_path(rep=6), lines(wrong_version)),  # another format version
        cell_path(rep=7),  # never ran
    ]
    ranks, cells, scaling, quarantine, status = collect(paths)
    assert len(cells) == 1 and len(ranks) == 2
    reasons = dict(zip(quarantine["metrics_path"], quarantine["reason"]))
    assert "not the cell its path names" in reasons[paths[1]]
    assert (
        "must start with run_start and end with summary" in reasons[paths[2]]
        or "not JSON" in reasons[paths[2]]
    )
    assert "empty" in reasons[paths[3]]
    assert "not JSON" in reasons[paths[4]]
    assert "format version 9" in reasons[paths[5]]
    by_path = status.set_index("metrics_path")
    assert by_path.loc[GOOD, "status"] == "ok"
    for p in paths[1:6]:
        assert by_path.loc[p, "status"] == "failed"
        assert by_path.loc[p, "reason"].startswith("metrics file rejected")
    assert by_path.loc[paths[6], "status"] == "missing"


def test_a_duplicate_cell_is_quarantined(workdir):
    """Two files naming the same cell: the second one read is refused."""
    first = write(GOOD, lines(assembled()))
    _, cells, _, quarantine, _ = collect([first, first])
    assert len(cells) == 1 and "duplicate of cell" in quarantine["reason"].iloc[0]


def test_failure_record_is_reported(workdir):
    path = cell_path(rep=8)
    write(
        str(Path(path).parent / "failure.json"),
        json.dumps(
            {
                "status": "failed",
                "reason": "rank 1 exited with code 3",
                "rank": 1,
                "exit_code": 3,
                "log_tail": {"1": "boom"},
                "slurm_job_id": None,
            }
        ),
    )
    *_, status = collect([path])
    row = status.iloc[0]
    assert (row["status"], row["failed_rank"], row["exit_code"], row["log_tail"]) == (
        "failed",
        1,
        3,
        "boom",
    )


def test_environment_redacts_secret_names():
    env = {
        "SLURM_JOB_ID": "7",
        "DLSCALE_API_TOKEN": "abc",
        "NCCL_SOCKET_IFNAME": "ib0",
        "HOROVOD_SECRET_KEY": "k",
        "TF_PASSWORD": "p",
        "HOME": "/root",
        "AWS_SECRET": "x",
    }
    got = environment(env)
    assert got == {
        "DLSCALE_API_TOKEN": REDACTED,
        "HOROVOD_SECRET_KEY": REDACTED,
        "NCCL_SOCKET_IFNAME": "ib0",
        "SLURM_JOB_ID": "7",
        "TF_PASSWORD": REDACTED,
    }


def test_missing_latex_gives_a_clear_message(tmp_path, monkeypatch):
    from dlscale.outputs.report import LatexMissing, compile_pdf

    monkeypatch.setenv("PATH", str(tmp_path))  # no latexmk, no pdflatex
    tex = tmp_path / "report.tex"
    tex.write_text("\\documentclass{article}\\begin{document}x\\end{document}\n")
    with pytest.raises(
        LatexMissing, match="latexmk/pdflatex not found.*figures .* are already built"
    ):
        compile_pdf(str(tex), log=str(tmp_path / "log"))

"""The `dlscale` command outside Slurm: its dispatcher (dlscale.__main__)
hands `check`, `bless`, `compare` and `status --all` to their modules with the right
arguments, on a study's results folder on a machine without squeue; the console script is
installed and answers an unknown command with its usage."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from dlscale.__main__ import COMMANDS, main
from dlscale.analysis.stats import scaling_summary
from dlscale.study.cell import METRICS_FILE
from dlscale.workflow.resume_journal import journal, write_driver_record

from helpers.synthetic_study import DEMO, cells_table


def study(folder: Path, slower: float = 1.0) -> Path:
    cells = cells_table(DEMO).assign(study=folder.name)
    cells["throughput_samples_per_s"] *= slower
    (folder / "tables").mkdir(parents=True)
    cells.to_csv(folder / "tables/cells.csv", index=False)
    scaling_summary(cells).to_csv(folder / "tables/scaling.csv", index=False)
    return folder


def run(capsys, *argv) -> tuple[int, str]:
    code = main([str(a) for a in argv])
    out = capsys.readouterr()
    return code, out.out + out.err


def test_bless_then_check_then_compare_through_the_dispatcher(tmp_path, capsys):
    demo = study(tmp_path / "results/demo")
    refs = tmp_path / "references.yaml"
    refs.write_text("references: {}\n")
    code, out = run(capsys, "bless", demo, "--system", "cpu", "--references", refs)
    assert code == 0, out
    assert "cpu:" in refs.read_text()  # the references were written
    code, out = run(capsys, "check", demo, "--references", refs)
    assert code == 0 and "PASS" in out, out
    slow = study(tmp_path / "results/slow", slower=0.5)
    code, out = run(capsys, "check", slow, "--references", refs)
    assert code == 1 and "FAIL" in out, out
    code, out = run(capsys, "compare", demo, slow, "--out", tmp_path / "cmp")
    assert code == 0 and "8 slower" in out, out
    assert (tmp_path / "cmp/compare.csv").is_file()


def test_status_all_outside_slurm(tmp_path, capsys, monkeypatch):
    """A study whose driver recorded two cells: one measured, one whose job (journaled) the
    controller does not know, since no squeue runs here: listed as ended, not lost. (PATH holds
    no Slurm command: the test suite's own local clusters, up beside this test, know a job 42.)"""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "no-slurm").mkdir()
    monkeypatch.setenv("PATH", str(tmp_path / "no-slurm"))
    study_dir = Path("results/demo")
    done = study_dir / "runs/cpu/pytorch/cnn_small/weak/fp32/eager/n1/r1" / METRICS_FILE
    gone = study_dir / "runs/cpu/pytorch/cnn_small/weak/fp32/eager/n2/r1" / METRICS_FILE
    done.parent.mkdir(parents=True)
    done.write_text("{}\n")
    write_driver_record(study_dir, "run1", [str(done), str(gone)])
    journal(study_dir, "submitted", cell=str(gone), slurm_job_id="42")
    code, out = run(capsys, "status", "--all", study_dir)
    assert code == 0, out
    assert "2 cells: 1 measured, 0 running, 0 pending, 0 failed, 0 cancelled, 1 ended" in out
    assert f"measured      no job  {done}" in out  # --all lists the measured cell too
    assert f"ended         job 42  {gone}" in out
    code, out = run(capsys, "status", study_dir)  # without --all: the measured cell is not listed
    assert str(done) not in out and str(gone) in out


def test_the_console_script_lists_its_commands():
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "dlscale"), "frobnicate"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2
    assert all(name in proc.stderr for name in COMMANDS), proc.stderr

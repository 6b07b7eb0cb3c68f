"""The parse-time checks rules/common.smk calls (dlscale.workflow.guards), on a stand-in for
Snakemake's workflow object: who counts as the driver, the repeated --config, the study files of
the partial build, a bad study, the launcher against the executor, the measured cells' notices,
the environments and the TeX notice. The same checks through Snakemake:
tests/workflow/test_refusals.py and tests/workflow/test_local_workflow.py."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from snakemake.exceptions import WorkflowError

from dlscale.study.matrix import load_study
from dlscale.workflow import guards
from dlscale.workflow.advice import Invocation
from dlscale.workflow.finalize import PARTIAL_BUILD_ENV
from dlscale.workflow.paths import output_paths

ROOT = Path(__file__).resolve().parents[3]


def workflow(main=True, **more):
    """What the guards read of Snakemake's workflow object."""
    return SimpleNamespace(is_main_process=main, basedir=str(ROOT), **more)


@pytest.fixture()
def study(tiny_config):
    return load_study(tiny_config, ROOT)


def test_only_the_driver_reads_its_command_line_and_a_repeated_config_stops_it(monkeypatch):
    monkeypatch.delenv(PARTIAL_BUILD_ENV, raising=False)
    twice = Invocation(("--config", "steps=2", "--config", "remeasure=True"), ("x=1",), "local")
    monkeypatch.setattr(Invocation, "current", classmethod(lambda cls: twice))
    assert guards.driver_invocation(workflow(main=False)) is None
    with pytest.raises(WorkflowError, match="No job was started") as refused:
        guards.driver_invocation(workflow())
    assert str(refused.value).startswith("dlscale: ")
    once = Invocation(("--config", "steps=2"), ("steps=2",), "local")
    monkeypatch.setattr(Invocation, "current", classmethod(lambda cls: once))
    assert guards.driver_invocation(workflow()) is once
    monkeypatch.setenv(PARTIAL_BUILD_ENV, "1")  # the partial build: its own command line
    assert guards.driver_invocation(workflow()) is None


def test_the_partial_build_leaves_its_settings_file_out_of_the_study_files(monkeypatch):
    files = workflow(overwrite_configfiles=[Path("study.yaml"), Path("settings.json")])
    monkeypatch.delenv(PARTIAL_BUILD_ENV, raising=False)
    assert guards.study_files(files) == ["study.yaml", "settings.json"]
    monkeypatch.setenv(PARTIAL_BUILD_ENV, "1")
    assert guards.study_files(files) == ["study.yaml"]


def test_a_bad_study_stops_the_run_before_any_job():
    with pytest.raises(WorkflowError) as refused:
        guards.parse_study(workflow(), {"per_rank_batch": -1}, [])
    assert "per_rank_batch: -1 must be >= 1" in str(refused.value)
    assert str(refused.value).endswith("\nNo job was started.")


def test_the_launcher_must_match_the_executor(study, monkeypatch):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    assert study.config["launcher"] == "local"
    guards.check_launcher_matches_executor("local", study, None)
    with pytest.raises(WorkflowError, match="launcher=srun") as refused:
        guards.check_launcher_matches_executor("slurm", study, None)
    assert str(refused.value).endswith("No job was started.")
    guards.check_command_line_launcher(None, study)  # no command line: checked in onstart
    slurm = Invocation(("--executor", "slurm"), (), "slurm")
    with pytest.raises(WorkflowError, match="launcher=srun"):
        guards.check_command_line_launcher(slurm, study)


def test_measured_cells_are_checked_by_the_driver_alone(study, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    cells = list(study.cells)
    kept = guards.keep_measured_cells(workflow(main=False), study, None, "results/tiny")
    assert kept == guards.MeasuredElsewhere({}, "local") and study.cells == cells
    (tmp_path / "results/runs").mkdir(parents=True)  # the layout before studies' folders
    kept = guards.keep_measured_cells(workflow(), study, None, "results/tiny")
    assert kept.launchers == {} and kept.study_launcher == "local"
    assert study.cells == cells  # nothing measured: nothing replanned
    assert "python -m dlscale.store.migrate" in capsys.readouterr().err


def test_a_missing_environment_stops_the_run(tiny_config, tmp_path):
    study = load_study(
        dict(tiny_config, axes={**tiny_config["axes"], "framework": ["mxnet"]}), ROOT
    )
    route = workflow(deployment_settings=SimpleNamespace(deployment_method=set()))
    with pytest.raises(WorkflowError) as refused:
        guards.check_environments(route, study, lambda name: name and tmp_path / name)
    assert "which does not exist" in str(refused.value) and "mxnet" in str(refused.value)
    assert str(refused.value).endswith("\nNo job was started.")


def test_without_tex_the_driver_says_so_once(monkeypatch, capsys):
    monkeypatch.delenv(PARTIAL_BUILD_ENV, raising=False)
    monkeypatch.setattr(guards, "tex_missing", lambda: ["latexmk"])
    out = output_paths("results/tiny", "tiny")
    assert guards.say_if_tex_is_missing(workflow(main=False), out, None) == ["latexmk"]
    assert capsys.readouterr().err == ""
    assert guards.say_if_tex_is_missing(workflow(), out, None) == ["latexmk"]
    err = capsys.readouterr().err
    assert err.startswith("dlscale: TeX not found on PATH (latexmk missing)")
    assert out["pdf"] in err and out["tex"] in err
    monkeypatch.setattr(guards, "tex_missing", lambda: [])
    assert guards.say_if_tex_is_missing(workflow(), out, None) == []
    assert capsys.readouterr().err == ""

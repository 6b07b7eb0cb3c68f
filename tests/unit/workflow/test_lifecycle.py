"""The driver's hooks the Snakefile calls (dlscale.workflow.lifecycle), on a stand-in for
Snakemake's workflow object: the launcher checks of onstart, the adoption of old measurements,
the driver and the recorder started and stopped by the driver alone, the partial build's rules
and arguments, and the end of a run that succeeded. Also what rules/common.smk builds its params
and targets from: the cells' interpreters and JSON (dlscale.workflow.job_params) and the figure
files (dlscale.workflow.figure_files)."""

from __future__ import annotations

import inspect
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from snakemake.common import get_function_params
from snakemake.exceptions import WorkflowError

from dlscale.study.matrix import load_study
from dlscale.workflow import finalize, lifecycle, preflight, recorder, resume
from dlscale.workflow.figure_files import StudyFigures
from dlscale.workflow.finalize import PARTIAL_BUILD_ENV
from dlscale.workflow.guards import MeasuredElsewhere
from dlscale.workflow.job_params import (
    Interpreters,
    cell_json_param,
    per_job,
    shipped_data,
    train_inputs,
)
from dlscale.workflow.paths import output_paths

ROOT = Path(__file__).resolve().parents[3]
NOTHING_ELSEWHERE = MeasuredElsewhere({}, "local")


def workflow(main=True, **more):
    """What the hooks read of Snakemake's workflow object."""
    return SimpleNamespace(is_main_process=main, **more)


def job(rule, *outputs):
    return SimpleNamespace(rule=SimpleNamespace(name=rule), output=list(outputs))


@pytest.fixture()
def study(tiny_config):
    return load_study(tiny_config, ROOT)


def test_a_run_through_the_api_is_checked_against_its_executor(study, monkeypatch):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    slurm = workflow(executor_plugin=SimpleNamespace(name="slurm"))
    with pytest.raises(WorkflowError, match="launcher=srun"):
        lifecycle.check_launcher_of_the_run(slurm, study, None, NOTHING_ELSEWHERE)
    # a command-line run was checked at parse time; a matching executor passes
    lifecycle.check_launcher_of_the_run(slurm, study, object(), NOTHING_ELSEWHERE)
    local = workflow(executor_plugin=SimpleNamespace(name="local"))
    lifecycle.check_launcher_of_the_run(local, study, None, NOTHING_ELSEWHERE)


def test_a_study_measured_with_another_launcher_measures_nothing(study, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    measured, new = study.cells[0].path, study.cells[1].path
    Path(measured).parent.mkdir(parents=True)
    Path(measured).write_text("{}\n")
    elsewhere = MeasuredElsewhere({measured: "srun"}, "srun")
    jobs = [job("collect", "results/tiny/tables/cells.csv")]
    run = workflow(dag=SimpleNamespace(needrun_jobs=lambda: jobs))
    lifecycle.check_study_launcher(run, study, None, elsewhere)  # tables only: rebuilt
    for cell in (measured, new):  # a forced measured cell, a cell not measured yet
        jobs[:] = [job("train_cpu_n1", cell)]
        with pytest.raises(WorkflowError) as refused:
            lifecycle.check_study_launcher(run, study, None, elsewhere)
        assert str(refused.value).startswith("dlscale: 1 cell(s) of study 'tiny'")
        assert f"  - {cell}\n" in str(refused.value) and "launcher=srun" in str(refused.value)
    lifecycle.check_study_launcher(workflow(main=False), study, None, elsewhere)
    lifecycle.check_study_launcher(run, study, None, NOTHING_ELSEWHERE)


def test_old_metrics_files_are_adopted_by_the_driver_alone(study, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    plain = Path(study.cells[0].path)
    plain.parent.mkdir(parents=True)
    plain.write_text("{}\n")
    lifecycle.adopt_measurements(workflow(main=False), study)
    assert not (plain.parent / "measurements").exists()
    lifecycle.adopt_measurements(workflow(), study)
    (kept,) = (plain.parent / "measurements").glob("*/metrics.jsonl")
    assert kept.samefile(plain)


def test_the_driver_and_its_recorder_start_and_stop_in_the_driver_alone(study, monkeypatch):
    calls = []
    monkeypatch.setattr(resume, "start", lambda *args: calls.append(("resume", args)))
    monkeypatch.setattr(preflight, "start", lambda *args: calls.append(("preflight", args)))
    monkeypatch.setattr(recorder, "start", lambda *args: calls.append(("recorder", args)))
    monkeypatch.setattr(recorder, "stop", lambda: calls.append(("stop", ())))
    monkeypatch.delenv(PARTIAL_BUILD_ENV, raising=False)
    paths = [cell.path for cell in study.cells]
    for hook in (
        lambda run: lifecycle.start_driver(run, study, "results/tiny", "pythons"),
        lambda run: lifecycle.start_recorder(run, "sqlite://", "results/tiny", study),
        lifecycle.stop_recorder,
    ):
        hook(workflow(main=False))
    assert calls == []
    run = workflow()
    lifecycle.start_driver(run, study, "results/tiny", "pythons")
    (_, started), (_, checked) = calls
    config = study.config
    assert started == (
        run,
        "results/tiny",
        config["restart"],
        paths,
        config["pack"],
        config["pack_steps"],
    )
    assert checked[:3] == (run, "results/tiny", study.config) and checked[-1] == "pythons"
    calls.clear()
    lifecycle.start_recorder(run, "sqlite://", "results/tiny", study)
    lifecycle.stop_recorder(run)
    assert calls == [("recorder", ("sqlite://", "results/tiny", paths)), ("stop", ())]
    calls.clear()
    monkeypatch.setenv(PARTIAL_BUILD_ENV, "1")  # the partial build's driver already records
    lifecycle.start_recorder(run, "sqlite://", "results/tiny", study)
    assert calls == []


def test_the_partial_build_runs_the_rules_downstream_of_the_cells(study, monkeypatch):
    rules = ["all", "train_cpu_n1", "converge_cpu_n2_tp", "shipped_digits", "collect", "figure"]
    asked = {}
    monkeypatch.setattr(finalize, "build_partial", lambda *a, **k: asked.update(args=a, **k))
    monkeypatch.setattr(resume, "STOPPED_BY", "SIGTERM", raising=False)
    run = workflow(
        rules=[SimpleNamespace(name=name) for name in rules],
        deployment_settings=SimpleNamespace(deployment_method=[], conda_prefix=None),
        executor_plugin=SimpleNamespace(name="local"),
        resource_settings=SimpleNamespace(cores=3, local_cores=7),
        main_snakefile="/checkout/Snakefile",
    )
    assert lifecycle.partial_rules(run) == ["all", "collect", "figure"]
    lifecycle.build_partial_report(run, {"steps": 2}, study, "results/tiny", ["study.yaml"])
    assert asked["args"] == ({"steps": 2}, output_paths("results/tiny/partial", "tiny"))
    assert asked["partial"] == "results/tiny/partial" and asked["n_planned"] == len(study.cells)
    assert asked["allowed_rules"] == ["all", "collect", "figure"]
    assert asked["study_files"] == ["study.yaml"] and asked["cores"] == 3
    assert asked["stopped_by"] == "SIGTERM" and asked["snakefile"] == "/checkout/Snakefile"
    run.executor_plugin = SimpleNamespace(name="dlscale")  # the login node's cores
    lifecycle.build_partial_report(run, {}, study, "results/tiny", [])
    assert asked["cores"] == 7


def test_a_run_that_succeeded_drops_the_partial_report_and_names_the_pdf(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "results/tiny/partial/report").mkdir(parents=True)
    lifecycle.remove_partial_outputs("results/tiny")
    assert not (tmp_path / "results/tiny/partial").exists()
    assert (tmp_path / "results/tiny").is_dir()
    out = output_paths("results/tiny", "tiny")
    run = workflow(dag=SimpleNamespace(jobs=[job("report_tex", out["tex"])]))
    lifecycle.say_where_the_report_is(run, out)
    assert capsys.readouterr().err.startswith("dlscale: the study's report sources: ")
    lifecycle.say_where_the_report_is(workflow(dag=SimpleNamespace(jobs=[])), out)
    assert capsys.readouterr().err == ""


def test_the_cells_interpreters_are_found_once(study, tmp_path, monkeypatch):
    monkeypatch.setenv("DLSCALE_ENVS_DIR", str(tmp_path))
    pythons = Interpreters(study, ROOT)
    assert pythons.environment_dir(None) is None
    assert pythons.environment_dir("mxnet") == tmp_path / "mxnet"
    assert pythons.framework_python("cpu", "pytorch", "fp32") == sys.executable  # CPU build
    assert pythons.framework_python("cpu", "mxnet") == str(tmp_path / "mxnet/bin/python")
    pythons.framework_python("cpu", "pytorch", "fp32")
    assert pythons.framework_python.cache_info().hits == 1
    assert pythons.model_python("cpu", "cnn_small") is None  # not a study model
    assert pythons.conda_env("pytorch") == str(ROOT / "envs/pytorch.yaml")


def test_a_cells_json_param_hands_snakemake_its_signature(study, monkeypatch):
    def cell(wildcards):
        return wildcards

    assert per_job(cell) is cell
    asked = []
    param = cell_json_param(lambda w, workload: asked.append(workload) or study.cells[0], "script")
    monkeypatch.setattr(inspect, "signature", lambda *a, **k: pytest.fail("signature asked"))
    assert list(get_function_params(cell)) == list(get_function_params(param)) == ["wildcards"]
    assert param({"any": "wildcards"}) == study.cells[0].to_json() and asked == ["script"]


def test_a_convergence_cell_reads_the_shipped_data_as_an_ancient_input(study):
    assert train_inputs(study, "throughput") == {}
    (data,) = train_inputs(study, "convergence").values()
    assert str(data).startswith("results/data/digits/") and data.flags.get("ancient")
    with pytest.raises(WorkflowError, match="no shipped data in format 'gif'"):
        shipped_data("gif")


def test_the_figure_files_and_their_specs(study):
    figures = StudyFigures(study, "results/tiny/figures")
    out = output_paths("results/tiny", "tiny")
    assert "results/tiny/figures/cpu/throughput.pdf" in figures.files(out)
    assert figures.spec("cpu", "throughput")["file"] == "cpu/throughput.pdf"
    with pytest.raises(WorkflowError, match="is not a figure of this study; its figures: cpu/"):
        figures.spec("cpu", "nothing")
    files = figures.convergence_files(out)
    assert "results/tiny/figures/cpu/convergence/time_to_accuracy.pdf" in files
    assert figures.convergence_spec("cpu", "time_to_accuracy")["file"].startswith("cpu/conv")
    with pytest.raises(WorkflowError, match="results/tiny/figures/gpu/convergence/x.pdf"):
        figures.convergence_spec("gpu", "x")

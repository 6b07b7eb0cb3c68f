"""dlscale.workflow.jobstep: the command a cell's Slurm job runs instead of two Snakemake start-ups,
given by the dlscale executor plugin's `format_job_exec`. Submitted for real by the Slurm tests
(tests/slurm: every cell job, arrays included)."""

from __future__ import annotations

import base64
import json
import re
import shlex
import subprocess
import sys
import zlib
from types import SimpleNamespace

import pytest
from snakemake.settings.types import DeploymentMethod
from snakemake_executor_plugin_slurm_jobstep import _decompress_array_task_call

from dlscale.workflow import jobstep


def payload(tmp_path, shell: str) -> dict:
    return {
        "rule": "train_cpu_n1",
        "jobid": 7,
        "shell": shell,
        "output": [str(tmp_path / "cell" / "metrics.jsonl")],
        "log": [str(tmp_path / "logs" / "cell.log")],
    }


def run_step(tmp_path, shell: str, *extra: str, env=None) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", jobstep.MODULE, jobstep.encode(payload(tmp_path, shell))]
    return subprocess.run(
        [*command, *extra], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=60
    )


def test_the_payload_round_trips_and_needs_no_quoting_inside_wrap():
    shell = """python -m dlscale.run.launch --cell-json '{"a": "b $HOME `x`"}' > 'l o g' 2>&1"""
    text = jobstep.encode({"shell": shell})
    assert re.fullmatch(r"[A-Za-z0-9_=-]+", text)
    assert jobstep.decode(text) == {"shell": shell}


def test_the_job_runs_the_rules_command_after_preparing_its_files(tmp_path):
    out = tmp_path / "cell" / "metrics.jsonl"
    out.parent.mkdir()
    out.write_text("stale\n")
    shell = f"test ! -e {shlex.quote(str(out))} && echo new > {shlex.quote(str(out))}"
    shell += f" && echo logged > {shlex.quote(str(tmp_path / 'logs' / 'cell.log'))}"
    proc = run_step(tmp_path, shell)
    assert proc.returncode == 0, proc.stderr
    assert out.read_text() == "new\n"  # the stale output was gone before the command ran
    assert (tmp_path / "logs" / "cell.log").read_text() == "logged\n"  # its folder was made
    assert "rule train_cpu_n1, Snakemake job 7" in proc.stdout


@pytest.mark.parametrize(("shell", "rc"), [("exit 3", 3), ("false | true", 1), ("x=$nope", 1)])
def test_the_jobs_exit_status_is_the_commands_under_snakemakes_shell_prefix(tmp_path, shell, rc):
    assert run_step(tmp_path, shell).returncode == rc


def plugin_table(execs: dict[int, str]) -> str:
    """The dispatch table as the plugin's run_array_jobs writes it for tasks 2.. of a chunk."""
    table = {str(i): zlib.compress(e.encode(), level=9).hex() for i, e in execs.items()}
    return base64.b64encode(json.dumps(table).encode()).decode()


def test_each_array_task_runs_its_own_cell_by_the_plugins_dispatch_rule(tmp_path, monkeypatch):
    execs = {i: f"/py -m {jobstep.MODULE} {jobstep.encode({'task': i})}" for i in (2, 3)}
    table = plugin_table(execs)
    # the plugin's own job-step decoder reads the same table
    assert _decompress_array_task_call(table, 3) == execs[3]
    argv = [jobstep.encode({"task": 1}), f"{jobstep.ARRAY_OPTION}={table}"]
    monkeypatch.setenv("SLURM_ARRAY_TASK_MIN", "1")
    for task in (1, 2, 3):
        monkeypatch.setenv("SLURM_ARRAY_TASK_ID", str(task))
        got = jobstep.array_task_payload(argv)
        assert jobstep.decode(got or argv[0]) == {"task": task}
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "4")
    with pytest.raises(SystemExit, match="array task 4 has no command"):
        jobstep.array_task_payload(argv)
    monkeypatch.delenv("SLURM_ARRAY_TASK_ID")
    assert jobstep.array_task_payload(argv) is None  # not an array task


def test_an_array_task_in_a_real_process(tmp_path):
    out = tmp_path / "second"
    second = f"/py -m {jobstep.MODULE} " + jobstep.encode(
        payload(tmp_path, f"echo 2 > {shlex.quote(str(out))}")
    )
    env = {"PATH": "/usr/bin:/bin", "SLURM_ARRAY_TASK_ID": "2", "SLURM_ARRAY_TASK_MIN": "1"}
    env["PYTHONPATH"] = ":".join(sys.path)
    table = plugin_table({2: second})
    proc = run_step(tmp_path, "exit 9", f"{jobstep.ARRAY_OPTION}={table}", env=env)
    assert proc.returncode == 0, proc.stderr
    assert out.read_text() == "2\n"


def fake_job(rule: str, group: bool = False):
    return SimpleNamespace(
        rule=SimpleNamespace(name=rule, shadow_depth=None),
        is_group=lambda: group,
        shellcmd="python -m dlscale.run.launch --cell-json '{}' --output o > l 2>&1",
        benchmark=None,
        jobid=3,
        output=["o"],
        log=["l"],
    )


def fake_workflow(methods=()):
    return SimpleNamespace(deployment_settings=SimpleNamespace(deployment_method=set(methods)))


def plugin_command(job) -> str:
    return "python -m snakemake"


def test_only_cell_jobs_take_the_thin_command(monkeypatch):
    monkeypatch.delenv(jobstep.IN_JOB_ENV, raising=False)
    thin, why = jobstep.route(fake_workflow())
    assert thin and "directly" in why
    thin_command = jobstep.command(fake_job("converge_cpu_n2"), thin, plugin_command)
    assert shlex.split(thin_command)[1:3] == ["-m", jobstep.MODULE]
    assert jobstep.decode(shlex.split(thin_command)[3])["shell"] == fake_job("x").shellcmd
    job = fake_job("train_cpu_n1", group=True)
    assert jobstep.command(job, thin, plugin_command) == "python -m snakemake"
    assert jobstep.command(fake_job("shipped_digits"), thin, plugin_command).endswith("snakemake")


def test_software_deployment_or_the_environment_keep_snakemake_in_the_job(monkeypatch):
    monkeypatch.delenv(jobstep.IN_JOB_ENV, raising=False)
    thin, why = jobstep.route(fake_workflow([DeploymentMethod.CONDA]))
    assert not thin and "conda" in why
    assert jobstep.command(fake_job("train_cpu_n1"), thin, plugin_command).endswith("snakemake")
    monkeypatch.setenv(jobstep.IN_JOB_ENV, "1")
    thin, why = jobstep.route(fake_workflow())
    assert not thin and jobstep.IN_JOB_ENV in why


def test_the_dlscale_executor_gives_cell_jobs_the_thin_command(monkeypatch):
    """The plugin's own `format_job_exec` (its base class's) for every other job."""
    from snakemake_executor_plugin_slurm import Executor as SlurmExecutor

    from snakemake_executor_plugin_dlscale import Executor

    monkeypatch.setattr(SlurmExecutor, "format_job_exec", lambda self, job: plugin_command(job))
    executor = object.__new__(Executor)  # no workflow, no status thread: only the method
    executor.thin = True
    assert shlex.split(executor.format_job_exec(fake_job("train_cpu_n1")))[2] == jobstep.MODULE
    assert executor.format_job_exec(fake_job("collect")) == "python -m snakemake"
    executor.thin = False
    assert executor.format_job_exec(fake_job("train_cpu_n1")) == "python -m snakemake"

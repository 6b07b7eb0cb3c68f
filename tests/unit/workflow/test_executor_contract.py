"""The contract between dlscale's executor plugin (scripts/snakemake_executor_plugin_dlscale) and
what it extends: Snakemake's executor interface and the official Slurm executor plugin.

The plugin subclasses `snakemake_executor_plugin_slurm.Executor`, overrides some of its methods
and calls others, and dlscale.workflow.resume/jobstep read a few attributes of Snakemake's
objects. Every one of those is pinned here, as its `inspect.signature` (or its presence) under
the versions in envs/workflow.txt, together with the call sites that make an override matter
(the Slurm plugin must still call `self.format_job_exec(job)` when it builds the sbatch line).
An upgrade that changes any of them fails here, naming what changed, instead of in a study.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
from importlib import metadata
from pathlib import Path

import pytest
import snakemake.api  # noqa: F401  (imports snakemake.workflow, snakemake.dag in a working order)
import yaml
from snakemake.dag import DAG
from snakemake.jobs import Job
from snakemake.persistence import PersistenceBase
from snakemake.workflow import Workflow
from snakemake_executor_plugin_slurm import Executor as SlurmExecutor
from snakemake_executor_plugin_slurm import ExecutorSettings as SlurmExecutorSettings
from snakemake_executor_plugin_slurm import utils as slurm_utils
from snakemake_interface_executor_plugins.executors.base import SubmittedJobInfo
from snakemake_interface_executor_plugins.executors.real import RealExecutor
from snakemake_interface_executor_plugins.registry import ExecutorPluginRegistry

import snakemake_executor_plugin_dlscale as plugin
from dlscale.study.matrix_checks import launcher_problem

ROOT = Path(__file__).resolve().parents[3]
JOB = "snakemake_interface_executor_plugins.jobs.JobExecutorInterface"
INFO = "snakemake_interface_executor_plugins.executors.base.SubmittedJobInfo"

# The base methods the dlscale Executor overrides or calls: name -> signature on the Slurm
# executor (wherever in its bases it is defined).
OVERRIDDEN = {
    "__post_init__": "(self, test_mode: bool = False)",
    "format_job_exec": f"(self, job: {JOB}) -> str",
    "run_jobs": f"(self, jobs: List[{JOB}])",
    "report_job_submission": f"(self, job_info: {INFO}, register_job: bool = True)",
    "report_job_success": f"(self, job_info: {INFO})",
    "report_job_error": f"(self, job_info: {INFO}, msg=None, **kwargs)",  # the preflight's why
    "cancel_jobs": f"(self, active_jobs: List[{INFO}])",
    "check_active_jobs": (
        f"(self, active_jobs: List[{INFO}]) -> Generator[{INFO}, NoneType, NoneType]"
    ),
}
CALLED = {
    "run_job_pre": f"(self, job: {JOB})",  # an adopted or accepted job is announced
    "run_job": f"(self, job: {JOB})",  # a pack's allocation (dlscale.workflow.packing.PackJob)
}
# Called on the interface's class itself: an accepted job is registered but never polled.
REAL_REPORT_SUBMISSION = f"(self, job_info: {INFO}, register_job: bool = True)"
# Where the Slurm executor calls what the dlscale one overrides: method -> code it contains.
CALL_SITES = {
    "run_job": [
        "self.format_job_exec(job)",
        "self._report_job_submission_threadsafe(",
        # what a pack's stand-in job (packing.PackJob) gives the plugin
        "job.is_group()",
        "get_job_wildcards(job)",
        'job.resources.get("runtime")',
        "set_gres_string(job)",
    ],
    # a pack is submitted on the plugin's own submission thread pool
    "_submit_job": ["self._job_submission_executor.submit(self.run_job, job)"],
    "_report_job_submission_threadsafe": ["self.report_job_submission"],
    "check_active_jobs": [
        "self.report_job_success(",
        # the back-off the plugin's override bounds
        "self.next_seconds_between_status_checks = min(",
        "self.next_seconds_between_status_checks + 10",
    ],
    "__post_init__": ["self.run_uuid =", "self.slurm_logdir ="],
}
# What RemoteExecutor gives every instance, read by resume's signal handlers and cancel.
REMOTE_INIT = ["self.active_jobs = ", "self.lock = ", "self.__post_init__()"]
REMOTE_CANCEL = "self.cancel_jobs(active_jobs)"
# Snakemake's objects as dlscale.workflow.resume / jobstep read them.
SNAKEMAKE = {
    "DAG.needrun_jobs": (
        DAG.needrun_jobs,
        "(self, exclude_finished=True) -> Iterable[snakemake.jobs.Job]",
    ),
    "PersistenceBase.external_jobids": (
        PersistenceBase.external_jobids,
        "(self, job: Any) -> list[str]",
    ),
    "snakemake_executor_plugin_slurm.utils.get_job_wildcards": (
        slurm_utils.get_job_wildcards,
        f"(job: {JOB}) -> str",
    ),
}
JOB_ATTRIBUTES = [
    "shellcmd",
    "benchmark",
    "is_group",
    "output",
    "log",
    "jobid",
    "rule",
    # packing.pack_key
    "resources",
    "wildcards_dict",
    "params",
]
WORKFLOW_ATTRIBUTES = [
    "is_main_process",
    "executor_plugin",
    "persistence",
    "dag",
    "deployment_settings",
    "executor_settings",
]


def pinned() -> str:
    lines = (ROOT / "envs" / "workflow.txt").read_text().splitlines()
    pins = [x.strip() for x in lines if x.strip().startswith("snakemake")]
    installed = [
        f"{dist}=={metadata.version(dist)}"
        for dist in (
            "snakemake-interface-executor-plugins",
            "snakemake-executor-plugin-slurm-jobstep",
        )
    ]
    return f"pinned in envs/workflow.txt: {', '.join(pins)}; installed: {', '.join(installed)}"


def broken(what: str, expected, got) -> str:
    return (
        f"{what} changed: expected {expected}, found {got} ({pinned()}). "
        "snakemake_executor_plugin_dlscale (scripts/) relies on it: adapt the plugin and "
        "dlscale.workflow.resume/jobstep to the new interface, then update this test."
    )


@pytest.mark.parametrize("name", sorted({**OVERRIDDEN, **CALLED}))
def test_the_slurm_executor_methods_the_plugin_relies_on_are_unchanged(name):
    expected = {**OVERRIDDEN, **CALLED}[name]
    method = getattr(SlurmExecutor, name, None)
    assert method is not None, broken(f"Slurm Executor.{name}", "a method", "none")
    got = str(inspect.signature(method))
    assert got == expected, broken(f"the signature of Slurm Executor.{name}", expected, got)


@pytest.mark.parametrize("name", sorted(OVERRIDDEN))
def test_each_override_keeps_its_base_signature(name):
    """The dlscale Executor's override takes what the base takes (annotations aside)."""
    base = inspect.signature(getattr(SlurmExecutor, name))
    ours = inspect.signature(getattr(plugin.Executor, name))
    assert name in vars(plugin.Executor), f"dlscale Executor no longer overrides {name}"

    def shape(sig):
        return [(p.name, p.kind, p.default) for p in sig.parameters.values()]

    assert shape(ours) == shape(base), broken(f"dlscale Executor.{name}", base, ours)


def test_the_interface_registers_an_accepted_job_without_polling_it():
    got = str(inspect.signature(RealExecutor.report_job_submission))
    assert got == REAL_REPORT_SUBMISSION, broken(
        "RealExecutor.report_job_submission", REAL_REPORT_SUBMISSION, got
    )
    fields = [f.name for f in dataclasses.fields(SubmittedJobInfo)]
    assert fields == ["job", "external_jobid", "aux"], broken(
        "SubmittedJobInfo", "job, ...", fields
    )


@pytest.mark.parametrize("method", sorted(CALL_SITES))
def test_the_slurm_executor_still_calls_what_the_plugin_overrides(method):
    source = inspect.getsource(getattr(SlurmExecutor, method))
    for code in CALL_SITES[method]:
        assert code in source, broken(f"Slurm Executor.{method}", f"a call {code!r}", "none")


def test_every_remote_executor_has_the_state_resume_reads():
    from snakemake_interface_executor_plugins.executors.remote import RemoteExecutor

    init = inspect.getsource(RemoteExecutor.__init__)
    for code in REMOTE_INIT:
        assert code in init, broken("RemoteExecutor.__init__", repr(code), "none")
    assert REMOTE_CANCEL in inspect.getsource(RemoteExecutor.cancel), broken(
        "RemoteExecutor.cancel", REMOTE_CANCEL, "none"
    )


@pytest.mark.parametrize("name", sorted(SNAKEMAKE))
def test_snakemakes_functions_resume_reads_are_unchanged(name):
    function, expected = SNAKEMAKE[name]
    got = str(inspect.signature(function))
    assert got == expected, broken(name, expected, got)


def test_snakemakes_job_and_workflow_attributes_resume_and_jobstep_read_exist():
    for name in JOB_ATTRIBUTES:
        assert hasattr(Job, name), broken(f"snakemake.jobs.Job.{name}", "an attribute", "none")
    for name in WORKFLOW_ATTRIBUTES:
        assert hasattr(Workflow, name), broken(f"Workflow.{name}", "an attribute", "none")


def test_the_plugin_is_found_by_snakemakes_registry_as_dlscale():
    registry = ExecutorPluginRegistry()
    found = registry.get_plugin("dlscale")
    assert found.executor is plugin.Executor
    assert found.settings_cls is plugin.ExecutorSettings
    assert found.common_settings is plugin.common_settings
    assert found.common_settings.non_local_exec and not found.common_settings.implies_no_shared_fs
    assert issubclass(plugin.Executor, SlurmExecutor)
    assert issubclass(plugin.ExecutorSettings, SlurmExecutorSettings)
    # Snakemake names the plugin's settings after it: --dlscale-<setting>
    assert found.cli_prefix == "dlscale"
    assert found.get_cli_arg("status_command") == "--dlscale-status-command"


def test_the_profile_names_the_plugin_and_only_settings_it_has():
    profile = yaml.safe_load((ROOT / "profiles" / "slurm" / "config.yaml").read_text())
    assert profile["executor"] == "dlscale"
    fields = {f.name for f in dataclasses.fields(plugin.ExecutorSettings)}
    keys = [k for k in profile if k.startswith(("dlscale-", "slurm-"))]
    assert keys and all(k.startswith("dlscale-") for k in keys), keys
    for key in keys:
        assert key.removeprefix("dlscale-").replace("-", "_") in fields, key


def test_the_official_plugins_option_names_are_refused_not_ignored():
    argv = ["--slurm-array-jobs", "all", "--slurm-status-command=sacct", "--slurm-jobstep-x"]
    assert plugin.misnamed_options(argv) == ["--slurm-array-jobs", "--slurm-status-command"]
    assert plugin.misnamed_options(["--dlscale-array-jobs", "all"]) == []


def test_the_launcher_check_covers_the_plugin():
    assert "Add launcher=srun" in launcher_problem("dlscale", "local", in_allocation=False)
    assert launcher_problem("dlscale", "srun", in_allocation=False) is None


def test_no_live_object_is_patched():
    """The plugin and the modules it runs extend Snakemake only by subclassing: no assignment
    to an attribute of the executor, the workflow or its scheduler."""
    sources = [ROOT / "scripts" / "snakemake_executor_plugin_dlscale" / "__init__.py"]
    sources += [ROOT / "scripts" / "dlscale" / "workflow" / f for f in ("resume.py", "jobstep.py")]
    assignment = re.compile(
        r"^\s*(ex|executor|self\.executor|workflow|self\.workflow)\.\w+\s*=", re.M
    )
    for path in sources:
        text = path.read_text()
        for pattern in (
            "setattr(",
            "format_job_exec =",
            ".run_jobs =",
            ".cancel_jobs =",
            "._executor",
        ):
            assert pattern not in text, f"{path.relative_to(ROOT)}: {pattern}"
        assert not assignment.search(text), f"{path.relative_to(ROOT)}: {assignment.search(text)}"


@pytest.mark.parametrize(
    "factor, bound, before, after_poll, seen",
    [
        (None, 30, 170, 180, 30),  # the plugin's step (+10 s), bounded
        (None, 30, 2, 12, 12),
        (None, 0, 170, 180, 180),  # 0: unbounded
        (1.5, 30, 2, 12, 3),  # no job finished: x 1.5 instead of + 10 s
        (1.5, 30, 4.5, 14.5, 6.8),
        (1.5, 30, 2.5, 12.5, 3.8),
        (1.1, 30, 2, 12, 3),  # at least 1 s more
        (1.5, 30, 30, 40, 30),  # bounded
        (1.5, 30, 22.8, 2, 2),  # a job finished: the plugin's reset to the init interval stands
    ],
)
def test_the_status_back_off_grows_by_the_factor_up_to_the_bound(
    monkeypatch, factor, bound, before, after_poll, seen
):
    """The Slurm plugin backs off by 10 s per poll that saw no job finish, up to a fixed 180 s,
    and resets to its init interval when one did; the dlscale Executor runs the plugin's poll,
    then (with a factor) grows the interval it started from by the factor instead, and bounds
    it (0: unbounded). The poll itself is replaced here (no cluster): it yields its job and
    sets the interval as the plugin would."""
    import asyncio
    import types

    async def poll(self, active_jobs):
        self.next_seconds_between_status_checks = after_poll
        for job in active_jobs:
            yield job

    monkeypatch.setattr(SlurmExecutor, "check_active_jobs", poll)
    executor = object.__new__(plugin.Executor)
    executor.workflow = types.SimpleNamespace(
        executor_settings=plugin.ExecutorSettings(
            max_seconds_between_status_checks=bound, status_backoff_factor=factor
        )
    )
    executor.next_seconds_between_status_checks = before

    async def still_running():
        return [j async for j in executor.check_active_jobs(["job"])]

    assert asyncio.run(still_running()) == ["job"]
    assert executor.next_seconds_between_status_checks == seen


def test_the_profile_polls_geometrically_up_to_30_s():
    profile = yaml.safe_load((ROOT / "profiles" / "slurm" / "config.yaml").read_text())
    assert profile["dlscale-max-seconds-between-status-checks"] == 30
    assert profile["dlscale-status-backoff-factor"] == 1.5
    assert profile["dlscale-init-seconds-before-status-checks"] == 2


def test_no_default_resource_of_the_profile_reads_the_inputs_sizes(monkeypatch):
    """Snakemake adds its own default resources to the profile's (`--default-resources` reads
    with defaults="full"); one over the inputs' size (`input.size_mb`), evaluated while
    `--report` builds its DAG, fails inside Snakemake's event loop and leaves a "coroutine ...
    was never awaited" warning per job. Every default resource of profiles/slurm is evaluated
    here with inputs that record whether their size was asked."""
    from snakemake.cli import parse_args

    class Inputs(list):
        asked: list[str] = []

        @property
        def size_mb(self):
            Inputs.asked.append(name)
            return 1.0

    monkeypatch.chdir(ROOT)
    _, args = parse_args(["--profile", "profiles/slurm"])
    resources = args.default_resources
    for name in resources:
        resources[name].evaluate(
            wildcards={}, input=Inputs(["a.csv"]), attempt=1, threads=1, rulename="r",
            async_run=lambda coroutine: pytest.fail("an input size computed"),
        )  # fmt: skip
    assert Inputs.asked == [], f"default resources over the inputs' size: {Inputs.asked}"
    assert {"mem_mb", "disk_mb", "runtime"} <= set(resources)


def test_snakemake_takes_a_params_functions_signature_from_the_hook(monkeypatch):
    """dlscale.workflow.job_params.per_job: the train rules' params functions hand Snakemake their
    signature once (snakemake.common.overwrite_function_params) instead of the three
    inspect.signature calls per job that Rule.apply_input_function and
    Rule._is_deriving_function make through get_function_params."""
    import snakemake.common as common
    import snakemake.rules as rules

    def cell(wildcards):
        return wildcards

    parameters = inspect.signature(cell).parameters
    common.overwrite_function_params(cell, parameters)
    monkeypatch.setattr(inspect, "signature", lambda *a, **k: pytest.fail("signature asked"))
    assert common.get_function_params(cell) is parameters
    assert common.get_input_function_aux_params(cell, {"input": 1, "wildcards": 2}) == {
        "wildcards": 2
    }
    for caller in (rules.Rule.apply_input_function, rules.Rule._is_deriving_function):
        assert "get_function_params(func)" in inspect.getsource(caller), broken(
            f"{caller.__qualname__}", "get_function_params(func)", "another way"
        )

"""The driver's hooks: what the Snakefile's `onstart`, `onsuccess` and `onerror` handlers do, one
call each, with what they need passed in (the workflow object, the study, its folders).

onstart, before the first job: the launcher must match the executor that really runs the jobs
(launcher=srun under the Slurm executor); a study measured with another launcher is rebuilt,
never measured; measurements from before their folders existed get one; then the driver records
itself and resumes the jobs an earlier driver of the study left behind (dlscale.workflow.resume),
and from then on writes each cell's row into the results database as the cell's metrics land
(dlscale.workflow.recorder).

onsuccess: the complete outputs supersede an earlier partial report; the recorder's last pass;
the run ends naming the study's report.

onerror: the recorder's last pass, then the partial report (results/<study>/partial/) built by
the workflow's own rules (dlscale.workflow.finalize.build_partial).
"""

from __future__ import annotations

import os
import shutil
import sys

from snakemake.exceptions import WorkflowError

from dlscale.store.measurements import adopt_unarchived, launcher_refusal
from dlscale.study.cell import CELL_RULE_PREFIXES
from dlscale.study.matrix import Study
from dlscale.workflow import recorder
from dlscale.workflow.advice import Invocation, with_launcher
from dlscale.workflow.guards import MeasuredElsewhere, check_launcher_matches_executor, is_driver
from dlscale.workflow.paths import output_paths, partial_folder


def check_launcher_of_the_run(
    workflow, study: Study, invocation: Invocation | None, measured: MeasuredElsewhere
) -> None:
    """The launcher check for a run started without the `snakemake` command (Snakemake's API:
    no command line to read the executor from), against the executor that really runs the jobs.
    A command-line run was checked when the workflow was parsed
    (dlscale.workflow.guards.check_command_line_launcher). Then check_study_launcher."""
    plugin = workflow.executor_plugin
    if plugin is not None and workflow.is_main_process and invocation is None:
        check_launcher_matches_executor(plugin.name, study, invocation)
    check_study_launcher(workflow, study, invocation, measured)


def check_study_launcher(
    workflow, study: Study, invocation: Invocation | None, measured: MeasuredElsewhere
) -> None:
    """A study measured with another launcher than this run's is rebuilt here, never measured: a
    cell job this run would start (a --forcerun of a cell, a cell not measured yet) stops it
    before the first job, with the command of the study's profile and launcher. In `onstart`,
    where the jobs to run are known (a dry run lists them, and the notice at parse time says
    it: dlscale.workflow.guards.keep_measured_cells)."""
    if not measured.launchers or not workflow.is_main_process:
        return
    measuring = [
        str(path)
        for job in workflow.dag.needrun_jobs()
        if job.rule.name.startswith(CELL_RULE_PREFIXES)
        for path in job.output
    ]
    elsewhere = [p for p in measuring if p in measured.launchers or not os.path.exists(p)]
    if elsewhere:
        refusal = launcher_refusal(
            study.config["study"],
            measured.launchers,
            study.config["launcher"],
            elsewhere,
            with_launcher(invocation, measured.study_launcher),
        )
        raise WorkflowError(f"dlscale: {refusal}")


def adopt_measurements(workflow, study: Study) -> None:
    """Existing metrics files without a measurement folder of their own (the layout before
    dlscale.store.measurements) get one before the first job could remove them: in `onstart`,
    which Snakemake runs only for a real run with jobs to do, before any job (at parse time a
    dry run cannot be told from a real one, and a dry run writes nothing)."""
    if workflow.is_main_process:
        adopt_unarchived(cell.path for cell in study.cells)


def start_driver(workflow, study: Study, results: str, framework_python) -> None:
    """The driver records itself and, under the project's executor plugin (`executor: dlscale`,
    snakemake_executor_plugin_dlscale: the official Slurm executor subclassed), starts resume:
    adopts the jobs an earlier driver of the study left queued or running, journals every
    submission and handles SIGHUP/SIGINT/SIGTERM (dlscale.workflow.resume), and packs the cells
    into allocations with config `pack` (dlscale.workflow.packing). The plugin itself has each
    cell's job run its launcher with no Snakemake inside the allocation
    (dlscale.workflow.jobstep). After the launcher check, before any job. `framework_python`:
    (hardware, framework, precision) -> the interpreter of that environment, for the preflight
    (dlscale.workflow.job_params.Interpreters)."""
    if not workflow.is_main_process:
        return
    from dlscale.study.script_workload import environment_cells
    from dlscale.workflow import preflight
    from dlscale.workflow.resume import start

    start(
        workflow,
        results,
        study.config["restart"],
        [cell.path for cell in study.cells],
        study.config["pack"],
        study.config["pack_steps"],
    )
    # each (hardware entry, environment) checked by one short job that holds its cells
    # (dlscale.workflow.preflight; `--config preflight=False` skips it)
    preflight.start(
        workflow,
        results,
        study.config,
        environment_cells(study.cells),  # a script cell: its environment's framework
        study.hardware,
        framework_python,
    )


def start_recorder(workflow, database_url, results: str, study: Study) -> None:
    """onstart: the driver writes each cell's row as it lands (not in the partial build, whose
    driver already records)."""
    if is_driver(workflow):
        recorder.start(database_url, results, [cell.path for cell in study.cells])


def stop_recorder(workflow) -> None:
    """onsuccess / onerror: the recorder's last pass."""
    if workflow.is_main_process:
        recorder.stop()


def partial_rules(workflow) -> list[str]:
    """The rules the partial build may run: all but those that measure a cell or write its
    data, so it only ever reads the cells that exist."""
    names = [r.name for r in workflow.rules]
    return [n for n in names if not n.startswith(CELL_RULE_PREFIXES) and n != "shipped_digits"]


def build_partial_report(
    workflow, config: dict, study: Study, results: str, study_files: list[str]
) -> None:
    """onerror: the `partial` target (results/<study>/partial/) by the workflow's own rules: a
    second snakemake on the local executor, same Snakefile and configuration (Snakemake's
    `config` as this run resolved it, and its `study_files`); collect reads the cells whose
    metrics exist and lists the others as failed or missing; only the rules downstream of the
    cells may run, never a cell's (partial_rules)."""
    from dlscale.workflow import resume
    from dlscale.workflow.finalize import build_partial

    partial = partial_folder(results)
    settings = workflow.deployment_settings
    # the run's cores under the local executor; its local cores (login node) under Slurm
    plugin = workflow.executor_plugin
    local = plugin is not None and plugin.name == "local"
    resources = workflow.resource_settings
    build_partial(
        dict(config),
        output_paths(partial, study.config["study"]),
        partial=partial,
        n_planned=len(study.cells),
        snakefile=str(workflow.main_snakefile),
        allowed_rules=partial_rules(workflow),
        study_files=study_files,
        cores=(resources.cores if local else resources.local_cores) or 1,
        deployment=[str(method) for method in settings.deployment_method],
        conda_prefix=settings.conda_prefix and str(settings.conda_prefix),
        stopped_by=getattr(resume, "STOPPED_BY", None),
    )


def remove_partial_outputs(results: str) -> None:
    """onsuccess: the complete outputs supersede an earlier incomplete report."""
    shutil.rmtree(partial_folder(results), ignore_errors=True)


def say_where_the_report_is(workflow, out: dict[str, str]) -> None:
    """onsuccess: a run whose jobs hold the study's report ends naming the PDF, the tables and
    the figures (dlscale.workflow.finalize.report_message)."""
    from dlscale.workflow.finalize import report_message

    line = report_message(out, (f for job in workflow.dag.jobs for f in job.output))
    if line:
        print(line, file=sys.stderr)

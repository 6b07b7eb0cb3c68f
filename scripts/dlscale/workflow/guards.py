"""The checks the workflow makes when it is parsed, before any job is planned: each stops the run
with a message that names the fix, or says what the run will do. rules/common.smk calls each in
one line, passing what it needs (the workflow object, Snakemake's config, the study, its folders);
nothing here reads Snakemake's globals.

The configuration is read by dlscale, never by Snakemake's `configfile:` (which would evaluate a
`__use_yte__` template, i.e. run code from a study file): config/config.yaml, then
`--config study_file=...`, then the rest of --config; every file bounded and strict
(dlscale.study.config.load_config_file). Files given with --configfile are checked the same way.

The driver's own command line (dlscale.workflow.advice), read back with Snakemake's parser: a
message that suggests a setting prints this command with the setting in its one --config,
complete as printed.
"""

from __future__ import annotations

import os
import sys
from collections import Counter
from pathlib import Path
from typing import NamedTuple

from snakemake.exceptions import WorkflowError

from dlscale.outputs.tex import no_tex_notice, tex_missing
from dlscale.store.measurements import (
    REMEASURE_FLAG,
    changed_cells,
    describe_changes,
    keep_measured_launchers,
    launcher_refusal,
    measured_launcher_notice,
)
from dlscale.study.config import ConfigError
from dlscale.study.matrix import Study, inherited_notice, load_workflow_study
from dlscale.study.script_workload import edits_notice, environment_cells, split_script_edits
from dlscale.workflow.advice import Invocation, with_config, with_launcher, with_target
from dlscale.workflow.capability import environment_problems
from dlscale.workflow.finalize import PARTIAL_BUILD_ENV
from dlscale.workflow.resume_journal import previous_driver


def refused(message: str) -> WorkflowError:
    """The error that stops the workflow at parse time, before any job."""
    return WorkflowError(f"dlscale: {message}\nNo job was started.")


def is_driver(workflow) -> bool:
    """Snakemake's main process, outside the partial build a failed driver starts (that build
    has a command line of its own, and its driver has already said what the run will do)."""
    return workflow.is_main_process and PARTIAL_BUILD_ENV not in os.environ


def driver_invocation(workflow) -> Invocation | None:
    """The driver's command line (None outside the driver and where it does not read back). A
    --config (or --configfile) given twice is refused first: Snakemake keeps only the last, so
    the study or settings of the first would be dropped without a word."""
    invocation = Invocation.current() if is_driver(workflow) else None
    if invocation is not None and (repeated := invocation.repeated_options()):
        raise refused(repeated)
    return invocation


def study_files(workflow) -> list[str]:
    """The run's study files (--configfile). The partial build gives the failed run's files, then
    its resolved settings as one more file, which names no study (dlscale.workflow.finalize)."""
    files = [str(path) for path in workflow.overwrite_configfiles]
    return files[:-1] if PARTIAL_BUILD_ENV in os.environ else files


def parse_study(workflow, config: dict, files: list[str]) -> Study:
    """The study of Snakemake's `config` and the study `files`; a configuration problem stops
    the run. A study file takes no `workloads` from config/config.yaml; one that lists
    convergence and leaves keys of its `convergence` section out takes them from there, and the
    dry run and the driver's first lines say which (dlscale.study.matrix.inherited_notice)."""
    try:
        study = load_workflow_study(config, workflow.basedir, files)
    except ConfigError as exc:
        raise refused(str(exc)) from None
    if is_driver(workflow) and (inherited := inherited_notice(study)):
        print(f"dlscale: {inherited}", file=sys.stderr)
    return study


# The launcher must match the executor: a `--config ...` on the command line replaces the
# profile's whole `config:` list, so `--profile profiles/slurm --config remeasure=True` would
# drop the profile's launcher=srun and start every multi-node cell as local processes on the
# submit host. Checked against the executor the command line names (the profile's, for a dry run
# too), before anything is planned and before the cells' identities are compared (the launcher
# is part of a cell's identity: a wrong launcher must not read as a change to re-measure); again
# in `onstart` against the executor that really runs (dlscale.workflow.lifecycle, a run started
# through Snakemake's API).
def check_launcher_matches_executor(
    executor: str | None, study: Study, invocation: Invocation | None
) -> None:
    from dlscale.study.matrix_checks import launcher_problem

    problem = launcher_problem(
        executor,
        study.config["launcher"],
        in_allocation="SLURM_JOB_ID" in os.environ,
        command_with_launcher=lambda launcher: with_config(invocation, launcher=launcher),
    )
    if problem:
        raise refused(problem)


def check_command_line_launcher(invocation: Invocation | None, study: Study) -> None:
    """The launcher check against the executor the driver's command line names."""
    if invocation is not None:
        check_launcher_matches_executor(invocation.executor, study, invocation)


class MeasuredElsewhere(NamedTuple):
    """The measured cells whose launcher is not this run's (cell path -> the launcher it was
    measured with), and the study's launcher: the most common of theirs, else this run's."""

    launchers: dict[str, str]
    study_launcher: str


def keep_measured_cells(
    workflow, study: Study, invocation: Invocation | None, results: str
) -> MeasuredElsewhere:
    """A measured cell is never silently destroyed (dlscale.store.measurements): every existing
    measurement has a folder of its own before anything could remove its metrics.jsonl, and a
    cell measured with another configuration than the one planned now stops the run unless the
    user asks to re-measure it. Checked by the driver (not again inside each Slurm job).

    A study keeps the launcher it was measured with: its measured cells are planned with it
    (`study.cells` is replaced), so a run with another launcher (the local profile on a study
    measured with srun) rebuilds tables, figures and the report and measures nothing; a cell of
    it that such a run would measure stops it before any job
    (dlscale.workflow.lifecycle.check_study_launcher), with the command of the study's profile
    and launcher (dlscale.store.measurements.keep_measured_launchers)."""
    launcher = study.config["launcher"]
    if not workflow.is_main_process:
        return MeasuredElsewhere({}, launcher)
    if Path("results/runs").is_dir():
        print(
            "dlscale: results/runs/ holds cells in the layout before studies had their own "
            "results folders; they are not used. Move them (nothing is deleted) with: "
            "python -m dlscale.store.migrate",
            file=sys.stderr,
        )
    # A study survives its driver (dlscale.workflow.resume): the locks of a previous driver that
    # is gone are removed and named; a live one is named with its pid, host and command
    # (Snakemake's lock check then refuses this run). Not in the partial build that a failed
    # driver starts: that driver holds the study. Also in a dry run: Snakemake parses before it
    # knows the run is one (workflow.dryrun is False here), and a dead driver's locks are stale
    # either way.
    if PARTIAL_BUILD_ENV not in os.environ:
        for line in previous_driver(results):
            print(f"dlscale: {line}", file=sys.stderr)
    changed = changed_cells(study.cells)
    study.cells, measured, changed = keep_measured_launchers(study.cells, changed)
    # an edited script re-measures its cells, unasked (dlscale.study.script_workload)
    edited, changed = split_script_edits(changed)
    if edited:
        print(f"dlscale: {edits_notice(edited)}", file=sys.stderr)
    if measured:
        launcher = Counter(measured.values()).most_common(1)[0][0]
        notice = measured_launcher_notice(
            study.config["study"],
            measured,
            study.config["launcher"],
            with_launcher(invocation, launcher),
        )
        print(f"dlscale: {notice}", file=sys.stderr)
    remeasure = (
        with_launcher(invocation, launcher, remeasure=True)
        if measured
        else with_config(invocation, remeasure=True)
    )
    if changed and not study.config["remeasure"]:
        raise WorkflowError(f"dlscale: {describe_changes(changed, remeasure)}")
    elsewhere = [cell.path for cell, _ in changed if cell.path in measured]
    if elsewhere:  # remeasure=True would measure them with another launcher than theirs
        refusal = launcher_refusal(
            study.config["study"], measured, study.config["launcher"], elsewhere, remeasure
        )
        raise WorkflowError(f"dlscale: {refusal}")
    if changed:
        print(
            f"dlscale: re-measuring {len(changed)} changed cell(s) ({REMEASURE_FLAG}); "
            "their current measurements stay in their measurements/ folders",
            file=sys.stderr,
        )
    say_pack_plan(study, invocation, results)
    return MeasuredElsewhere(measured, launcher)


def say_pack_plan(study: Study, invocation: Invocation | None, results: str) -> None:
    """A dry run of a packed study on the Slurm route prints the packs the driver would submit:
    their nodes, time limits and the expected order of their steps (dlscale.workflow.packing)."""
    if invocation is None or not invocation.dry_run or invocation.executor != "dlscale":
        return
    from dlscale.workflow.packing import study_plan

    to_measure = [c for c in study.cells if not os.path.exists(c.path)]
    for line in study_plan(to_measure, study.hardware, study.config, f"{results}/runs"):
        print(f"dlscale: {line}", file=sys.stderr)


def check_environments(workflow, study: Study, environment_dir) -> None:
    """Every planned cell's environment must exist and drive its device
    (dlscale.workflow.capability: a GPU cell in a CPU build of its framework is refused here, on
    the login node, before any job or queue wait; dry runs included). Files are read, nothing is
    imported. `environment_dir(name)`: the folder of environment `name`
    (dlscale.workflow.job_params.Interpreters)."""
    problems = environment_problems(
        environment_cells(study.cells),  # a script cell: its environment's framework
        study.hardware,
        environment_dir,
        route=workflow.deployment_settings.deployment_method and "conda/apptainer" or "venv",
    )
    if problems:
        raise refused("\n".join(problems))


def say_if_tex_is_missing(
    workflow, out: dict[str, str], invocation: Invocation | None
) -> list[str]:
    """The TeX tools missing from PATH (dlscale.outputs.tex), looked for once, when the workflow
    is parsed: without them the PDF is no final target, and the run says so before its first
    job, naming the command that builds the PDF later (not again in the partial build a failed
    run starts)."""
    missing = tex_missing()
    if missing and is_driver(workflow):
        command = with_target(invocation, out["pdf"])
        print(no_tex_notice(missing, out["pdf"], out["tex"], command), file=sys.stderr)
    return missing

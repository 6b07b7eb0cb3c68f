# Load + validate the configuration, build the matrix once per workflow run, and provide the
# wildcard constraints, input functions and final targets. The logic lives in the dlscale
# package (scripts/dlscale/study/config.py, matrix.py) so it is unit-tested without Snakemake.
import functools
import importlib.resources
import inspect
import os
import re
import sys
from collections import Counter
from pathlib import Path

from snakemake.common import overwrite_function_params
from snakemake.exceptions import WorkflowError

from dlscale.workflow.capability import environment_problems
from dlscale.study.config import ConfigError
from dlscale.study.hardware import environment_variant
from dlscale.registry.frameworks import FRAMEWORKS, environments_dir
from dlscale.store.measurements import (
    REMEASURE_FLAG,
    adopt_unarchived,
    changed_cells,
    describe_changes,
    keep_measured_launchers,
    launcher_refusal,
    measured_launcher_notice,
)
from dlscale.study.cell import (
    CELL_PATTERNS,
    CELL_RULE_PREFIXES,
    DEFAULT_WORKLOAD,
    STUDY_DIR,
    TRAIN_LOG_PATTERNS,
    TRAIN_RULES,
    cell_pattern,
    key_of,
    train_log_pattern,
    train_rule,
)
from dlscale.study.matrix import inherited_notice, load_workflow_study
from dlscale.study.script_workload import (
    edits_notice,
    environment_cells,
    environments_of,
    figures_in_units,
    split_script_edits,
    units_of,
)
from dlscale.study.workloads import ranks_per_node
from dlscale.workflow.finalize import PARTIAL_BUILD_ENV
from dlscale.workflow.paths import output_paths, partial_folder
from dlscale.store.preflight_results import PREFLIGHT_DIR
from dlscale.workflow.resume_journal import previous_driver
from dlscale.workflow.advice import Invocation, with_config, with_launcher, with_target
from dlscale.outputs.tex import no_tex_notice, tex_missing

# The configuration is read by dlscale, never by Snakemake's `configfile:` (which would evaluate
# a `__use_yte__` template, i.e. run code from a study file): config/config.yaml, then
# `--config study_file=...`, then the rest of --config; every file bounded and strict
# (dlscale.study.config.load_config_file). Files given with --configfile are checked the same way.
#
# The driver's own command line (dlscale.workflow.advice), read back with Snakemake's parser: a
# message that suggests a setting prints this command with the setting in its one --config,
# complete as printed. A --config (or --configfile) given twice is refused first: Snakemake keeps
# only the last, so the study or settings of the first would be dropped without a word. (None
# in the partial build, which a failed driver starts with a command line of its own.)
INVOCATION = (
    Invocation.current()
    if workflow.is_main_process and PARTIAL_BUILD_ENV not in os.environ
    else None
)
if INVOCATION is not None and (_repeated := INVOCATION.repeated_options()):
    raise WorkflowError(f"dlscale: {_repeated}\nNo job was started.")
# The run's study files (--configfile). The partial build gives the failed run's files, then its
# resolved settings as one more file, which names no study (dlscale.workflow.finalize).
STUDY_FILES = [str(path) for path in workflow.overwrite_configfiles]
if PARTIAL_BUILD_ENV in os.environ:
    STUDY_FILES = STUDY_FILES[:-1]
try:
    STUDY = load_workflow_study(config, workflow.basedir, STUDY_FILES)
except ConfigError as exc:
    raise WorkflowError(f"dlscale: {exc}\nNo job was started.") from None
# A study file takes no `workloads` from config/config.yaml; one that lists convergence and
# leaves keys of its `convergence` section out takes them from there, and the dry run and the
# driver's first lines say which (dlscale.study.matrix.inherited_notice).
if workflow.is_main_process and PARTIAL_BUILD_ENV not in os.environ:
    if _inherited := inherited_notice(STUDY):
        print(f"dlscale: {_inherited}", file=sys.stderr)


# The launcher must match the executor: a `--config ...` on the command line replaces the
# profile's whole `config:` list, so `--profile profiles/slurm --config remeasure=True` would
# drop the profile's launcher=srun and start every multi-node cell as local processes on the
# submit host. Checked against the executor the command line names (the profile's, for a dry run
# too), before anything is planned and before the cells' identities are compared (the launcher
# is part of a cell's identity: a wrong launcher must not read as a change to re-measure); again
# in `onstart` against the executor that really runs (a run started through Snakemake's API).
def check_launcher_matches_executor(executor):
    from dlscale.study.matrix_checks import launcher_problem

    problem = launcher_problem(
        executor,
        STUDY.config["launcher"],
        in_allocation="SLURM_JOB_ID" in os.environ,
        command_with_launcher=lambda launcher: with_config(INVOCATION, launcher=launcher),
    )
    if problem:
        raise WorkflowError(f"dlscale: {problem}\nNo job was started.")


if INVOCATION is not None:
    check_launcher_matches_executor(INVOCATION.executor)

CELLS = STUDY.by_key()
# measured cell path -> the launcher it was measured with, where that is not this run's (the
# driver's, below)
MEASURED_LAUNCHERS = {}
STUDY_LAUNCHER = STUDY.config["launcher"]
# The study's own results folder: its cells, tables, figures, report and logs. Every output path
# is defined once, in dlscale.workflow.paths: OUT for the complete study, PARTIAL_OUT for the
# report of an incomplete one (results/<study>/partial/, the `partial` target below), RULE_OUT
# for the rules downstream of the cells, which write either by the `root` wildcard.
RESULTS = STUDY_DIR.format(study=STUDY.config["study"])
PARTIAL = partial_folder(RESULTS)
OUT = output_paths(RESULTS, STUDY.config["study"])
PARTIAL_OUT = output_paths(PARTIAL, STUDY.config["study"])
RULE_OUT = output_paths("{root}", STUDY.config["study"])
LOGS = OUT["logs"]

# A measured cell is never silently destroyed (dlscale.store.measurements): every existing measurement
# has a folder of its own before anything could remove its metrics.jsonl, and a cell measured
# with another configuration than the one planned now stops the run unless the user asks to
# re-measure it. Checked by the driver (not again inside each Slurm job).
if workflow.is_main_process:
    if Path("results/runs").is_dir():
        print(
            "dlscale: results/runs/ holds cells in the layout before studies had their own "
            "results folders; they are not used. Move them (nothing is deleted) with: "
            "python -m dlscale.store.migrate",
            file=sys.stderr,
        )
    # A study survives its driver (dlscale.workflow.resume): the locks of a previous driver that is gone
    # are removed and named; a live one is named with its pid, host and command (Snakemake's
    # lock check then refuses this run).
    # (not in the partial build that a failed driver starts: that driver holds the study).
    # Also in a dry run: Snakemake parses before it knows the run is one (workflow.dryrun is
    # False here), and a dead driver's locks are stale either way.
    if PARTIAL_BUILD_ENV not in os.environ:
        for _line in previous_driver(RESULTS):
            print(f"dlscale: {_line}", file=sys.stderr)
    _changed = changed_cells(STUDY.cells)
    # A study keeps the launcher it was measured with: its measured cells are planned with it,
    # so a run with another launcher (the local profile on a study measured with srun) rebuilds
    # tables, figures and the report and measures nothing; a cell of it that such a run would
    # measure stops it before any job (check_study_launcher), with the command of the study's
    # profile and launcher (dlscale.store.measurements.keep_measured_launchers).
    STUDY.cells, MEASURED_LAUNCHERS, _changed = keep_measured_launchers(STUDY.cells, _changed)
    # an edited script re-measures its cells, unasked (dlscale.study.script_workload)
    _edited, _changed = split_script_edits(_changed)
    if _edited:
        print(f"dlscale: {edits_notice(_edited)}", file=sys.stderr)
    CELLS = STUDY.by_key()
    if MEASURED_LAUNCHERS:
        STUDY_LAUNCHER = Counter(MEASURED_LAUNCHERS.values()).most_common(1)[0][0]
        print(
            "dlscale: "
            + measured_launcher_notice(
                STUDY.config["study"],
                MEASURED_LAUNCHERS,
                STUDY.config["launcher"],
                with_launcher(INVOCATION, STUDY_LAUNCHER),
            ),
            file=sys.stderr,
        )
    _remeasure = (
        with_launcher(INVOCATION, STUDY_LAUNCHER, remeasure=True)
        if MEASURED_LAUNCHERS
        else with_config(INVOCATION, remeasure=True)
    )
    if _changed and not STUDY.config["remeasure"]:
        raise WorkflowError(f"dlscale: {describe_changes(_changed, _remeasure)}")
    _elsewhere = [cell.path for cell, _ in _changed if cell.path in MEASURED_LAUNCHERS]
    if _elsewhere:  # remeasure=True would measure them with another launcher than theirs
        raise WorkflowError(
            "dlscale: "
            + launcher_refusal(
                STUDY.config["study"],
                MEASURED_LAUNCHERS,
                STUDY.config["launcher"],
                _elsewhere,
                _remeasure,
            )
        )
    if _changed:
        print(
            f"dlscale: re-measuring {len(_changed)} changed cell(s) ({REMEASURE_FLAG}); "
            "their current measurements stay in their measurements/ folders",
            file=sys.stderr,
        )
    # A dry run of a packed study on the Slurm route prints the packs the driver would submit:
    # their nodes, time limits and the expected order of their steps (dlscale.workflow.packing).
    if INVOCATION is not None and INVOCATION.dry_run and INVOCATION.executor == "dlscale":
        from dlscale.workflow.packing import study_plan

        _to_measure = [c for c in STUDY.cells if not os.path.exists(c.path)]
        for _line in study_plan(_to_measure, STUDY.hardware, STUDY.config, f"{RESULTS}/runs"):
            print(f"dlscale: {_line}", file=sys.stderr)


# Every planned cell's environment must exist and drive its device (dlscale.workflow.capability: a GPU
# cell in a CPU build of its framework is refused here, on the login node, before any job or
# queue wait; dry runs included). Files are read, nothing is imported. The environments live in
# .venvs/ or where DLSCALE_ENVS_DIR says (dlscale.registry.frameworks.environments_dir), as
# scripts/setup.sh built them; a job gets its environment's interpreter by its absolute path.
ENVIRONMENTS = environments_dir(workflow.basedir)


def _environment_dir(name):
    return None if name is None else ENVIRONMENTS / name


_problems = environment_problems(
    environment_cells(STUDY.cells),  # a script cell: its environment's framework
    STUDY.hardware,
    _environment_dir,
    route=workflow.deployment_settings.deployment_method and "conda/apptainer" or "venv",
)
if _problems:
    raise WorkflowError("dlscale: " + "\n".join(_problems) + "\nNo job was started.")


def _alternatives(values):
    return "|".join(re.escape(str(v)) for v in values)


# Every wildcard matches only configured values: nothing else can reach a shell line. `root`:
# the folder a rule downstream of the cells writes (RULE_OUT), the study's or its partial one.
wildcard_constraints:
    **{
        **{axis: _alternatives(values) for axis, values in STUDY.axis_values().items()},
        "root": _alternatives([RESULTS, PARTIAL]),
    },


# A train job's params are functions of its wildcards (below). Snakemake asks a params function's
# signature at each of its calls, three times per job (inspect.signature: ~60,000 calls in the
# dry run of a 10,000-cell study); its own hook snakemake.common.overwrite_function_params
# hands it the signature once (the same mapping, so the same arguments are passed).
def per_job(func):
    overwrite_function_params(func, inspect.signature(func).parameters)
    return func


def cell_of(wildcards, workload=DEFAULT_WORKLOAD):
    """The Cell a job's wildcards name (the wildcards of a workload's train rule: ranks per
    node only where the cell's path names them, else its hardware's default); excluded or
    unknown combinations are refused."""
    default_ranks = ranks_per_node(STUDY.config, STUDY.hardware[wildcards.hardware])
    try:
        return CELLS[key_of(dict(wildcards), workload, default_ranks)]
    except KeyError:
        raise WorkflowError(
            f"dlscale: {dict(wildcards)} is not a {workload} cell of this study "
            "(excluded, or outside the configured axes)"
        ) from None


@per_job
def cell_json(wildcards):
    """The cell, serialised whole: the launcher's one input (dlscale.study.cell.Cell.to_json)."""
    return cell_of(wildcards).to_json()


@per_job
def convergence_cell_json(wildcards):
    """A convergence cell, serialised whole (the convergence train rules' one parameter)."""
    return cell_of(wildcards, "convergence").to_json()


@per_job
def script_cell_json(wildcards):
    """A script cell, serialised whole (the script train rules' one parameter)."""
    return cell_of(wildcards, "script").to_json()


# The parameter of each workload's train rules (rules/train.smk).
CELL_JSON = {
    "throughput": cell_json,
    "convergence": convergence_cell_json,
    "script": script_cell_json,
}


# The shipped real data (rules/data.smk writes it): one copy per format under results/data/,
# shared by every study.
from dlscale.data import FORMATS as DATA_FORMATS

SHIPPED_DIGITS = "results/data/digits"


def shipped_data(data_format):
    """The shipped digits in `data_format` (one of dlscale.data.FORMATS) as a job's input:
    marked ancient, so rewriting them (e.g. after rules/data.smk changes) never re-runs the
    cells that read them."""
    if data_format not in DATA_FORMATS:
        raise WorkflowError(
            f"dlscale: no shipped data in format {data_format!r}; "
            f"allowed: {', '.join(DATA_FORMATS)}"
        )
    return ancient(f"{SHIPPED_DIGITS}/{data_format}")


def train_inputs(workload):
    """What a workload's train rules read besides their cell: a convergence cell's dataset
    (a shipped one is written by the shipped_digits job of rules/data.smk and read through
    shipped_data(), an ancient input)."""
    if workload != "convergence":
        return {}
    from dlscale.study.workloads import SHIPPED_DATASETS, data_path

    conv = STUDY.config["convergence"]
    if conv["dataset"] in SHIPPED_DATASETS:
        return {"data": shipped_data(conv["data_format"])}
    return {"data": data_path(STUDY.config)}


@per_job
def framework_python(wildcards):
    """Interpreter of the cell's framework environment for its hardware's variant: the driver
    venv for PyTorch's CPU build, else <environments>/<env>/bin/python (.venvs/ or
    $DLSCALE_ENVS_DIR; built by scripts/setup.sh from envs/<env>.txt; <env>-cuda for GPU
    hardware; a float8 cell's <env>-float8, with torchao: dlscale.study.matrix.float8_environment;
    a model of the study's `models:` section: its own environment, dlscale.study.study_models)."""
    own = _study_model_python(wildcards.hardware, wildcards.model)
    if own is not None:
        return own
    return _framework_python(wildcards.hardware, wildcards.framework, wildcards.precision)


@functools.cache
def _study_model_python(hardware, model):
    from dlscale.study.study_models import model_python

    return model_python(STUDY, hardware, model, workflow.basedir)


# A script's label (its cells' framework) -> the framework whose environment it runs in
# (dlscale.study.script_workload).
SCRIPT_ENVIRONMENTS = environments_of(STUDY.config)


def script_conda_env(wildcards):
    """The conda environment of a script cell under --sdm conda: its environment's
    (envs/<framework>.yaml of the framework it runs in)."""
    env = SCRIPT_ENVIRONMENTS.get(wildcards.framework, wildcards.framework)
    return str(Path(workflow.basedir) / "envs" / f"{env}.yaml")


@functools.cache
def _framework_python(hardware, framework, precision=None):
    # once per (hardware, framework), not once per job: a 10,000-cell dry run asks 10,000 times
    from dlscale.study.matrix import float8_environment

    entry = STUDY.hardware[hardware]
    framework = SCRIPT_ENVIRONMENTS.get(framework, framework)  # a script's: its environment
    env = FRAMEWORKS[framework].environment_for(environment_variant(entry), entry)
    if precision == "float8" and "float8" in FRAMEWORKS[framework].capabilities:
        env = float8_environment(env)
    if env is None:
        return sys.executable
    return str(_environment_dir(env) / "bin" / "python")


# The launcher check for a run started without the `snakemake` command (Snakemake's API: no
# command line to read the executor from), against the executor that really runs the jobs:
# the workflow's `onstart` handler, before the first job. A command-line run was checked above.
def check_launcher_of_the_run():
    plugin = workflow.executor_plugin
    if plugin is not None and workflow.is_main_process and INVOCATION is None:
        check_launcher_matches_executor(plugin.name)
    check_study_launcher()


# A study measured with another launcher than this run's (MEASURED_LAUNCHERS) is rebuilt here,
# never measured: a cell job this run would start (a --forcerun of a cell, a cell not measured
# yet) stops it before the first job, with the command of the study's profile and launcher. In
# `onstart`, where the jobs to run are known (a dry run lists them, and the notice above says it).
def check_study_launcher():
    if not MEASURED_LAUNCHERS or not workflow.is_main_process:
        return
    measuring = [
        str(path)
        for job in workflow.dag.needrun_jobs()
        if job.rule.name.startswith(CELL_RULE_PREFIXES)
        for path in job.output
    ]
    elsewhere = [p for p in measuring if p in MEASURED_LAUNCHERS or not os.path.exists(p)]
    if elsewhere:
        raise WorkflowError(
            "dlscale: "
            + launcher_refusal(
                STUDY.config["study"],
                MEASURED_LAUNCHERS,
                STUDY.config["launcher"],
                elsewhere,
                with_launcher(INVOCATION, STUDY_LAUNCHER),
            )
        )


# Existing metrics files without a measurement folder of their own (the layout before
# dlscale.store.measurements) get one before the first job could remove them: in `onstart`,
# which Snakemake runs only for a real run with jobs to do, before any job (at parse time a dry
# run cannot be told from a real one, and a dry run writes nothing).
def adopt_measurements():
    if workflow.is_main_process:
        adopt_unarchived(cell.path for cell in STUDY.cells)


# The driver records itself and, under the project's executor plugin (`executor: dlscale`,
# snakemake_executor_plugin_dlscale: the official Slurm executor subclassed), starts resume:
# adopts the jobs an earlier driver of the study left queued or running, journals every
# submission and handles SIGHUP/SIGINT/SIGTERM (dlscale.workflow.resume), and packs the cells
# into allocations with config `pack` (dlscale.workflow.packing). The plugin itself has
# each cell's job run its launcher with no Snakemake inside the allocation
# (dlscale.workflow.jobstep). The workflow's `onstart`, after the launcher check, before any job.
def start_driver():
    if not workflow.is_main_process:
        return
    from dlscale.workflow import preflight
    from dlscale.workflow.resume import start

    start(
        workflow,
        RESULTS,
        STUDY.config["restart"],
        metrics_files(),
        STUDY.config["pack"],
        STUDY.config["pack_steps"],
    )
    # each (hardware entry, environment) checked by one short job that holds its cells
    # (dlscale.workflow.preflight; `--config preflight=False` skips it)
    preflight.start(
        workflow,
        RESULTS,
        STUDY.config,
        environment_cells(STUDY.cells),  # a script cell: its environment's framework
        STUDY.hardware,
        _framework_python,
    )


def metrics_files():
    return [cell.path for cell in STUDY.cells]


def report_title():
    return STUDY.config["report"]["title"] or f"Scaling study: {STUDY.config['study']}"


def report_title_param(wildcards):
    """The title as a params function: Snakemake formats a plain string param as a pattern,
    so a title with `{word}` would be read as a wildcard. The partial report says so."""
    return report_title() + (" (incomplete)" if is_partial(wildcards) else "")


# The template the report is rendered from (inside the installed dlscale package): an input of
# report_tex, so editing it regenerates the report.
REPORT_TEMPLATE = str(importlib.resources.files("dlscale") / "templates" / "report.tex.j2")


# The partial report: when cells failed (or the run stopped), the Snakefile's `onerror` runs the
# `partial` target with the same rules (dlscale.workflow.finalize.build_partial: a second
# snakemake on the local executor, same Snakefile and configuration): collect reads the cells
# whose metrics exist and lists the others as failed or missing; only the rules downstream of
# the cells may run, never a cell's (partial_rules()).
def is_partial(wildcards):
    return wildcards.root == PARTIAL


def outputs_of(wildcards):
    """The output paths (dlscale.workflow.paths) of the folder a downstream job writes."""
    return PARTIAL_OUT if is_partial(wildcards) else OUT


def collect_metrics(wildcards):
    """collect's cells: every planned cell; the partial build's: those whose metrics exist."""
    if is_partial(wildcards):
        return [path for path in metrics_files() if os.path.exists(path)]
    return metrics_files()


def partial_rules():
    """The rules the partial build may run: all but those that measure a cell or write its
    data, so it only ever reads the cells that exist."""
    names = [r.name for r in workflow.rules]
    return [n for n in names if not n.startswith(CELL_RULE_PREFIXES) and n != "shipped_digits"]


def build_partial_report():
    """onerror: the `partial` target (results/<study>/partial/) by the workflow's own rules."""
    from dlscale.workflow import resume
    from dlscale.workflow.finalize import build_partial

    settings = workflow.deployment_settings
    # the run's cores under the local executor; its local cores (login node) under Slurm
    plugin = workflow.executor_plugin
    local = plugin is not None and plugin.name == "local"
    resources = workflow.resource_settings
    build_partial(
        dict(config),
        PARTIAL_OUT,
        partial=PARTIAL,
        n_planned=len(STUDY.cells),
        snakefile=str(workflow.main_snakefile),
        allowed_rules=partial_rules(),
        study_files=STUDY_FILES,
        cores=(resources.cores if local else resources.local_cores) or 1,
        deployment=[str(method) for method in settings.deployment_method],
        conda_prefix=settings.conda_prefix and str(settings.conda_prefix),
        stopped_by=getattr(resume, "STOPPED_BY", None),
    )


def remove_partial_outputs():
    """onsuccess: the complete outputs supersede an earlier incomplete report."""
    import shutil

    shutil.rmtree(PARTIAL, ignore_errors=True)


def say_where_the_report_is():
    """onsuccess: a run whose jobs hold the study's report ends naming the PDF, the tables and
    the figures (dlscale.workflow.finalize.report_message)."""
    from dlscale.workflow.finalize import report_message

    line = report_message(OUT, (f for job in workflow.dag.jobs for f in job.output))
    if line:
        print(line, file=sys.stderr)


# Figures: a bounded set of files per hardware key, computed here from the planned cells so
# Snakemake knows every file at parse time (dlscale.outputs.figure_layout.figure_layout: one family per
# hardware, one panel per model x batch policy, at most MAX_PANELS panels per file and
# MAX_SERIES framework x precision series per panel; larger studies split into numbered parts).
# FIGURE_LAYOUT is also the report's figure list (file relative to the figures folder, caption,
# hardware, width), for the complete and the partial report alike.

from dlscale.outputs.figure_layout import (
    CONVERGENCE_FIGURE_NAME_PATTERN,
    FIGURE_NAME_PATTERN,
    convergence_layout,
    figure_layout,
    variant,
)

FIGURE_LAYOUT = figure_layout(
    [
        (c.hardware, c.framework, c.model, c.policy, variant(c.precision, c.mode, c.parallelism))
        # the scaling figures' cells: throughput cells and a user's script's (in its unit)
        for c in STUDY.cells_of("throughput") + STUDY.cells_of("script")
    ],
    column_width_in=STUDY.config["report"]["column_width_in"],
    plan=STUDY.config["plan"],  # how far the predicted extensions reach (captions)
    devices={hw: STUDY.hardware[hw]["device"] for hw in STUDY.config["axes"]["hardware"]},
)
FIGURE_LAYOUT = figures_in_units(FIGURE_LAYOUT, units_of(STUDY.config))  # scripts' units
FIGURE_SPECS = {spec["file"]: spec for spec in FIGURE_LAYOUT}
# The convergence workload's figures (time-to-accuracy, epochs-to-accuracy, validation
# accuracy curves), in their own folder per hardware key (dlscale.outputs.figure_layout.convergence_layout).
CONVERGENCE_LAYOUT = convergence_layout(
    [
        (c.hardware, c.framework, c.model, c.policy, variant(c.precision, c.mode))
        for c in STUDY.cells_of("convergence")
    ],
    column_width_in=STUDY.config["report"]["column_width_in"],
)
CONVERGENCE_SPECS = {spec["file"]: spec for spec in CONVERGENCE_LAYOUT}


def figure_files(out=OUT):
    """Every figure file of the study (final targets, report inputs)."""
    return [f"{out['figures']}/{spec['file']}" for spec in FIGURE_LAYOUT]


def figure_spec(wildcards):
    """The layout entry (panels, series, size) of one figure file."""
    file = f"{wildcards.hardware}/{wildcards.figure}.pdf"
    try:
        return FIGURE_SPECS[file]
    except KeyError:
        raise WorkflowError(
            f"dlscale: {OUT['figures']}/{file} is not a figure of this study; "
            f"its figures: {', '.join(FIGURE_SPECS)}"
        ) from None


def convergence_figure_files(out=OUT):
    """Every convergence figure file of the study."""
    return [f"{out['figures']}/{spec['file']}" for spec in CONVERGENCE_LAYOUT]


def report_figures(wildcards):
    """report_pdf's figures, in the folder it writes."""
    out = outputs_of(wildcards)
    return figure_files(out) + convergence_figure_files(out)


def convergence_figure_spec(wildcards):
    """The layout entry of one convergence figure file."""
    file = f"{wildcards.hardware}/convergence/{wildcards.figure}.pdf"
    try:
        return CONVERGENCE_SPECS[file]
    except KeyError:
        raise WorkflowError(
            f"dlscale: {OUT['figures']}/{file} is not a convergence figure of this study; "
            f"its convergence figures: {', '.join(CONVERGENCE_SPECS) or 'none'}"
        ) from None


def report_attachment(out=OUT):
    """The cell table as the report's LaTeX sees it (relative to the report's folder)."""
    return os.path.relpath(out["cells"], os.path.dirname(out["tex"]))


# What report.pdf is compiled from besides the tables and figures (rules/report.smk): final
# targets too, so a run without TeX still leaves a report a TeX installation can compile.
REPORT_SOURCES = (
    "tex",
    "macros",
    "cells_table",
    "memory_table",
    "quarantine_table",
    "status_table",
    "systems_table",
    "convergence_table",
    "script_section",  # the script workload's (dlscale.outputs.script_section)
    "verdicts_table",  # rules/check.smk
    "plan_macros",  # the Recommendations section (rules/plan.smk)
    "plan_tables",
    "plan_figure",
    "history_tex",  # the History section (rules/history.smk)
)


def report_sources(out):
    return {name: out[name] for name in REPORT_SOURCES}


# TeX (latexmk, pdflatex; dlscale.outputs.tex) is looked for once, when the workflow is parsed:
# without it the PDF is no final target, and the run says so before its first job, naming the
# command that builds the PDF later (not again in the partial build a failed run starts).
TEX_MISSING = tex_missing()
if TEX_MISSING and workflow.is_main_process and PARTIAL_BUILD_ENV not in os.environ:
    print(
        no_tex_notice(TEX_MISSING, OUT["pdf"], OUT["tex"], with_target(INVOCATION, OUT["pdf"])),
        file=sys.stderr,
    )


def final_targets(out=OUT):
    """What `all` builds (out=OUT) and the `partial` target (out=PARTIAL_OUT): the same files;
    the PDF only where TeX is on PATH."""
    return [
        out["ranks"],
        out["cells"],
        out["scaling"],
        out["status"],
        out["systems"],
        out["verdicts"],
        *figure_files(out),
        out["convergence"],
        out["epochs"],
        out["time_to_accuracy"],
        *convergence_figure_files(out),
        out["plan"],  # rules/plan.smk
        *report_sources(out).values(),
        *([] if TEX_MISSING else [out["pdf"]]),
    ]


# ---- Results database ----------------------------------------------------------------------
# The database's URL is config `database`; the history rule and the driver's recorder
# (dlscale.workflow.recorder) read it here (rules/history.smk).
from dlscale.store.database import pending_path, resolve_url
from dlscale.workflow import recorder

DATABASE_URL = resolve_url(STUDY.config["database"], "results")
HISTORY = STUDY.config["history"]


def database_pending(wildcards):
    """The study's pending marker where it exists (rows waiting for the database)."""
    path = pending_path(RESULTS)
    return [str(path)] if path.exists() else []


def start_recorder():
    """onstart: the driver writes each cell's row as it lands (not in the partial build, whose
    driver already records)."""
    if workflow.is_main_process and PARTIAL_BUILD_ENV not in os.environ:
        recorder.start(DATABASE_URL, RESULTS, metrics_files())


def stop_recorder():
    """onsuccess / onerror: the recorder's last pass."""
    if workflow.is_main_process:
        recorder.stop()


def check_history_inputs():
    """The history verdicts the `check` target judges by (config history.check)."""
    return [OUT["history_verdicts"]] if HISTORY["check"] != "references" else []

# The study, parsed once per workflow run: its validation, the wildcard constraints, the input
# and params functions and the final targets. The logic lives in the dlscale package, unit-tested
# without Snakemake: the study (dlscale.study.config, matrix), the parse-time checks
# (dlscale.workflow.guards), the driver's hooks the Snakefile calls (dlscale.workflow.lifecycle).
import importlib.resources
import os
import re

from snakemake.exceptions import WorkflowError

from dlscale.outputs.snakemake_report import table_caption, table_category, table_labels
from dlscale.store.database import pending_path, resolve_url
from dlscale.study.cell import STUDY_DIR, key_of
from dlscale.study.workloads import ranks_per_node
from dlscale.workflow import guards, lifecycle
from dlscale.workflow.figure_files import StudyFigures
from dlscale.workflow.job_params import Interpreters, cell_json_param, per_job, train_inputs
from dlscale.workflow.paths import output_paths, partial_folder, report_sources

# The run's command line and study (dlscale.workflow.guards: a repeated --config, a bad study
# file or a launcher the executor cannot run stops the run here, before any job).
INVOCATION = guards.driver_invocation(workflow)
STUDY_FILES = guards.study_files(workflow)
STUDY = guards.parse_study(workflow, config, STUDY_FILES)
guards.check_command_line_launcher(INVOCATION, STUDY)
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
# Measured cells are never silently destroyed nor re-measured with another launcher.
MEASURED = guards.keep_measured_cells(workflow, STUDY, INVOCATION, RESULTS)
CELLS = STUDY.by_key()
PYTHONS = Interpreters(STUDY, workflow.basedir)  # each cell's environment and its interpreter
guards.check_environments(workflow, STUDY, PYTHONS.environment_dir)


def _alternatives(values):
    return "|".join(re.escape(str(v)) for v in values)


# Every wildcard matches only configured values: nothing else can reach a shell line. `root`:
# the folder a rule downstream of the cells writes (RULE_OUT), the study's or its partial one.
wildcard_constraints:
    **{
        **{axis: _alternatives(values) for axis, values in STUDY.axis_values().items()},
        "root": _alternatives([RESULTS, PARTIAL]),
    },


def cell_of(wildcards, workload):
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


# The parameter of each workload's train rules (rules/train.smk): its cell's JSON.
CELL_JSON = {
    workload: cell_json_param(cell_of, workload)
    for workload in ("throughput", "convergence", "script")
}


@per_job
def framework_python(wildcards):
    """Interpreter of the cell's environment (dlscale.workflow.job_params.Interpreters): a
    model of the study's `models:` section has its own, else its framework's for its hardware's
    variant and precision."""
    own = PYTHONS.model_python(wildcards.hardware, wildcards.model)
    if own is not None:
        return own
    return PYTHONS.framework_python(wildcards.hardware, wildcards.framework, wildcards.precision)


def script_conda_env(wildcards):
    """The conda environment of a script cell under --sdm conda: its environment's."""
    return PYTHONS.conda_env(wildcards.framework)


def metrics_files():
    return [cell.path for cell in STUDY.cells]


def report_title_param(wildcards):
    """The title as a params function: Snakemake formats a plain string param as a pattern,
    so a title with `{word}` would be read as a wildcard. The partial report says so."""
    title = STUDY.config["report"]["title"] or f"Scaling study: {STUDY.config['study']}"
    return title + (" (incomplete)" if is_partial(wildcards) else "")


# The template the report is rendered from (inside the installed dlscale package): an input of
# report_tex, so editing it regenerates the report.
REPORT_TEMPLATE = str(importlib.resources.files("dlscale") / "templates" / "report.tex.j2")


# The partial report (the Snakefile's `onerror`, dlscale.workflow.lifecycle): the same rules
# write into PARTIAL; collect reads the cells whose metrics exist and lists the others.
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


def table_report(name):
    """A table of collect or verdicts as an output in Snakemake's report, filed and captioned
    by dlscale.outputs.snakemake_report."""
    caption, category, labels = table_caption(name), table_category(name), table_labels(name)
    return report(RULE_OUT[name], caption=caption, category=category, labels=labels)


# The figure files, from the planned cells (dlscale.workflow.figure_files); each layout is also
# the report's figure list.
FIGURES = StudyFigures(STUDY, OUT["figures"])
FIGURE_LAYOUT, CONVERGENCE_LAYOUT = FIGURES.layout, FIGURES.convergence_layout


def figure_spec(wildcards):
    return FIGURES.spec(wildcards.hardware, wildcards.figure)


def convergence_figure_spec(wildcards):
    return FIGURES.convergence_spec(wildcards.hardware, wildcards.figure)


def report_figures(wildcards):
    """report_pdf's figures, in the folder it writes."""
    out = outputs_of(wildcards)
    return FIGURES.files(out) + FIGURES.convergence_files(out)


def report_attachment(out=OUT):
    """The cell table as the report's LaTeX sees it (relative to the report's folder)."""
    return os.path.relpath(out["cells"], os.path.dirname(out["tex"]))


# Without TeX on PATH the PDF is no final target, and the run says so first.
TEX_MISSING = guards.say_if_tex_is_missing(workflow, OUT, INVOCATION)


def final_targets(out=OUT):
    """What `all` builds (out=OUT) and the `partial` target (out=PARTIAL_OUT): the same files;
    the PDF only where TeX is on PATH."""
    return [
        *(out[name] for name in ("ranks", "cells", "scaling", "status", "systems", "verdicts")),
        *FIGURES.files(out),
        *(out[name] for name in ("convergence", "epochs", "time_to_accuracy")),
        *FIGURES.convergence_files(out),
        out["plan"],  # rules/plan.smk
        *report_sources(out).values(),  # dlscale.workflow.paths.REPORT_SOURCES
        *([] if TEX_MISSING else [out["pdf"]]),
    ]


# The results database (config `database`), read by the history rule and the driver's recorder
# (rules/history.smk, dlscale.workflow.recorder).
DATABASE_URL = resolve_url(STUDY.config["database"], "results")
HISTORY = STUDY.config["history"]


def database_pending(wildcards):
    """The study's pending marker where it exists (rows waiting for the database)."""
    path = pending_path(RESULTS)
    return [str(path)] if path.exists() else []


def check_history_inputs():
    """The history verdicts the `check` target judges by (config history.check)."""
    return [OUT["history_verdicts"]] if HISTORY["check"] != "references" else []

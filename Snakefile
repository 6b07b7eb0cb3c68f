# dlscale: how well does distributed training of model M scale with framework F on hardware H?
# The study lives in config/config.yaml (experiment facts) and config/hardware.yaml (site facts);
# how jobs run lives in profiles/ (local: embedded default; slurm: the cluster route).
from snakemake.utils import min_version

min_version("9.0")


# Snakemake's own report (`snakemake --profile profiles/local --report results/<study>/report.zip`,
# each study its own): figures, tables, per-cell status and provenance, verdicts and the PDF,
# captions in report/.
report: "report/workflow.rst"


# config/config.yaml is read by rules/common.smk (dlscale.study.matrix.workflow_config), not by a
# `configfile:` directive: Snakemake's reader would evaluate a `__use_yte__` template.
include: "rules/common.smk"
include: "rules/data.smk"
include: "rules/train.smk"
include: "rules/collect.smk"
include: "rules/plan.smk"
include: "rules/figures.smk"
include: "rules/report.smk"
include: "rules/archive.smk"
include: "rules/history.smk"
include: "rules/check.smk"


# Only `train` jobs go to the scheduler; aggregation, figures and the report run where
# Snakemake runs.
localrules:
    all,
    shipped_digits,
    collect,
    scaling_model,
    plan,
    figure,
    convergence_figure,
    report_inputs,
    report_tex,
    report_pdf,
    study_archive,
    verdicts,
    history,
    check,
    compare,
    partial,


# A study with failed cells still ends with tables, figures and a report of what exists: the
# `partial` target, built by the same rules into results/<study>/partial/ (failed and missing
# cells listed; dlscale.workflow.lifecycle.build_partial_report); rerunning retries only those
# cells. A `check` that found FAIL verdicts fails the run on purpose with the study complete: no
# partial build then (rules/check.smk).
onerror:
    lifecycle.stop_recorder(workflow)
    if not failed_since(CHECK_LOG, CHECK_PARSED_AT):
        lifecycle.build_partial_report(workflow, config, STUDY, RESULTS, STUDY_FILES)


# The launcher must match the executor (launcher=srun under the Slurm executor): checked before
# the first job. Measurements from before their folders existed get one. Then the driver records
# itself and resumes the jobs an earlier driver of the study left behind (dlscale.workflow.resume,
# README "Resume"). From then on it writes each cell's row into the results database as the
# cell's metrics land, and the rows it lacks (rules/history.smk). Each step:
# dlscale.workflow.lifecycle.
onstart:
    lifecycle.check_launcher_of_the_run(workflow, STUDY, INVOCATION, MEASURED)
    lifecycle.adopt_measurements(workflow, STUDY)
    lifecycle.start_driver(workflow, STUDY, RESULTS, PYTHONS.framework_python)
    lifecycle.start_recorder(workflow, DATABASE_URL, RESULTS, STUDY)


onsuccess:
    lifecycle.remove_partial_outputs(RESULTS)
    lifecycle.stop_recorder(workflow)
    lifecycle.say_where_the_report_is(workflow, OUT)


rule all:
    default_target: True
    input:
        final_targets(),


# The report of the cells that exist, by the same rules as `all`, into results/<study>/partial/
# (the onerror handler builds it after failed cells; `snakemake partial --allowed-rules ...`
# by hand, see docs/pages/failures.md).
rule partial:
    input:
        final_targets(PARTIAL_OUT),

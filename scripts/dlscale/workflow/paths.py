"""Every output path of a study, in one place: the tables, figures, plan, report and logs that the
rules downstream of the cells write, and the study's archive.

`output_paths(folder, study)` is the one definition; rules/common.smk calls it three times:
  - OUT: the complete study's outputs under results/<study>/ (the final targets);
  - PARTIAL_OUT: the same files under results/<study>/partial/, the report of a study whose
    cells did not all succeed (the `partial` target, rules/common.smk; its build,
    dlscale.workflow.lifecycle);
  - RULE_OUT: the same files under `{root}`, the patterns the downstream rules write, so one set
    of rules builds both (the `root` wildcard is constrained to the two folders).
No rule file adds keys: a path is added here or nowhere. `report_sources(out)`: the report's
sources among them (REPORT_SOURCES), final targets and inputs of report.pdf.
"""

from __future__ import annotations

# The study archive's folder and log, relative to the study's results folder
# (dlscale.store.study_archive).
from dlscale.store.study_archive import ARCHIVE_DIR, ARCHIVE_LOG

# The folder, inside a study's results folder, of the report of an incomplete study: beside, never
# over, the complete outputs, so Snakemake never mistakes it for up to date and the next run
# retries the missing cells.
PARTIAL_DIR = "partial"


def partial_folder(results: str) -> str:
    """Where the partial report of the study at `results` goes."""
    return f"{results}/{PARTIAL_DIR}"


def output_paths(folder: str, study: str) -> dict[str, str]:
    """Every output path under `folder` (a study's results folder, its partial folder, or the
    rules' `{root}` pattern), by name."""
    tables = f"{folder}/tables"
    report = f"{folder}/report"
    plan = f"{folder}/plan"
    logs = f"{folder}/logs"
    return {
        "logs": logs,
        # rules/collect.smk (dlscale.analysis.collect)
        "ranks": f"{tables}/ranks.csv",
        "cells": f"{tables}/cells.csv",
        "scaling": f"{tables}/scaling.csv",
        "quarantine": f"{tables}/quarantine.csv",
        "status": f"{tables}/status.csv",
        "systems": f"{tables}/systems.csv",
        # the convergence workload's tables (dlscale.analysis.time_to_accuracy)
        "convergence": f"{tables}/convergence.csv",
        "epochs": f"{tables}/epochs.csv",
        "time_to_accuracy": f"{tables}/time_to_accuracy.csv",
        # rules/plan.smk: the scaling model and the plan
        "model_fit": f"{tables}/model_fit.csv",
        "predictions": f"{tables}/predictions.csv",
        "plan": f"{plan}/plan.csv",
        "plan_alternatives": f"{plan}/alternatives.csv",
        "plan_constraints": f"{plan}/constraints.csv",
        "plan_figure": f"{plan}/plan.pdf",
        "plan_macros": f"{report}/plan_macros.tex",
        "plan_tables": f"{report}/plan_tables.tex",
        # rules/figures.smk: {figures}/{hardware}/{figure}.pdf and .../convergence/{figure}.pdf
        "figures": f"{folder}/figures",
        # rules/report.smk
        "convergence_table": f"{report}/convergence_table.tex",
        "macros": f"{report}/macros.tex",
        "cells_table": f"{report}/cells_table.tex",
        "memory_table": f"{report}/memory_table.tex",
        "quarantine_table": f"{report}/quarantine_table.tex",
        "status_table": f"{report}/status_table.tex",
        "systems_table": f"{report}/systems_table.tex",
        # the script workload's section (dlscale.outputs.script_section)
        "script_section": f"{report}/script_section.tex",
        # the regression check against config/references.yaml (rules/check.smk)
        "verdicts": f"{tables}/verdicts.csv",
        "verdicts_table": f"{report}/verdicts_table.tex",
        # published figures (config/references.yaml `published:`; dlscale.decisions.published)
        "published": f"{tables}/published.csv",
        # the study's history in the results database (rules/history.smk,
        # dlscale.decisions.history_report): every run of its series, its verdicts against
        # them, the trend figure and the report's History section
        "history_table": f"{folder}/history/history.csv",
        "history_verdicts": f"{folder}/history/verdicts.csv",
        "history_figure": f"{folder}/history/history.pdf",
        "history_tex": f"{report}/history.tex",
        "tex": f"{report}/report.tex",
        "pdf": f"{report}/report.pdf",
        "pdf_log": f"{logs}/report_pdf.log",
        # the study's archive (rules/archive.smk; not a final target, asked for by name)
        "archive": f"{folder}/{ARCHIVE_DIR}/{study}.tar.gz",
        "archive_checksum": f"{folder}/{ARCHIVE_DIR}/{study}.tar.gz.sha256",
        "archive_log": f"{folder}/{ARCHIVE_LOG}",
    }


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


def report_sources(out: dict[str, str]) -> dict[str, str]:
    """The report's sources among `out` (output_paths), by name."""
    return {name: out[name] for name in REPORT_SOURCES}

# Regression references and verdicts (dlscale.decisions.regression_check) and the comparison of two studies
# (dlscale.decisions.compare).
#
# verdicts: the study's scaling table against config/references.yaml (the study's
#   `references_file`) -> tables/verdicts.csv and the report's Regression check section. A final
#   target: it never fails on a FAIL verdict, so the report shows it.
# check: asked for by name (`snakemake --profile profiles/local check`): prints the verdicts and
#   exits 1 on any FAIL (cron, CI); with config history.check also (or only) the verdicts
#   against the study's history in the results database (rules/history.smk).
#   `python -m dlscale.decisions.regression_check results/<study>` does the same from a
#   results folder; `python -m dlscale.decisions.regression_check bless ...` records references.
# compare: `snakemake --profile profiles/local results/<study>/compare/<other study>/summary.md`
#   compares this study (B) with another study's results folder (A) cell by cell.
import time
from pathlib import Path

from dlscale.study.config import ConfigError
from dlscale.study.references import failed_since, load_references
from dlscale.study.references import schema_path as references_schema_path

# (as the jobs name them: relative to the working directory, so a checkout moved or copied
# elsewhere does not count as changed inputs and params, which would redo the verdicts)
REFERENCES_PATH = os.path.relpath(Path(workflow.basedir) / STUDY.config["references_file"])
REFERENCES_SCHEMA = os.path.relpath(references_schema_path(workflow.basedir))
# Validated before any job, like the other configuration files: every problem at once.
try:
    load_references(REFERENCES_PATH, REFERENCES_SCHEMA)
except ConfigError as exc:
    raise WorkflowError(f"dlscale: {exc}\nNo job was started.") from None

# A `check` job that found FAIL verdicts writes them to its log; the onerror handler (Snakefile)
# reads it to tell a failed check (every cell and table in place) from a failed study: no
# partial build then.
CHECK_LOG = f"{LOGS}/check.log"
CHECK_PARSED_AT = time.time()


rule verdicts:
    input:
        scaling=RULE_OUT["scaling"],
        status=RULE_OUT["status"],
        references=REFERENCES_PATH,
        schema=REFERENCES_SCHEMA,
    output:
        verdicts=table_report("verdicts"),
        table=RULE_OUT["verdicts_table"],
        published=RULE_OUT["published"],
    log:
        f"{RULE_OUT['logs']}/verdicts.log",
    params:
        # for the published figures (dlscale.decisions.published): what each entry's cells
        # ran on, and the study's sequence length (None: each model's default)
        devices={key: hw.get("device_model") for key, hw in STUDY.hardware.items()},
        seq_len=STUDY.config.get("seq_len"),
    run:
        from dlscale.decisions.regression_check import verdicts_job

        # the references file as the study names it
        verdicts_job(input, output, params, log[0], STUDY.config["references_file"])


rule check:
    input:
        verdicts=OUT["verdicts"],
        # and the verdicts against the history where config history.check asks (rules/history.smk)
        history=check_history_inputs(),
    log:
        CHECK_LOG,
    run:
        from dlscale.decisions.regression_check import enforce_verdicts

        enforce_verdicts(
            input.verdicts,
            log[0],
            results=RESULTS,
            history_csv=input.history[0] if input.history else None,
            against=HISTORY["check"],
        )


rule compare:
    input:
        cells=OUT["cells"],
        systems=OUT["systems"],
        baseline_cells=f"{STUDY_DIR.format(study='{baseline}')}/tables/cells.csv",
        baseline_systems=f"{STUDY_DIR.format(study='{baseline}')}/tables/systems.csv",
    output:
        table=f"{RESULTS}/compare/{{baseline}}/compare.csv",
        summary=f"{RESULTS}/compare/{{baseline}}/summary.md",
        tex=f"{RESULTS}/compare/{{baseline}}/summary.tex",
        figure=f"{RESULTS}/compare/{{baseline}}/ratios.pdf",
    log:
        f"{LOGS}/compare/{{baseline}}.log",
    wildcard_constraints:
        baseline=r"[A-Za-z0-9_.-]+",
    run:
        from dlscale.decisions.compare import compare_rule

        compare_rule(input.baseline_cells, input.cells, output.table, log[0])

# The results database (dlscale.store.database) and the study's history in it
# (dlscale.decisions.history); the database's settings and the driver's recorder hooks are in
# rules/common.smk, section "Results database". The database's URL is config `database` (null: the environment's
# DLSCALE_DATABASE_URL, else results/dlscale.sqlite; off: none): a scheduling setting, in no
# cell's or study's hash.
#
# The driver writes each measured cell's row as its metrics land (dlscale.workflow.recorder,
# started at onstart and stopped at onsuccess/onerror in the Snakefile); job steps never write.
# history: after the study's tables and its verdicts, records what the database still lacks,
#   judges every series the study measured against its earlier runs and writes history/ (every
#   run, the verdicts, the trend figure) and the report's History section. A final target (the
#   report's source). A database that is off, locked or unreachable never fails it; rows it
#   could not write are named in logs/database-pending.json, an input of this rule where it
#   exists, so the next run, even one with nothing else to do, writes them first.
from dlscale.store.database import param_form as database_param


rule history:
    input:
        cells=RULE_OUT["cells"],
        verdicts=RULE_OUT["verdicts"],
        pending=database_pending,  # rules/common.smk
    output:
        table=RULE_OUT["history_table"],
        verdicts=RULE_OUT["history_verdicts"],
        tex=RULE_OUT["history_tex"],
    log:
        f"{RULE_OUT['logs']}/history.log",
    params:
        # the database (no password; the default file relative to the working directory, so
        # a copied checkout is the same database): another database redoes the history
        database=database_param(DATABASE_URL),
        match=HISTORY["match"],
        threshold=HISTORY["threshold"],
        figure=lambda wildcards: outputs_of(wildcards)["history_figure"],
    run:
        # imported by the job alone: it brings pandas and scipy.stats (half a second of every
        # Snakemake start, the job steps' included, when imported at parse)
        from dlscale.decisions.history_report import history_job

        history_job(
            DATABASE_URL,
            RESULTS,
            {**dict(output.items()), "figure": params.figure},
            log[0],
            match=params.match,
            threshold=params.threshold,
            reference_verdicts=input.verdicts,
        )

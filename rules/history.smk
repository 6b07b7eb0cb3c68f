# The results database (dlscale.store.database) and the study's history in it
# (dlscale.decisions.history). The database's URL is config `database` (null: the environment's
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
from dlscale.store.database import describe as describe_database
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


rule history:
    input:
        cells=RULE_OUT["cells"],
        verdicts=RULE_OUT["verdicts"],
        pending=database_pending,
    output:
        table=RULE_OUT["history_table"],
        verdicts=RULE_OUT["history_verdicts"],
        tex=RULE_OUT["history_tex"],
    log:
        f"{RULE_OUT['logs']}/history.log",
    params:
        # the database as it may be printed (no password): another database redoes the history
        database=describe_database(DATABASE_URL) if DATABASE_URL else "off",
        match=HISTORY["match"],
        threshold=HISTORY["threshold"],
    run:
        from dlscale.decisions.history_report import history_job

        history_job(
            DATABASE_URL,
            RESULTS,
            {**dict(output.items()), "figure": outputs_of(wildcards)["history_figure"]},
            log[0],
            match=params.match,
            threshold=params.threshold,
            reference_verdicts=input.verdicts,
        )

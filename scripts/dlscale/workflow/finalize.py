"""The end of a run whose cells did not all succeed: the partial report, built by the workflow's
own rules.

The Snakefile's `onerror:` handler (dlscale.workflow.lifecycle.build_partial_report) calls
`build_partial` after Snakemake has run every job it could (keep-going). It starts a second
`snakemake` on the local executor, with the same Snakefile and the same configuration, for the
`partial` target: the rules downstream of the cells (collect, scaling_model, plan, figure,
convergence_figure, report_inputs, report_tex, report_pdf, verdicts) write into
results/<study>/partial/ from the cells whose metrics exist, and the report's status section
lists the failed and missing cells (tables/status.csv). Only those rules may run
(`--allowed-rules`): the partial build never measures a cell. The next `snakemake` run retries
the failed and missing cells and builds the complete outputs; `onsuccess` removes the partial
folder.
"""

from __future__ import annotations

import csv
import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from dlscale.outputs.tex import tex_missing

# The target rule of the partial build (the Snakefile).
PARTIAL_TARGET = "partial"
# Set in the partial build's environment (the pid of the driver that started it): its parse does
# not report that driver as another one running the study.
PARTIAL_BUILD_ENV = "DLSCALE_PARTIAL_BUILD_OF"


def partial_command(
    *,
    snakefile: str,
    directory: str,
    configfiles: list[str],
    allowed_rules: list[str],
    cores: int = 1,
    deployment: list[str] = (),
    conda_prefix: str | None = None,
) -> list[str]:
    """The `snakemake` command of the partial build: the `partial` target on the local executor,
    every partial output rebuilt (--forceall: a cell that failed differently this time is
    reported as it failed now), only `allowed_rules` (never a cell's), no lock (the failed run
    holds its own while its onerror handler runs; the two write different files) and no hooks
    (no second driver record, no nested partial build)."""
    cmd = [
        sys.executable,
        "-m",
        "snakemake",
        PARTIAL_TARGET,
        "--snakefile",
        snakefile,
        "--directory",
        directory,
        "--configfile",
        *configfiles,
        "--workflow-profile",
        "none",
        "--executor",
        "local",
        "--cores",
        str(max(1, int(cores))),
        "--forceall",
        "--force-use-threads",  # `run:` jobs on threads of this process (profiles/local)
        "--keep-going",
        "--rerun-incomplete",
        "--nolock",
        "--no-hooks",
        "--allowed-rules",
        *allowed_rules,
    ]
    if deployment:
        cmd += ["--software-deployment-method", *deployment]
    if conda_prefix:
        cmd += ["--conda-prefix", conda_prefix]
    return cmd


def build_partial(
    config: dict,
    out: dict[str, str],
    *,
    partial: str,
    n_planned: int,
    snakefile: str,
    allowed_rules: list[str],
    study_files: list[str] = (),
    cores: int = 1,
    deployment: list[str] = (),
    conda_prefix: str | None = None,
    stopped_by: str | None = None,
) -> int:
    """Run the partial build into `partial` (whose outputs are `out`, the keys of
    dlscale.workflow.paths.output_paths) with the failed run's `config` (Snakemake's config, as
    the run resolved it, written to a file given last) and its `study_files` (its --configfile
    files, given first: a study file's reading depends on which file names the study), then say
    where the study stands. Returns the build's exit status."""
    shutil.rmtree(partial, ignore_errors=True)
    logs = Path(out["logs"])
    logs.mkdir(parents=True, exist_ok=True)
    configfile = logs / "config.json"
    configfile.write_text(json.dumps(config, indent=1, default=str))
    log = logs / "snakemake.log"
    cmd = partial_command(
        snakefile=snakefile,
        directory=os.getcwd(),
        # the run's study files first, so the partial build reads the same study from them
        # (dlscale.workflow.guards.study_files leaves the last file, these settings, out)
        configfiles=[*study_files, str(configfile)],
        allowed_rules=allowed_rules,
        cores=cores,
        deployment=deployment,
        conda_prefix=conda_prefix,
    )
    env = {k: v for k, v in os.environ.items() if k != "SNAKEMAKE_PROFILE"}
    env[PARTIAL_BUILD_ENV] = str(os.getpid())
    print(
        f"dlscale: building the partial report with the workflow's own rules (log: {log}):\n"
        f"  {shlex.join(cmd)}",
        file=sys.stderr,
    )
    with open(log, "w") as fh:
        code = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env).returncode
    print(partial_summary(out, n_planned, log=str(log), stopped_by=stopped_by), file=sys.stderr)
    return code


def partial_summary(
    out: dict[str, str], n_planned: int, *, log: str, stopped_by: str | None = None
) -> str:
    """The end-of-run message from the partial build's status table and report."""
    try:
        with open(out["status"], newline="") as fh:
            states = [row["status"] for row in csv.DictReader(fh)]
    except (OSError, KeyError) as exc:
        return (
            f"dlscale: the partial build stopped before its status table ({exc}); see {log}. "
            "Rerun the same command to retry the failed and missing cells."
        )
    pdf_problem = None
    if tex_missing():  # no PDF asked for (dlscale.workflow.guards); the run's start said so
        pdf_problem = f"TeX not found on PATH ({', '.join(tex_missing())} missing)"
    elif not Path(out["pdf"]).is_file():
        pdf_log = Path(out["pdf_log"])
        text = pdf_log.read_text(errors="replace") if pdf_log.is_file() else ""
        tail = text.strip().splitlines()[-1:]
        pdf_problem = f"{tail[0]} ({pdf_log})" if tail else f"a step of it failed (see {log})"
    return status_message(
        measured=states.count("ok"),
        failed=states.count("failed"),
        missing=states.count("missing"),
        n_planned=n_planned,
        out=out,
        pdf_problem=pdf_problem,
        stopped_by=stopped_by,
    )


def report_message(out: dict[str, str], outputs) -> str | None:
    """The last line of a run that succeeded: where to read the study's results, when the run's
    jobs (`outputs`: every output file of its DAG, run or already up to date) hold its report;
    None for a run of other targets (a figure alone, `check`, an archive of a study whose report
    it does not build)."""
    built = {os.path.normpath(str(f)) for f in outputs}
    if os.path.normpath(out["tex"]) not in built:
        return None
    where = f"tables in {Path(out['cells']).parent}/, figures in {out['figures']}/"
    if os.path.normpath(out["pdf"]) in built and Path(out["pdf"]).is_file():
        return f"dlscale: the study's report: {out['pdf']} ({where})"
    return (
        f"dlscale: the study's report sources: {out['tex']} ({where}); no PDF was built here "
        "(TeX not on PATH, as the run's first lines said, with the command that builds it)"
    )


def status_message(
    *,
    measured: int,
    failed: int,
    missing: int,
    n_planned: int,
    out: dict[str, str],
    pdf_problem: str | None = None,
    stopped_by: str | None = None,
) -> str:
    """What the end of a failed run says: the cells (measured, failed, missing) apart from the
    report steps. With every cell measured, the study is complete and only a report step
    failed; saying "study incomplete" then would send the user to rerun cells."""
    pdf = (
        f"{out['pdf']} was not built: {pdf_problem}"
        if pdf_problem
        else f"{out['pdf']} was built from them"
    )
    if measured == n_planned and not failed and not missing and stopped_by:
        return (
            f"dlscale: cells measured: all {n_planned} of {n_planned} -- the measurements are "
            f"complete. The driver was stopped ({stopped_by}) before the report steps; tables, "
            f"figures and the report were built from the cells into the partial folder; {pdf}. "
            "Rerun the same command to build the final ones: no cell is measured again."
        )
    if measured == n_planned and not failed and not missing:
        return (
            f"dlscale: cells measured: all {n_planned} of {n_planned} (none failed, none "
            "missing) -- the measurements are complete. Report steps failed: a table, figure "
            "or report job above stopped the run (see its log). Tables, figures and the report "
            f"were built from the measured cells into the partial folder; {pdf}. Fix the "
            "report step and rerun the same command: no cell is measured again."
        )
    return (
        f"dlscale: study incomplete: cells measured: {measured} of {n_planned}; {failed} "
        f"failed, {missing} missing ({out['status']}). Tables, figures and the report were "
        f"built from the measured cells; {pdf}. Rerun the same command to retry only the "
        "failed and missing cells."
    )

"""Tables, figures and the report from whatever cells exist, when the study did not complete.

The Snakefile's `onerror:` handler calls `build_from_existing` after Snakemake has run every job
it could (keep-going): the same functions the rules call, on the cells that have valid metrics,
so a study with failed cells still ends with tables, figures and a report that lists the failed
and missing cells (results/tables/status.csv). The next `snakemake` run reruns only the failed
and missing cells and rebuilds these outputs through the rules.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

from dlscale.analysis.collect import CONVERGENCE_TABLES, write_tables
from dlscale.outputs.plotting import plot_convergence_figure, plot_figure
from dlscale.outputs.report import LatexMissing, compile_pdf, render_tex, write_report_inputs


def build_from_existing(
    paths: list[str],
    out: dict[str, str],
    *,
    config: dict,
    n_planned: int,
    figures: list[dict],
    title: str,
    attachment: str,
    stopped_by: str | None = None,
    convergence_figures: list[dict] = (),
) -> None:
    """`out`: the outputs by the keys of OUT in rules/common.smk; `figures`,
    `convergence_figures`: the study's figure layouts (dlscale.outputs.figure_layout.figure_layout,
    convergence_layout: the same lists the rules draw); `attachment`: out["cells"] relative to
    the report's folder."""
    write_tables(
        paths,
        out["ranks"],
        out["cells"],
        out["scaling"],
        out["quarantine"],
        out["status"],
        straggler_threshold=config["straggler_threshold"],
        systems_csv=out["systems"],
        convergence_csvs={k: out[k] for k in CONVERGENCE_TABLES},
        validity_tolerance=config["convergence"]["validity_tolerance"],
    )
    tables = write_report_inputs(out, config=config, n_planned=n_planned)
    for fig in figures:
        path = Path(out["figures"]) / fig["file"]
        path.parent.mkdir(parents=True, exist_ok=True)
        plot_figure(tables["scaling"], fig, str(path))
    epochs = pd.read_csv(out["epochs"])
    for fig in convergence_figures:
        path = Path(out["figures"]) / fig["file"]
        path.parent.mkdir(parents=True, exist_ok=True)
        plot_convergence_figure(
            tables["time_to_accuracy"], epochs, tables["convergence"], fig, str(path)
        )
    render_tex(
        out["tex"],
        title=title,
        figures=figures,
        attachment=attachment,
        convergence_figures=convergence_figures,
    )
    pdf_problem = None
    try:
        compile_pdf(out["tex"], log=out["pdf_log"])
    except LatexMissing as exc:
        pdf_problem = str(exc)
        print(f"dlscale: {exc}", file=sys.stderr)
    except RuntimeError as exc:
        pdf_problem = f"latexmk failed (see {out['pdf_log']})"
        print(f"dlscale: {exc}", file=sys.stderr)
    status = tables["status"]
    print(
        status_message(
            measured=int((status["status"] == "ok").sum()),
            failed=int((status["status"] == "failed").sum()),
            missing=int((status["status"] == "missing").sum()),
            n_planned=n_planned,
            out=out,
            pdf_problem=pdf_problem,
            stopped_by=stopped_by,
        ),
        file=sys.stderr,
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

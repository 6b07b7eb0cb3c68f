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

from .collect import write_tables
from .plotting import plot_figure
from .report import LatexMissing, compile_pdf, render_tex, write_report_inputs


def build_from_existing(
    paths: list[str],
    out: dict[str, str],
    *,
    config: dict,
    n_planned: int,
    figures: list[dict],
    title: str,
    attachment: str,
) -> None:
    """`out`: the outputs by the keys of OUT in rules/common.smk; `figures`: the study's figure
    layout (dlscale.layout.figure_layout, the same list the rules draw); `attachment`:
    out["cells"] relative to the report's folder."""
    write_tables(
        paths,
        out["ranks"],
        out["cells"],
        out["scaling"],
        out["quarantine"],
        out["status"],
        straggler_threshold=config["straggler_threshold"],
        systems_csv=out["systems"],
    )
    tables = write_report_inputs(out, config=config, n_planned=n_planned)
    for fig in figures:
        path = Path(out["figures"]) / fig["file"]
        path.parent.mkdir(parents=True, exist_ok=True)
        plot_figure(tables["scaling"], fig, str(path))
    render_tex(out["tex"], title=title, figures=figures, attachment=attachment)
    try:
        compile_pdf(out["tex"], log=out["pdf_log"])
    except LatexMissing as exc:
        print(f"dlscale: {exc}", file=sys.stderr)
    status = tables["status"]
    failed = status[status["status"] != "ok"]
    print(
        f"dlscale: study incomplete: {len(tables['cells'])} of {n_planned} cells measured; "
        f"{(failed['status'] == 'failed').sum()} failed, {(failed['status'] == 'missing').sum()} "
        f"missing ({out['status']}). Tables, figures and {out['pdf']} were built "
        "from the measured cells; rerun the same command to retry only the failed and missing "
        "cells.",
        file=sys.stderr,
    )

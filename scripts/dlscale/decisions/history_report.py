"""A study's own history, as the workflow's `history` rule writes it (rules/history.smk).

In the driver, after the study's tables and its verdicts against the references:

1. record whatever of the study folder the results database lacks (its measurements,
   preflight results and reference verdicts: dlscale.store.database.record_study);
2. judge each series the study measured against its history (dlscale.decisions.history:
   `study_history`), and record those verdicts too;
3. write history/history.csv (every point of those series), history/verdicts.csv (one verdict
   per series that has an earlier run), the trend figure history/history.pdf (only where an
   earlier run exists) and report/history.tex: the report's History section, present only
   where earlier results exist (else a comment: the report has no such section).

A database that is off, locked or unreachable never fails the job: the tables are written
empty, the section is left out, and where rows could not be written the study's
logs/database-pending.json says so after the outputs (newer than them), so the next run
records them first (dlscale.store.database.mark_pending).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from dlscale.analysis.regression_stats import FAIL, LEVEL, PASS, UNCERTAIN
from dlscale.decisions.history import (
    HISTORY_COLUMNS,
    MATCHES,
    VERDICT_COLUMNS,
    StudyHistory,
    study_history,
)
from dlscale.outputs.latex_text import tex_escape
from dlscale.store import database as store

MAX_ROWS = 60  # rows of the section's table; every row is in history/verdicts.csv


def _pct(x) -> str:
    return "--" if x is None or pd.isna(x) else f"{x * 100:+.1f}\\,\\%"


def section_tex(hist: StudyHistory, *, match: str, threshold: float, figure: str | None,
                caption: str) -> str:  # fmt: skip
    """The History section (LaTeX), or a comment where there is nothing to compare."""
    if hist.verdicts.empty:
        return f"% No History section: {tex_escape(hist.note or 'nothing to compare')}.\n"
    v = hist.verdicts
    counts = {k: int((v["verdict"] == k).sum()) for k in (FAIL, UNCERTAIN, PASS)}
    series = hist.table["series"].nunique() if not hist.table.empty else 0
    text = [
        "\\section{History}\\label{sec:history}",
        f"The study's throughput against its history in the results database "
        f"(\\texttt{{{tex_escape(hist.database)}}}): {len(v)} of its series have earlier runs "
        f"({series} series in \\texttt{{history/history.csv}} with every run). A run is what one "
        f"study measured of a series on one software stack; series are matched by "
        f"\\texttt{{{tex_escape(match)}}} "
        + (
            "(the same configuration with any software stack)."
            if match == "software"
            else "(the same cell identity)."
        )
        + f" Each series' newest run here is compared with its last good run (the first run, "
        f"then the latest that passed): the Hodges--Lehmann shift of log throughput with its "
        f"Mann--Whitney interval ({LEVEL * 100:.0f}\\,\\% two-sided, each bound one-sided "
        f"95\\,\\%; "
        f"distribution-free: its coverage holds for any noise). PASS: the interval's upper "
        f"bound on "
        f"the slowdown is below the threshold ({threshold * 100:g}\\,\\%); FAIL: its lower "
        f"bound is above 0 and the estimate above the threshold; UNCERTAIN: neither, with the "
        f"repetitions per side that would decide. \\textbf{{{counts[FAIL]} FAIL}}, "
        f"{counts[UNCERTAIN]} UNCERTAIN, {counts[PASS]} PASS.",
    ]
    rows = []
    order = {FAIL: 0, UNCERTAIN: 1, PASS: 2}
    listed = v.assign(_o=v["verdict"].map(order)).sort_values(["_o", "series"], kind="stable")
    for r in listed.head(MAX_ROWS).to_dict("records"):
        verdict = r"\textbf{FAIL}" if r["verdict"] == FAIL else r["verdict"]
        interval = (
            f"[{_pct(r['slowdown_low'])}, {_pct(r['slowdown_high'])}]"
            if not pd.isna(r["slowdown_low"])
            else "none"
        )
        extra = ""
        if r["verdict"] == UNCERTAIN and not pd.isna(r["needed_n"]):
            extra = f"; about {int(r['needed_n'])} per side would decide"
        rows.append(
            " & ".join(
                [
                    verdict,
                    tex_escape(r["series"]).replace("/", r"/\allowbreak{}"),
                    tex_escape(r["baseline_study"]),
                    f"{int(r['n'])} / {int(r['n_baseline'])}",
                    _pct(r["slowdown"]),
                    interval + extra,
                ]
            )
            + r" \\"
        )
    text.append(
        "{\\footnotesize\\setlength\\tabcolsep{3pt}\n"
        "\\begin{longtable}{lp{0.34\\linewidth}lrrp{0.22\\linewidth}}\n\\toprule\n"
        "Verdict & Series & Last good run & $n$ / $n_0$ & Slowdown & Interval \\\\\n"
        "\\midrule\\endhead\n" + "\n".join(rows) + "\n\\bottomrule\n\\end{longtable}}"
    )
    if len(listed) > MAX_ROWS:
        text.append(f"{len(listed) - MAX_ROWS} more rows: \\texttt{{history/verdicts.csv}}.")
    failed = listed[listed["verdict"] == FAIL]
    if not failed.empty:
        items = [
            f"\\item \\texttt{{{tex_escape(r['series'])}}}: slower since "
            f"{tex_escape(r['first_bad'])}, last good {tex_escape(r['last_good'])}; changed: "
            f"{tex_escape(r['changes'])}."
            for r in failed.head(20).to_dict("records")
        ]
        text.append(
            "\\paragraph{What changed.} Between the last good run and the first bad one:\n"
            "\\begin{itemize}\n" + "\n".join(items) + "\n\\end{itemize}"
        )
    if figure:
        text.append(
            "\\begin{figure}[htbp]\n  \\centering\n"
            f"  \\includegraphics[width=\\linewidth,height=0.8\\textheight,keepaspectratio]"
            f"{{{figure}}}\n  \\caption{{{tex_escape(caption)}}}\n\\end{{figure}}"
        )
    return "\n\n".join(text) + "\n"


def history_job(
    url: str | None,
    study_dir: str,
    outputs: dict[str, str],
    log: str,
    *,
    match: str = "software",
    threshold: float = 0.05,
    reference_verdicts: str | None = None,
) -> StudyHistory:
    """The `history` rule (module docstring). `outputs`: table, verdicts, tex, figure (the
    figure is written only where an earlier run exists, and removed where none does)."""
    study = store.study_name(study_dir)
    empty = StudyHistory(
        pd.DataFrame(columns=HISTORY_COLUMNS), pd.DataFrame(columns=VERDICT_COLUMNS), "", ""
    )
    pending = None
    lines = []
    if url is None:
        hist = empty
        hist.note = "the results database is off (config database: off)"
    else:
        try:
            db = store.connect(url)
            try:
                tables = [("references", reference_verdicts)] if reference_verdicts else []
                done = store.record_study(db, study_dir, verdict_tables=tables)
                lines.append(
                    f"recorded {done.inserted} new row(s); {done.known} measurement(s) were "
                    f"already in {store.describe(url)}; {len(done.invalid)} invalid file(s)"
                )
                hist = study_history(db, study, match, threshold)
                Path(outputs["verdicts"]).parent.mkdir(parents=True, exist_ok=True)
                hist.verdicts.to_csv(outputs["verdicts"], index=False)
                store.record_verdicts(db, study, "history", outputs["verdicts"])
            finally:
                db.close()
        except store.DatabaseUnavailable as exc:
            pending = str(exc)
            hist = empty
            hist.note = f"the results database was unavailable ({exc})"
            lines.append(f"{hist.note}: its rows are recorded on the next run")
    if url is not None and pending is None:
        # nothing waits: the marker (where one is) says so before the outputs, older than them
        store.mark_pending(study_dir, url, None)
    for key in ("table", "verdicts", "tex"):
        Path(outputs[key]).parent.mkdir(parents=True, exist_ok=True)
    hist.table.to_csv(outputs["table"], index=False)
    hist.verdicts.to_csv(outputs["verdicts"], index=False)
    figure_path = Path(outputs["figure"])
    figure_rel, caption = None, ""
    if not hist.verdicts.empty:
        from dlscale.outputs.history_figure import draw_history

        shown = hist.table[hist.table["series"].isin(set(hist.verdicts["series"]))]
        caption = draw_history(shown, figure_path, by="time")
        figure_rel = Path("..") / figure_path.relative_to(Path(outputs["tex"]).parent.parent)
    else:
        figure_path.unlink(missing_ok=True)
    Path(outputs["tex"]).write_text(
        section_tex(
            hist,
            match=match,
            threshold=threshold,
            figure=figure_rel and figure_rel.as_posix(),
            caption=caption,
        )
    )
    counts = hist.verdicts["verdict"].value_counts().to_dict() if not hist.verdicts.empty else {}
    lines.append(
        f"history ({MATCHES[match]} match, threshold {threshold:g}): "
        + (", ".join(f"{n} {v}" for v, n in sorted(counts.items())) or hist.note or "none")
    )
    Path(log).parent.mkdir(parents=True, exist_ok=True)
    Path(log).write_text("\n".join(lines) + "\n")
    if pending is not None:  # after the outputs, newer than them: the next run records first
        store.mark_pending(study_dir, url, pending)
    return hist

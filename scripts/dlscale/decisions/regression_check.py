"""Regression references and verdicts: is this study's system as fast as it was?

A site keeps its expectations in config/references.yaml (schema config/schemas/
references.schema.json), in the shape of ReFrame's references: per system (a hardware key, or
"*" for any) and cell pattern (a glob over framework/model/policy/precision/mode/n<nodes>, the
cell's path below its hardware folder without the repetition), the expected value of a metric
with relative lower and upper tolerances and its unit:

    references:
      v100:
        "pytorch/resnet50/weak/fp32/eager/n4":
          throughput_samples_per_s: {value: 4800.0, lower: -0.05, upper: 0.05, unit: samples/s}

Every scaling point (hardware x framework x model x policy x precision x mode x nodes; the
median over its repetitions, dlscale.analysis.stats) and every metric gets one verdict:

- PASS: the measured median lies within [value x (1 + lower), value x (1 + upper)];
- FAIL: it lies outside; `margin` says by how much (a fraction of the reference value,
  negative outside the bounds, positive inside: the headroom to the nearer bound);
- no-reference: measured, but no reference matches;
- not-measured: a reference matches, but the point has no value (its cells failed or are
  missing, dlscale does not measure the metric, or no energy counter was readable).

The median decides, as in ReFrame; the median's interval (the order-statistic CI or the min-max
range, `interval` says which and over what n) is reported beside it with `interval_vs_bounds`:
inside, overlaps or outside the bounds (no interval with one repetition), so a FAIL within the
noise is visible as one.

`python -m dlscale.decisions.regression_check results/<study>` prints the verdicts and exits 1 on
any FAIL;
`python -m dlscale.decisions.regression_check bless results/<study> --system cpu` records the
current results as the
references of one system (shows every entry, refuses to replace one without --force).

The verdicts themselves: `reference_verdicts`; bless: `reference_bless`; here the tables, the
rules' entry points and the command line.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import pandas as pd

from dlscale.analysis.stats import with_axes
from dlscale.decisions.reference_bless import DEFAULT_TOLERANCE, bless
from dlscale.decisions.reference_verdicts import (
    FAIL,
    NO_REFERENCE,
    NOT_MEASURED,
    PASS,
    VERDICTS,
    counts,
    summary_line,
    unused_references,
    verdicts,
)
from dlscale.study.config import ConfigError
from dlscale.study.references import (  # noqa: F401 (re-exported: the check's references, light to import)
    DEFAULT_REFERENCES,
    FAILED_MARK,
    REFERENCES_SCHEMA,
    WILDCARD,
    Reference,
    failed_since,
    load_references,
    read_reference_file,
    schema_path,
)

MAX_LISTED = 60  # rows of the report's verdict table


# ---- the tables --------------------------------------------------------------------------------


def _num(x, digits: int = 4) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)) or pd.isna(x):
        return "--"
    return f"{x:.{digits}g}"


def _pct(x) -> str:
    return "--" if x is None or pd.isna(x) else f"{x * 100:+.1f} %"


def no_reference_hint(table: pd.DataFrame, results: str | None = None) -> str | None:
    """Why rows have no verdict, and the command that records references for them (None when
    every measured row has a reference)."""
    missing = table[table["verdict"] == NO_REFERENCE]
    if missing.empty:
        return None
    systems = sorted(str(h) for h in missing["hardware"].unique())
    hint = (
        f"{len(missing)} measured row(s) have no reference: the references file has no entry "
        f"for {', '.join(systems)} that matches their cells (list them with --all)."
    )
    if results:
        blesses = [
            f"python -m dlscale.decisions.regression_check bless {results} --system {system}"
            for system in systems
        ]
        hint += " Record the current results as references with:\n  " + "\n  ".join(blesses)
    return hint


def format_verdicts(table: pd.DataFrame, *, all_rows: bool = False, results=None) -> str:
    """A plain-text table for the terminal: every row with a reference (FAIL first); the
    no-reference rows only counted unless all_rows, with why and the command that records
    references for them (`results`: the study's results folder)."""
    shown = table if all_rows else table[table["verdict"] != NO_REFERENCE]
    shown = shown.assign(_o=shown["verdict"].map(VERDICTS.index)).sort_values("_o", kind="stable")
    lines = []
    if not shown.empty:
        head = (
            "verdict",
            "system",
            "cell",
            "metric",
            "measured",
            "interval",
            "reference",
            "tol.",
            "margin",
        )
        body = [
            (
                r.verdict,
                str(r.hardware),
                r.cell,
                r.metric,
                f"{_num(r.measured)} {r.unit}" if not pd.isna(r.measured) else "--",
                ""
                if pd.isna(r.interval)
                else f"{r.interval} [{_num(r.interval_low)}, {_num(r.interval_high)}]"
                if not pd.isna(r.interval_low)
                else str(r.interval),
                _num(r.reference),
                "" if pd.isna(r.tolerance) else str(r.tolerance),
                _pct(r.margin),
            )
            for r in shown.itertuples(index=False)
        ]
        widths = [max(len(h), *(len(b[i]) for b in body)) for i, h in enumerate(head)]
        lines.append("  ".join(h.ljust(w) for h, w in zip(head, widths)).rstrip())
        lines += ["  ".join(v.ljust(w) for v, w in zip(b, widths)).rstrip() for b in body]
    lines.append(f"verdicts: {summary_line(table)}")
    hint = no_reference_hint(table, results)
    if hint:
        lines.append(hint)
    return "\n".join(lines)


def write_verdicts_tex(
    table: pd.DataFrame, out: str | Path, *, references_file: str, unused: list[str]
) -> None:
    """The report's regression-check section body: a generated sentence with the counts and the
    rows with a reference (FAIL first, at most MAX_LISTED); no-reference rows are counted."""
    from dlscale.outputs.latex_text import tex_escape

    c = counts(table)
    text = (
        f"Verdicts against \\texttt{{{tex_escape(references_file)}}}: {c[PASS]} PASS, "
        f"{c[FAIL]} FAIL, {c[NOT_MEASURED]} not-measured, and {c[NO_REFERENCE]} measured "
        "values without a reference (listed in \\texttt{tables/verdicts.csv}). The median over "
        "repetitions decides; the margin is the distance to the nearer bound as a fraction of "
        "the reference (negative: outside the bounds); the interval column says whether the "
        "median's interval lies inside, overlaps or lies outside the bounds."
    )
    if unused:
        text += (
            f" {len(unused)} reference(s) for this study's systems matched no cell: "
            + tex_escape("; ".join(unused[:5]))
            + ("; ..." if len(unused) > 5 else "")
            + "."
        )
    listed = table[table["verdict"] != NO_REFERENCE]
    listed = listed.assign(_o=listed["verdict"].map(VERDICTS.index)).sort_values(
        "_o", kind="stable"
    )
    if listed.empty:
        Path(out).write_text(text + "\n")
        return
    rows = []
    for r in listed.head(MAX_LISTED).itertuples(index=False):
        verdict = r.verdict if r.verdict != FAIL else r"\textbf{FAIL}"
        rows.append(
            " & ".join(
                [
                    verdict,
                    tex_escape(f"{r.hardware}/{r.cell}").replace("/", r"/\allowbreak{}"),
                    tex_escape(r.metric),
                    tex_escape(_num(r.measured)),
                    tex_escape(_num(r.reference)),
                    tex_escape(r.tolerance),
                    tex_escape(_pct(r.margin)),
                    tex_escape(r.interval_vs_bounds if not pd.isna(r.interval_vs_bounds) else "--"),
                ]
            )
            + r" \\"
        )
    more = (
        f"\\noindent {len(listed) - MAX_LISTED} more rows: see \\texttt{{tables/verdicts.csv}}.\n"
        if len(listed) > MAX_LISTED
        else ""
    )
    Path(out).write_text(
        text + "\n\n{\\footnotesize\\setlength\\tabcolsep{3pt}\n"
        "\\begin{longtable}{lp{0.3\\linewidth}lrrlrl}\n\\toprule\n"
        "Verdict & Cell & Metric & Measured & Reference & Tolerance & Margin & Interval \\\\\n"
        "\\midrule\\endhead\n" + "\n".join(rows) + "\n\\bottomrule\n\\end{longtable}}\n" + more
    )


def write_verdicts(
    scaling_csv: str,
    status_csv: str | None,
    references_file: str,
    verdicts_csv: str,
    verdicts_tex: str | None = None,
    *,
    schema: str | Path | None = None,
    references_name: str | None = None,
    log: str | None = None,
    published_csv: str | None = None,
    devices: dict | None = None,
    seq_len: int | None = None,
) -> pd.DataFrame:
    """The verdicts rule: tables + references -> verdicts.csv (and the report's table); with
    `published_csv`, the measured cells against the file's published figures
    (dlscale.decisions.published; `devices`: hardware key -> device_model), appended to the
    report's section."""
    scaling = with_axes(pd.read_csv(scaling_csv))  # before the parallelism axis: ddp
    status = pd.read_csv(status_csv) if status_csv and Path(status_csv).exists() else pd.DataFrame()
    refs = load_references(references_file, schema)
    table = verdicts(scaling, status, refs)
    Path(verdicts_csv).parent.mkdir(parents=True, exist_ok=True)
    table.to_csv(verdicts_csv, index=False)
    hardware = set(scaling["hardware"]) | (set(status["hardware"]) if not status.empty else set())
    unused = unused_references(refs, table, hardware)
    if verdicts_tex:
        Path(verdicts_tex).parent.mkdir(parents=True, exist_ok=True)
        write_verdicts_tex(
            table,
            verdicts_tex,
            references_file=references_name or str(references_file),
            unused=unused,
        )
    if published_csv:
        from dlscale.decisions import published
        from dlscale.study.references import load_published

        entries = load_published(references_file, schema)
        _, paragraph = published.write(scaling, entries, devices or {}, published_csv, seq_len)
        if verdicts_tex:
            with open(verdicts_tex, "a") as fh:
                fh.write(paragraph)
    if log:
        Path(log).parent.mkdir(parents=True, exist_ok=True)
        Path(log).write_text(
            f"{len(refs)} references from {references_file}; verdicts: {summary_line(table)}"
            + (f"; {len(unused)} unused reference(s): {'; '.join(unused)}" if unused else "")
            + "\n"
        )
    return table


def verdicts_job(input, output, params, log: str, references_name: str) -> pd.DataFrame:
    """The verdicts rule (rules/check.smk): its named inputs, outputs and params, as Snakemake
    gives them, to write_verdicts (the published figures with the params' devices and
    seq_len)."""
    return write_verdicts(
        input.scaling,
        input.status,
        input.references,
        output.verdicts,
        output.table,
        schema=input.schema,
        references_name=references_name,
        log=log,
        published_csv=output.published,
        devices=params.devices,
        seq_len=params.seq_len,
    )


def check_table(table: pd.DataFrame, out=None, *, all_rows: bool = False, results=None) -> int:
    """Print the verdicts; 1 when any is FAIL, else 0."""
    out = out or sys.stdout
    print(format_verdicts(table, all_rows=all_rows, results=results), file=out)
    failed = counts(table)[FAIL]
    if failed:
        print(f"dlscale check: {failed} {FAILED_MARK}", file=out)
    return 1 if failed else 0


AGAINST = ("references", "history", "both")  # what check judges by (config history.check)


def check_history_table(table: pd.DataFrame, out=None) -> int:
    """Print the verdicts against the history (history/verdicts.csv,
    dlscale.decisions.history_report); 1 when any is FAIL, else 0."""
    from dlscale.decisions.history_command import format_verdicts as format_history

    out = out or sys.stdout
    print(format_history(table), file=out)
    failed = int((table["verdict"] == FAIL).sum()) if not table.empty else 0
    if failed:
        print(f"dlscale check: {failed} {FAILED_MARK} against the history", file=out)
    return 1 if failed else 0


def enforce_verdicts(
    verdicts_csv: str,
    log: str,
    results: str | None = None,
    *,
    history_csv: str | None = None,
    against: str = "references",
) -> None:
    """The check rule: print the verdicts (and write them to `log`); raise on any FAIL so the
    run exits non-zero. `results`: the study's results folder (named in the bless command);
    `against`: the references, the history (`history_csv`, history/verdicts.csv) or both."""
    import io

    buffer = io.StringIO()
    code = 0
    if against in ("references", "both"):
        code |= check_table(pd.read_csv(verdicts_csv), buffer, results=results)
    if against in ("history", "both"):
        code |= check_history_table(pd.read_csv(history_csv), buffer)
    Path(log).parent.mkdir(parents=True, exist_ok=True)
    Path(log).write_text(buffer.getvalue())
    print(buffer.getvalue(), end="")
    if code:
        failed = 0
        if against in ("references", "both"):
            failed += counts(pd.read_csv(verdicts_csv))[FAIL]
        if against in ("history", "both"):
            failed += int((pd.read_csv(history_csv)["verdict"] == FAIL).sum())
        tables = ", ".join(t for t in (verdicts_csv, history_csv) if t)
        raise RuntimeError(f"dlscale check: {failed} {FAILED_MARK} (table: {tables})")


# ---- command line ------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["bless"]:
        p = argparse.ArgumentParser(
            prog="python -m dlscale.decisions.regression_check bless",
            description="Record a study's current results as the references of one system. "
            "Shows every entry; refuses to replace existing references without --force.",
        )
        p.add_argument("results", help="a study's results folder, e.g. results/demo")
        p.add_argument("--system", required=True, help="the hardware key to record")
        p.add_argument("--references", default=str(DEFAULT_REFERENCES))
        p.add_argument(
            "--tolerance", type=float, default=DEFAULT_TOLERANCE, help="relative, e.g. 0.05"
        )
        p.add_argument("--force", action="store_true", help="replace existing references")
        p.add_argument("--dry-run", action="store_true", help="show, write nothing")
        a = p.parse_args(argv[1:])
        if not 0 <= a.tolerance <= 1:
            p.error("--tolerance must be between 0 and 1")
        try:
            return bless(
                a.results,
                a.system,
                a.references,
                tolerance=a.tolerance,
                force=a.force,
                dry_run=a.dry_run,
            )
        except ConfigError as exc:
            print(f"dlscale bless: {exc}", file=sys.stderr)
            return 2
    p = argparse.ArgumentParser(
        prog="python -m dlscale.decisions.regression_check",
        description="Compare a study's measured medians to the regression references; print "
        "the verdicts (PASS / FAIL / no-reference / not-measured) and exit 1 on any FAIL. "
        "`python -m dlscale.decisions.regression_check bless ...` records references.",
    )
    p.add_argument("results", nargs="?", help="a study's results folder, e.g. results/demo")
    p.add_argument("--references", default=str(DEFAULT_REFERENCES))
    p.add_argument("--out", help="write the verdict table (CSV) here")
    p.add_argument("--verdicts", help="read an existing verdict table instead (the check rule)")
    p.add_argument("--all", action="store_true", help="list the no-reference rows too")
    p.add_argument(
        "--against",
        choices=AGAINST,
        default="references",
        help="judge by the references, by the history in the results database "
        "(python -m dlscale history), or by both",
    )
    p.add_argument("--database", help="the results database's URL (with --against history)")
    p.add_argument("--threshold", type=float, default=0.05, help="history: slowdown that counts")
    p.add_argument("--match", choices=("software", "identity"), default="software")
    a = p.parse_args(argv)
    if bool(a.results) == bool(a.verdicts):
        p.error("give a results folder or --verdicts FILE")
    code = 0
    if a.against != "references":
        if not a.results:
            p.error("--against history needs a results folder")
        code = _check_history(a)
        if code == 2 or a.against == "history":
            return code
    try:
        if a.verdicts:
            table = pd.read_csv(a.verdicts)
        else:
            tables = Path(a.results) / "tables"
            if not (tables / "scaling.csv").is_file():
                print(f"dlscale check: {tables / 'scaling.csv'} not found", file=sys.stderr)
                return 2
            scaling = with_axes(pd.read_csv(tables / "scaling.csv"))
            status_csv = tables / "status.csv"
            status = pd.read_csv(status_csv) if status_csv.is_file() else pd.DataFrame()
            refs = load_references(a.references)
            table = verdicts(scaling, status, refs)
            if a.out:
                table.to_csv(a.out, index=False)
            unused = unused_references(refs, table, set(scaling["hardware"]))
            if unused:  # a stale pattern is worth knowing, never a failure
                print(
                    f"{len(unused)} reference(s) for these systems matched no cell: "
                    + "; ".join(unused)
                )
    except ConfigError as exc:
        print(f"dlscale check: {exc}", file=sys.stderr)
        return 2
    return check_table(table, all_rows=a.all, results=a.results) | code


def _check_history(a) -> int:
    """check --against history: the study's series against their history in the database."""
    from dlscale.decisions.history import study_history
    from dlscale.store import database as store

    folder = Path(a.results)
    url = store.resolve_url(a.database, folder.resolve().parent)
    if url is None:
        print("dlscale check: the results database is off", file=sys.stderr)
        return 2
    try:
        db = store.connect(url)
        try:
            store.record_study(db, folder)
            hist = study_history(db, store.study_name(folder), a.match, a.threshold)
        finally:
            db.close()
    except store.DatabaseUnavailable as exc:
        print(f"dlscale check: {exc}", file=sys.stderr)
        return 2
    if hist.note:
        print(f"history: {hist.note}")
    return check_history_table(hist.verdicts)


if __name__ == "__main__":
    sys.exit(main())

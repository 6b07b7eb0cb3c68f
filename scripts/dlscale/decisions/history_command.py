"""`dlscale history` (`python -m dlscale history`): the history of configurations across studies
(dlscale.decisions.history) as the command prints it, with its CSV and trend figure, and
`dlscale history import FOLDER...`, which records existing study folders in the results
database; also the plain text of a study's verdicts against its history (`dlscale check`)."""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import pandas as pd

from dlscale.analysis.regression_stats import FAIL, METHOD, PASS, THRESHOLD, UNCERTAIN
from dlscale.decisions.history import (
    DEFAULT_MATCH,
    FILTERS,
    FIRST,
    MATCHES,
    history_table,
    load,
)
from dlscale.outputs.history_figure import point_label
from dlscale.store import database as store


# ---- printing -------------------------------------------------------------------------------
def _num(x) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "--"
    return f"{x:.4g}"


def _pct(x) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "--"
    return f"{x * 100:+.1f} %"


def format_table(table: pd.DataFrame, by: str = "time") -> str:
    """The plain-text table: per series its points, each with n, median and interval, and
    its verdict against the last good point (slowdown and interval; what changed for a FAIL)."""
    if table.empty:
        return "no throughput measurements match (dlscale history --help: the filters)"
    lines = []
    head = ("", "study", by, "n", "median", "interval", "verdict", "slowdown [interval]")
    for series, rows in table.groupby("series", sort=False):
        lines.append(f"{series}  ({rows['match'].iloc[0]} match, {len(rows)} point(s))")
        body = []
        for r in rows.to_dict("records"):
            interval = (
                f"{r['interval']} [{_num(r['interval_low'])}, {_num(r['interval_high'])}]"
                if r["interval_low"] == r["interval_low"]
                else r["interval"]
            )
            slow = (
                f"{_pct(r['slowdown'])} [{_pct(r['slowdown_low'])}, {_pct(r['slowdown_high'])}]"
                if r["slowdown"] is not None and r["slowdown"] == r["slowdown"]
                else ""
            )
            body.append(
                (
                    f"  {r['point']}",
                    str(r["study"]),
                    point_label(r, by),
                    str(r["n"]),
                    _num(r["median"]),
                    interval,
                    r["verdict"],
                    slow,
                )
            )
            if r["verdict"] in (FAIL, UNCERTAIN):
                extra = r["reason"]
                if r["verdict"] == FAIL:
                    extra += f". Last good: {r['last_good']}; first bad: {r['first_bad']}; "
                    extra += f"changed: {r['changes']}"
                body.append(("", "", "", "", "", "", "", "    " + extra))
        widths = [max(len(h), *(len(b[i]) for b in body if b[7][:4] != "    ")) for i, h in
                  enumerate(head)]  # fmt: skip
        lines.append("  ".join(h.ljust(w) for h, w in zip(head, widths)).rstrip())
        for b in body:
            if b[7].startswith("    "):
                lines.append(b[7])
            else:
                lines.append("  ".join(v.ljust(w) for v, w in zip(b, widths)).rstrip())
        lines.append("")
    counts = table.groupby("series").tail(1)["verdict"].value_counts()
    lines.append(
        "newest point per series: "
        + ", ".join(f"{counts.get(v, 0)} {v}" for v in (FAIL, UNCERTAIN, PASS, FIRST))
        + f"  ({METHOD}; threshold {_pct_plain(table)})"
    )
    return "\n".join(lines)


def format_verdicts(verdicts: pd.DataFrame) -> str:
    """A study's verdicts against its history (history/verdicts.csv) as plain text: FAIL
    first, each with its slowdown and interval, why, and for a FAIL what changed."""
    if verdicts.empty:
        return "history: no series of this study has an earlier run to compare with"
    order = {FAIL: 0, UNCERTAIN: 1, PASS: 2}
    rows = verdicts.assign(_o=verdicts["verdict"].map(order)).sort_values(["_o", "series"])
    lines = []
    for r in rows.to_dict("records"):
        lines.append(
            f"{r['verdict']:9}  {r['series']}  against {r['baseline_study']}: {r['reason']}"
        )
        if r["verdict"] == FAIL:
            lines.append(
                f"           last good {r['last_good']}, first bad {r['first_bad']}; "
                f"changed: {r['changes']}"
            )
    found = verdicts["verdict"].value_counts()
    lines.append(
        "history verdicts: " + ", ".join(f"{found.get(v, 0)} {v}" for v in (FAIL, UNCERTAIN, PASS))
    )
    return "\n".join(lines)


def _pct_plain(table: pd.DataFrame) -> str:
    return f"{table.attrs.get('threshold', THRESHOLD) * 100:g} %"


# ---- command line ---------------------------------------------------------------------------
def _database(url: str | None, results: str) -> store.Database:
    resolved = store.resolve_url(url, results)
    if resolved is None:
        raise store.DatabaseUnavailable("the results database is off (--database off)")
    if resolved.startswith("sqlite:") and not url:
        path = store.sqlite_path(resolved)
        if path is not None and not path.exists():
            raise store.DatabaseUnavailable(
                f"{path}: no results database yet (a study's run writes it; or record existing "
                f"studies with: python -m dlscale history import {results}/<study> ...)"
            )
    return store.connect(resolved)


def import_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="python -m dlscale history import",
        description="Record study folders in the results database: every kept measurement of "
        "every cell, the preflight results and the verdict tables. Importing twice changes "
        "nothing.",
    )
    p.add_argument("folders", nargs="+", help="study folders, e.g. results/demo")
    p.add_argument("--database", help="a database URL (default: config's, as the workflow)")
    p.add_argument("--results", default="results", help="where the default SQLite file lies")
    a = p.parse_args(argv)
    url = store.resolve_url(a.database, a.results)
    if url is None:
        print("dlscale history import: the results database is off", file=sys.stderr)
        return 2
    try:
        db = store.connect(url)
    except store.DatabaseUnavailable as exc:
        print(f"dlscale history import: {exc}", file=sys.stderr)
        return 1
    status = 0
    try:
        for folder in map(Path, a.folders):
            if not folder.is_dir():
                print(f"{folder}: not a folder", file=sys.stderr)
                status = 2
                continue
            tables = [
                ("references", folder / "tables" / "verdicts.csv"),
                ("history", folder / "history" / "verdicts.csv"),
            ]
            done = store.record_study(db, folder, verdict_tables=tables)
            print(
                f"{folder}: {done.inserted} new row(s), {done.known} measurement(s) already "
                f"recorded, {len(done.invalid)} invalid file(s)"
            )
            for line in done.invalid[:10]:
                print(f"  not recorded: {line}")
        print(f"database {store.describe(url)}: {store.counts(db)}")
    finally:
        db.close()
    return status


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["import"]:
        return import_main(argv[1:])
    p = argparse.ArgumentParser(
        prog="python -m dlscale history",
        description="The history of configurations across studies in the results database: "
        "per series its runs (points) with n, median and interval, and each run's verdict "
        "against the series' last good run (PASS / FAIL / UNCERTAIN). "
        "`python -m dlscale history import FOLDER...` records existing study folders.",
    )
    for name in FILTERS:
        p.add_argument(f"--{name}", action="append", help=f"only this {name} (repeatable)")
    p.add_argument("--strategy", action="append", dest="parallelism_alias", help="= --parallelism")
    p.add_argument("--study", action="append", help="only the points of this study")
    p.add_argument(
        "--match",
        choices=sorted(MATCHES),
        default=DEFAULT_MATCH,
        help="series by cell identity, or by configuration with any software stack (default)",
    )
    p.add_argument("--threshold", type=float, default=THRESHOLD, help="slowdown that counts")
    p.add_argument(
        "--by",
        default="time",
        help="label points by time, commit, or a software name (torch, NCCL, 'GPU driver', ...)",
    )
    p.add_argument("--csv", help="write the table here (CSV)")
    p.add_argument("--figure", help="draw the trend here (PDF): one panel per series")
    p.add_argument("--database", help="a database URL (default: DLSCALE_DATABASE_URL, else "
                   "results/dlscale.sqlite)")  # fmt: skip
    p.add_argument("--results", default="results", help="where the default SQLite file lies")
    a = p.parse_args(argv)
    if not 0 < a.threshold < 1:
        p.error("--threshold is a fraction between 0 and 1, e.g. 0.05")
    filters = {name: getattr(a, name) for name in FILTERS}
    if a.parallelism_alias:
        filters["parallelism"] = (filters["parallelism"] or []) + a.parallelism_alias
    try:
        db = _database(a.database, a.results)
    except store.DatabaseUnavailable as exc:
        print(f"dlscale history: {exc}", file=sys.stderr)
        return 1
    try:
        measured = load(db, filters)
    finally:
        db.close()
    table = history_table(measured, a.match, a.threshold)
    table.attrs["threshold"] = a.threshold
    if a.study:
        keep = table.groupby("series")["study"].transform(lambda s: s.isin(a.study).any())
        table = table[keep]
    print(format_table(table, a.by))
    if a.csv:
        Path(a.csv).parent.mkdir(parents=True, exist_ok=True)
        table.to_csv(a.csv, index=False)
        print(f"table: {a.csv}")
    if a.figure:
        from dlscale.outputs.history_figure import draw_history

        draw_history(table, a.figure, by=a.by)
        print(f"figure: {a.figure}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

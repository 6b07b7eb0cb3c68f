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
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import math
import os
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from dlscale.analysis.stats import CI, EXACT, GROUP, RANGE, interval_label, with_axes
from dlscale.study.cell import AXES, DEFAULT_PARALLELISM
from dlscale.study.config import ConfigError, load_schema, schema_problems
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

# The metrics a reference may name: unit, and the scaling.csv column prefix of the measured
# median (None: dlscale does not measure it). Interval columns exist for the first two.
METRICS = {
    "throughput_samples_per_s": ("samples/s", "throughput_samples_per_s"),
    "scaling_efficiency": ("fraction", "scaling_efficiency"),
    "time_to_accuracy_s": ("s", None),
    "joules_per_sample": ("J/sample", "joules_per_sample"),
}
_INTERVAL_KIND = {"throughput_samples_per_s": "interval", "scaling_efficiency": "speedup_interval"}
NOT_MEASURED_BY_DLSCALE = {
    "time_to_accuracy_s": "the check compares the throughput cells (synthetic data); the "
    "convergence cells' time-to-accuracy (tables/time_to_accuracy.csv) is not compared yet",
}

PASS, FAIL, NO_REFERENCE, NOT_MEASURED = "PASS", "FAIL", "no-reference", "not-measured"
VERDICTS = (FAIL, NOT_MEASURED, PASS, NO_REFERENCE)  # the order of the tables
POINT = [*GROUP, "nodes"]
COLUMNS = [
    *POINT,
    "cell",
    "metric",
    "unit",
    "verdict",
    "measured",
    "interval_low",
    "interval_high",
    "interval",
    "n",
    "reference",
    "lower_bound",
    "upper_bound",
    "tolerance",
    "margin",
    "interval_vs_bounds",
    "reference_key",
    "note",
]
DEFAULT_TOLERANCE = 0.05
MAX_LISTED = 60  # rows of the report's verdict table


def cell_name(point) -> str:
    """A point's name below its hardware folder: framework/model/policy/precision/mode/n<nodes>
    (the cell's path, dlscale.study.cell.AXIS_PATH, without hardware and repetition)."""
    return "/".join(
        ("n" if a == "nodes" else "") + str(point[a])
        for a in AXES[1:]
        if a != "parallelism" or _value(point, a) not in (None, DEFAULT_PARALLELISM)
    )


def _value(point, key):
    """A point's value of a key it may lack (tables from before the key existed)."""
    try:
        return point[key]
    except (KeyError, IndexError):
        return None


def best_reference(refs: list[Reference], hardware: str, cell: str, metric: str):
    """The most specific reference for a point's metric: an exact system before '*', then the
    pattern with the most literal characters, then the first in the file; None when none."""
    matches = [
        r
        for r in refs
        if r.metric == metric
        and r.system in (hardware, WILDCARD)
        and fnmatch.fnmatchcase(cell, r.pattern)
    ]
    return max(matches, key=Reference.specificity, default=None)


def _measured(row, metric: str) -> tuple[float, float, float, str, int] | None:
    """(median, low, high, interval kind, n) of a scaling row's metric; None when not
    measured (no row, no column, or NaN)."""
    column = METRICS[metric][1]
    if row is None or column is None:
        return None
    value = row.get(f"{column}_median")
    if value is None or pd.isna(value):
        return None
    kind_col = _INTERVAL_KIND.get(metric)
    kind = row[kind_col] if kind_col else "none"
    low = row.get(f"{column}_ci_low", np.nan)
    high = row.get(f"{column}_ci_high", np.nan)
    return float(value), float(low), float(high), str(kind), int(row["n"])


def _vs_bounds(low: float, high: float, kind: str, bounds: tuple[float, float]) -> str:
    if kind not in (CI, RANGE) or pd.isna(low) or pd.isna(high):
        return "no interval"
    if low >= bounds[0] and high <= bounds[1]:
        return "inside"
    if high < bounds[0] or low > bounds[1]:
        return "outside"
    return "overlaps"


def verdicts(scaling: pd.DataFrame, status: pd.DataFrame, refs: list[Reference]) -> pd.DataFrame:
    """One row per scaling point and metric with a reference or a measured value (COLUMNS).
    `status`: every planned cell (status.csv), so a referenced point whose cells all failed is
    not-measured rather than absent; may be empty."""
    points: dict[tuple, dict] = {}
    for table in (status, scaling):
        if table is None or table.empty:
            continue
        for r in table.to_dict("records"):
            key = tuple(r[a] for a in POINT)
            points.setdefault(key, {a: r[a] for a in POINT})
    by_point = {tuple(r[a] for a in POINT): r for r in scaling.to_dict("records")}
    rows = []
    for key in sorted(points, key=lambda k: tuple(str(v) for v in k[:-1]) + (int(k[-1]),)):
        point = points[key]
        cell = cell_name(point)
        row = by_point.get(key)
        for metric, (unit, _) in METRICS.items():
            ref = best_reference(refs, str(point["hardware"]), cell, metric)
            got = _measured(row, metric)
            if ref is None and got is None:
                continue
            if ref is None and metric == "scaling_efficiency" and row["speedup_interval"] == EXACT:
                continue  # the baseline's efficiency is 1 by definition: nothing to check
            out = {**point, "cell": cell, "metric": metric, "unit": unit}
            if got is not None:
                value, low, high, kind, n = got
                out.update(
                    measured=value,
                    interval_low=low,
                    interval_high=high,
                    interval=interval_label(kind, n),
                    n=n,
                )
            if ref is None:
                out.update(verdict=NO_REFERENCE, note="no reference matches this cell")
            else:
                low_b, high_b = ref.bounds()
                out.update(
                    reference=ref.value,
                    lower_bound=low_b if math.isfinite(low_b) else np.nan,
                    upper_bound=high_b if math.isfinite(high_b) else np.nan,
                    tolerance=ref.tolerance(),
                    reference_key=ref.key,
                )
                if got is None:
                    out.update(verdict=NOT_MEASURED, note=_why_not_measured(metric, row))
                else:
                    margin = min(value - low_b, high_b - value) / ref.value
                    passed = low_b <= value <= high_b
                    out.update(
                        verdict=PASS if passed else FAIL,
                        margin=margin if math.isfinite(margin) else np.nan,
                        interval_vs_bounds=_vs_bounds(low, high, kind, (low_b, high_b)),
                        note="" if passed else _fail_note(value, low_b, high_b, ref),
                    )
            rows.append(out)
    out = pd.DataFrame(rows, columns=COLUMNS)
    if not out.empty:
        out["nodes"] = out["nodes"].astype(int)
    return out


def _why_not_measured(metric: str, row) -> str:
    if metric in NOT_MEASURED_BY_DLSCALE:
        return NOT_MEASURED_BY_DLSCALE[metric]
    if row is None:
        return "no measured cell (failed or missing: status.csv)"
    if metric == "joules_per_sample":
        return "no energy counter was readable (cells.csv: energy_unavailable)"
    return "not measured"


def _fail_note(value: float, low_b: float, high_b: float, ref: Reference) -> str:
    side, bound = ("below", low_b) if value < low_b else ("above", high_b)
    return (
        f"{abs(value / bound - 1):.1%} {side} the {'lower' if side == 'below' else 'upper'} bound"
    )


def unused_references(refs: list[Reference], verdict_table: pd.DataFrame, hardware) -> list[str]:
    """References for this study's systems (or '*') that matched no point: a stale pattern."""
    used = set(verdict_table["reference_key"].dropna()) if not verdict_table.empty else set()
    systems = set(map(str, hardware))
    return sorted(
        {
            f"{r.key} {r.metric}"
            for r in refs
            if (r.system in systems or r.system == WILDCARD) and r.key not in used
        }
    )


def counts(table: pd.DataFrame) -> dict[str, int]:
    return {v: int((table["verdict"] == v).sum()) if not table.empty else 0 for v in VERDICTS}


def summary_line(table: pd.DataFrame) -> str:
    c = counts(table)
    return ", ".join(f"{c[v]} {v}" for v in (PASS, FAIL, NOT_MEASURED, NO_REFERENCE))


# ---- the tables --------------------------------------------------------------------------------


def _num(x, digits: int = 4) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)) or pd.isna(x):
        return "--"
    return f"{x:.{digits}g}"


def _pct(x) -> str:
    return "--" if x is None or pd.isna(x) else f"{x * 100:+.1f} %"


def format_verdicts(table: pd.DataFrame, *, all_rows: bool = False) -> str:
    """A plain-text table for the terminal: every row with a reference (FAIL first); the
    no-reference rows only counted unless all_rows."""
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
    return "\n".join(lines)


def write_verdicts_tex(
    table: pd.DataFrame, out: str | Path, *, references_file: str, unused: list[str]
) -> None:
    """The report's regression-check section body: a generated sentence with the counts and the
    rows with a reference (FAIL first, at most MAX_LISTED); no-reference rows are counted."""
    from dlscale.outputs.report import tex_escape

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
) -> pd.DataFrame:
    """The verdicts rule: tables + references -> verdicts.csv (and the report's table)."""
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
    if log:
        Path(log).parent.mkdir(parents=True, exist_ok=True)
        Path(log).write_text(
            f"{len(refs)} references from {references_file}; verdicts: {summary_line(table)}"
            + (f"; {len(unused)} unused reference(s): {'; '.join(unused)}" if unused else "")
            + "\n"
        )
    return table


def check_table(table: pd.DataFrame, out=None, *, all_rows: bool = False) -> int:
    """Print the verdicts; 1 when any is FAIL, else 0."""
    out = out or sys.stdout
    print(format_verdicts(table, all_rows=all_rows), file=out)
    failed = counts(table)[FAIL]
    if failed:
        print(f"dlscale check: {failed} {FAILED_MARK}", file=out)
    return 1 if failed else 0


def enforce_verdicts(verdicts_csv: str, log: str) -> None:
    """The check rule: print the verdicts (and write them to `log`); raise on any FAIL so the
    run exits non-zero."""
    import io

    buffer = io.StringIO()
    code = check_table(pd.read_csv(verdicts_csv), buffer)
    Path(log).parent.mkdir(parents=True, exist_ok=True)
    Path(log).write_text(buffer.getvalue())
    print(buffer.getvalue(), end="")
    if code:
        raise RuntimeError(
            f"dlscale check: {counts(pd.read_csv(verdicts_csv))[FAIL]} {FAILED_MARK} "
            f"(table: {verdicts_csv})"
        )


# ---- bless: the current results become the references of one system ----------------------------


def proposed_references(scaling: pd.DataFrame, system: str, tolerance: float) -> dict:
    """{cell pattern: {metric: reference}} from a study's scaling table for one system: the
    median as value, the tolerance widened to cover the median's interval where there is one.
    The baseline's efficiency (1 by definition) is left out."""
    out: dict[str, dict] = {}
    for row in scaling[scaling["hardware"].astype(str) == system].to_dict("records"):
        cell = cell_name(row)
        for metric in ("throughput_samples_per_s", "scaling_efficiency", "joules_per_sample"):
            if metric == "scaling_efficiency" and row["speedup_interval"] == EXACT:
                continue
            got = _measured(row, metric)
            if got is None:
                continue
            value, low, high, _, _ = got
            lower, upper = -tolerance, tolerance
            if not pd.isna(low) and not pd.isna(high) and value > 0:
                lower = min(lower, low / value - 1)
                upper = max(upper, high / value - 1)
            out.setdefault(cell, {})[metric] = {
                "value": float(f"{value:.6g}"),
                "lower": math.floor(max(lower, -1.0) * 1e4) / 1e4,
                "upper": math.ceil(upper * 1e4) / 1e4,
                "unit": METRICS[metric][0],
            }
    return out


def _signed(x) -> str:
    return "unbounded" if x is None else f"{x:+g}"


def _leading_comments(text: str) -> tuple[list[str], int]:
    """The file's header (comment and blank lines before the first content line) and how many
    comment lines follow it (not kept when the file is rewritten)."""
    lines = text.splitlines()
    head = []
    for line in lines:
        if line.strip() == "" or line.lstrip().startswith("#"):
            head.append(line)
        else:
            break
    rest = lines[len(head) :]
    return head, sum(1 for line in rest if line.lstrip().startswith("#") or " #" in line)


def _dump(data: dict) -> str:
    def scalar(v):
        return "null" if v is None else json.dumps(v)

    lines = ["references:" + (" {}" if not data else "")]
    for system, cells in data.items():
        lines.append(f"  {json.dumps(system) if system == WILDCARD else system}:")
        for pattern, metrics in cells.items():
            lines.append(f"    {json.dumps(pattern)}:")
            for metric, r in metrics.items():
                fields = ", ".join(
                    f"{k}: {scalar(r[k])}" for k in ("value", "lower", "upper", "unit")
                )
                lines.append(f"      {metric}: {{{fields}}}")
    return "\n".join(lines) + "\n"


def bless(
    results_dir: str | Path,
    system: str,
    references_file: str | Path,
    *,
    tolerance: float = DEFAULT_TOLERANCE,
    force: bool = False,
    dry_run: bool = False,
    schema: str | Path | None = None,
    out=None,
) -> int:
    """Record a study's current results as the references of `system`: print every entry it
    adds or replaces, refuse to replace an existing one without `force`, write nothing with
    `dry_run`. Returns an exit code (0 written or nothing to do, 2 refused)."""
    out = out or sys.stdout
    scaling_csv = Path(results_dir) / "tables" / "scaling.csv"
    if not scaling_csv.is_file():
        print(f"dlscale bless: {scaling_csv} not found (run the study first)", file=out)
        return 2
    scaling = with_axes(pd.read_csv(scaling_csv))  # before the parallelism axis: ddp
    proposed = proposed_references(scaling, system, tolerance)
    if not proposed:
        present = ", ".join(sorted(map(str, scaling["hardware"].unique()))) or "none"
        print(
            f"dlscale bless: no measured cell on system {system!r} (systems: {present})", file=out
        )
        return 2
    path = Path(references_file)
    text = path.read_text() if path.exists() else ""
    data = read_reference_file(path, schema) if path.exists() else {}
    current = {s: dict(c) for s, c in (data.get("references") or {}).items()}
    mine = current.setdefault(system, {})
    added, replaced = [], []
    for cell, metrics in proposed.items():
        have = mine.setdefault(cell, {})
        for metric, ref in metrics.items():
            entry = (
                f"{system}: {cell} {metric} = {ref['value']:g} {ref['unit']} "
                f"({_signed(ref['lower'])}/{_signed(ref['upper'])})"
            )
            if metric in have and have[metric] != ref:
                old = have[metric]
                replaced.append(
                    f"~ {entry}  [was {old['value']:g} {old['unit']} "
                    f"({_signed(old['lower'])}/{_signed(old['upper'])})]"
                )
            elif metric not in have:
                added.append(f"+ {entry}")
            have[metric] = ref
    print(
        f"dlscale bless: {results_dir} -> {path} (system {system}, tolerance +-{tolerance:g})",
        file=out,
    )
    for line in added + replaced:
        print(line, file=out)
    if not added and not replaced:
        print("nothing to change: the references already hold these results", file=out)
        return 0
    if replaced and not force:
        print(
            f"dlscale bless: refused: {len(replaced)} existing reference(s) would be replaced "
            "(~ above); rerun with --force to replace them. Nothing was written.",
            file=out,
        )
        return 2
    if dry_run:
        print("dry run: nothing was written", file=out)
        return 0
    head, dropped = _leading_comments(text)
    new_text = ("\n".join(head) + "\n" if head else "") + _dump(current)
    problems = schema_problems(
        load_yaml_text(new_text, str(path)), load_schema(schema or schema_path())
    )
    if problems:  # never write a file the workflow would refuse
        raise ConfigError(str(path), problems)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(new_text)
    os.replace(tmp, path)
    print(f"wrote {len(added)} new and {len(replaced)} replaced reference(s) to {path}", file=out)
    if dropped:
        print(f"note: {dropped} comment line(s) below the file's header were not kept", file=out)
    return 0


def load_yaml_text(text: str, source: str):
    from dlscale.study.config import parse_yaml

    return parse_yaml(text, source)


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
    a = p.parse_args(argv)
    if bool(a.results) == bool(a.verdicts):
        p.error("give a results folder or --verdicts FILE")
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
    return check_table(table, all_rows=a.all)


if __name__ == "__main__":
    sys.exit(main())

"""History you can ask: a configuration's throughput across studies, over time, commits and
software versions, and whether its newest run is slower than before, beyond the noise.

The results database (dlscale.store.database) holds every measurement of every study. Here:

- **A series** is one configuration: the throughput cells of one hardware entry, framework,
  model, batch policy, precision, mode, parallelism, node count and ranks per node, with the
  same identity hash: `series` (the cell identity but for the repetition: the same software)
  or `configuration` (the same but for the software stack: framework environment, modules,
  variables), as `match` asks (identity or software; MATCHES).
- **A point** (a run) of a series is what one study measured of it on one software stack
  (`stack`: the hash of the measurement's software versions but its nodes and dlscale's
  commit, dlscale.store.result_rows.NOT_STACK): its
  repetitions are the samples; its median and the median's interval
  (dlscale.analysis.stats.median_interval: the order-statistic 95 % CI where n >= 6, the range
  below) and n are what the table and the trend figure show. Points are ordered by their first
  measurement.
- **Verdicts** walk each series in time: every point is compared with the series' last good
  point (the first point, then the latest that passed) by
  dlscale.analysis.regression_stats.slowdown_verdict (PASS / FAIL / UNCERTAIN, a Hodges-Lehmann
  interval of the slowdown at the repetitions at hand). A FAIL names what changed in
  provenance between the last good point and the first bad one (`changes`: every software
  version, the environment, the hardware entry, the nodes, dlscale's commit that differ).

`python -m dlscale history` (or `dlscale history`; dlscale.decisions.history_command) prints
the table of the series a query selects (by system, framework, model, strategy, nodes,
precision, study), draws the trend (`--figure`), exports CSV (`--csv`) and labels the points by
time, commit or a software version (`--by`); `dlscale history import FOLDER...` records
existing study folders (twice changes nothing). The workflow's `history` rule
(rules/history.smk) writes a study's own series: history/history.csv, history/verdicts.csv,
the report's History section and its figure.
"""

from __future__ import annotations

import json
import operator
import statistics
from collections import Counter
from dataclasses import dataclass

import pandas as pd
import sqlalchemy as sa

from dlscale.analysis.regression_stats import (
    FAIL,
    PASS,
    THRESHOLD,
    slowdown_verdict,
)
from dlscale.analysis.stats import interval_label, median_interval
from dlscale.outputs.history_figure import day
from dlscale.registry import frameworks
from dlscale.store import database as store
from dlscale.store.results_schema import measurements
from dlscale.study.cell import AXES

MEASURE = "throughput_samples_per_s"
# The columns a series is named by (its key), in the tables' order.
SERIES = (*AXES, "ranks_per_node")
# Which identity hash a series is matched by: the same cell identity, or the same but for the
# software stack.
MATCHES = {"identity": "series", "software": "configuration"}
DEFAULT_MATCH = "software"
# What a query may select on (command-line flags), besides the study.
FILTERS = AXES
FIRST = "first"  # the verdict column of a series' first point: nothing to compare with
# The software names the table shows for a point (where recorded), besides the commit: each
# framework's packages (its registry record's imports) and the GPU stack.
SHOWN_SOFTWARE = (
    *dict.fromkeys(m.split(".")[0] for f in frameworks.names() for m in frameworks.get(f).imports),
    "NCCL",
    "CUDA",
    "GPU driver",
)
LOADED = (
    "study",
    "cell",
    "measurement",
    *SERIES,
    "series",
    "configuration",
    "stack",
    "measured_at",
    MEASURE,
    "git_commit",
    "software",
    "competing",
)


# ---- reading --------------------------------------------------------------------------------
def _select(filters: dict | None = None, studies=(), hashes: tuple[str, list] | None = None):
    t = measurements
    query = sa.select(*(t.c[c] for c in LOADED)).where(t.c.workload == "throughput")
    for column, value in (filters or {}).items():
        if value is None or value == [] or value == ():
            continue
        values = value if isinstance(value, list | tuple | set) else [value]
        if column in ("nodes", "ranks_per_node"):
            values = [int(v) for v in values]
        query = query.where(t.c[column].in_([*values]))
    if studies:
        query = query.where(t.c.study.in_(list(studies)))
    if hashes is not None:
        query = query.where(t.c[hashes[0]].in_(hashes[1]))
    return query


AT = {name: i for i, name in enumerate(LOADED)}  # a loaded row's fields by name


def load(db: store.Database, filters: dict | None = None, studies=(), hashes=None) -> list:
    """The throughput measurements a query selects (filters: column -> value or values;
    `hashes`: (series or configuration, the hashes)), as tuples of LOADED (AT: by name)."""
    with db.read() as conn:
        rows = conn.execute(_select(filters, studies, hashes)).tuples().all()
    value = AT[MEASURE]
    return [r for r in rows if r[value] and r[value] > 0]


def study_hashes(db: store.Database, study: str, column: str) -> list[str]:
    """The identity hashes (series or configuration) of a study's throughput series."""
    t = measurements
    query = (
        sa.select(t.c[column]).where(t.c.study == study, t.c.workload == "throughput").distinct()
    )
    with db.read() as conn:
        return sorted(conn.execute(query).scalars())


@dataclass
class Point:
    """One run of a series: what one study measured of it on one software stack."""

    study: str
    stack: str
    first_at: pd.Timestamp
    values: list[float]
    software: dict[str, str]
    commit: str
    competing: int

    @property
    def n(self) -> int:
        return len(self.values)

    @property
    def software_all(self) -> str:
        """Every software name and version: "name version; ..." (labels by a version)."""
        return "; ".join(f"{k} {v}" for k, v in sorted(self.software.items()))


def _software_union(texts, parsed: dict) -> dict[str, str]:
    """The software of a point's measurements, each name's values joined (nodes differ);
    `parsed`: JSON texts already read (most rows of a point share one)."""
    seen: dict[str, list[str]] = {}
    for text in texts:
        if text not in parsed:
            parsed[text] = json.loads(text)
        for k, v in parsed[text].items():
            if v not in seen.setdefault(k, []):
                seen[k].append(v)
    return {k: " ".join(sorted(v)) for k, v in seen.items()}


def series_points(rows: list, match: str = DEFAULT_MATCH) -> dict[tuple, list[Point]]:
    """Per series (SERIES values and the match hash): its points, oldest first."""
    key = operator.itemgetter(*(AT[c] for c in (*SERIES, MATCHES[match])))
    run = operator.itemgetter(AT["study"], AT["stack"])
    grouped: dict[tuple, dict[tuple, list]] = {}
    for r in rows:
        grouped.setdefault(key(r), {}).setdefault(run(r), []).append(r)
    at, value, software = AT["measured_at"], AT[MEASURE], AT["software"]
    commit, competing = AT["git_commit"], AT["competing"]
    parsed: dict[str, dict] = {}
    out: dict[tuple, list[Point]] = {}
    for series, runs in grouped.items():
        points = [
            Point(
                study=study,
                stack=stack,
                first_at=pd.Timestamp(min(r[at] for r in members)),
                values=[float(r[value]) for r in members],
                software=_software_union({r[software] for r in members}, parsed),
                commit=str(members[0][commit] or ""),
                competing=sum(bool(r[competing]) for r in members),
            )
            for (study, stack), members in runs.items()
        ]
        points.sort(key=lambda p: (p.first_at, p.study))
        out[series] = points
    return out


# ---- judging --------------------------------------------------------------------------------
def changes(before: dict[str, str], after: dict[str, str]) -> list[str]:
    """What differs between two points' software (name: before -> after), names in order."""
    out = []
    for name in sorted(set(before) | set(after), key=str.lower):
        a, b = before.get(name, "none"), after.get(name, "none")
        if a != b:
            out.append(f"{name}: {a} -> {b}")
    return out


def judge(points: list[Point], threshold: float = THRESHOLD) -> list[dict]:
    """Each point's verdict against the series' last good point (module docstring): one dict
    per point with the point's numbers, its baseline, the verdict and, for a FAIL, the first
    bad point and what changed between the two."""
    rows = []
    good: Point | None = None
    first_bad: Point | None = None
    for p in points:
        low, high, kind = median_interval(p.values)
        row = {
            "study": p.study,
            "first_measured": p.first_at,
            "commit": p.commit,
            "stack": p.stack,
            "n": p.n,
            "median": float(statistics.median(p.values)),
            "interval_low": low,
            "interval_high": high,
            "interval": interval_label(kind, p.n),
            "competing": p.competing,
            "software": "; ".join(
                f"{k} {p.software[k]}" for k in SHOWN_SOFTWARE if k in p.software
            ),
            "software_all": p.software_all,
            "baseline_study": None,
            "baseline_first_measured": None,
            "n_baseline": None,
            "verdict": FIRST,
            "slowdown": None,
            "slowdown_low": None,
            "slowdown_high": None,
            "needed_n": None,
            "reason": "the series' first point: nothing to compare with",
            "last_good": None,
            "first_bad": None,
            "changes": "",
        }
        if good is None:
            good = p
            rows.append(row)
            continue
        v = slowdown_verdict(p.values, good.values, threshold)
        row.update(
            baseline_study=good.study,
            baseline_first_measured=good.first_at,
            n_baseline=good.n,
            verdict=v.verdict,
            slowdown=v.slowdown,
            slowdown_low=v.slowdown_low,
            slowdown_high=v.slowdown_high,
            needed_n=v.needed_n,
            reason=v.reason,
        )
        if v.verdict == FAIL:
            first_bad = first_bad or p
            row.update(
                last_good=f"{good.study} ({day(good.first_at)})",
                first_bad=f"{first_bad.study} ({day(first_bad.first_at)})",
                changes="; ".join(changes(good.software, first_bad.software))
                or "nothing recorded differs",
            )
        elif v.verdict == PASS:
            good, first_bad = p, None
        rows.append(row)
    return rows


def series_label(series: tuple) -> str:
    """hardware/framework/model/policy/precision/mode/parallelism/n<nodes> (rpn where not 1)."""
    d = dict(zip(SERIES, series))
    rpn = f"/rpn{d['ranks_per_node']}" if d["ranks_per_node"] != 1 else ""
    return "/".join(str(d[k]) for k in SERIES[:7]) + f"/n{d['nodes']}{rpn}"


def history_table(
    measured: list, match: str = DEFAULT_MATCH, threshold: float = THRESHOLD
) -> pd.DataFrame:
    """One row per point of every series among the `measured` rows (load), judged (judge),
    series by series. `software_all` holds each point's every version (labels, not CSV)."""
    rows = []
    points_of = series_points(measured, match)
    # axes alike, identities apart (another launcher, batch, step count, ...): each its series,
    # told apart by its hash's start
    alike = Counter(series_label(series) for series in points_of)
    for series, points in sorted(points_of.items(), key=lambda kv: kv[0]):
        label = series_label(series)
        if alike[label] > 1:
            label += f" #{series[-1][:8]}"
        for i, row in enumerate(judge(points, threshold)):
            rows.append(
                {
                    "series": label,
                    **dict(zip(SERIES, series[:-1])),
                    "match": match,
                    "series_hash": series[-1],
                    "point": i + 1,
                    "points": len(points),
                    **row,
                }
            )
    return pd.DataFrame(rows, columns=[*HISTORY_COLUMNS, "software_all"])


HISTORY_COLUMNS = [
    "series",
    *SERIES,
    "match",
    "series_hash",
    "point",
    "points",
    "study",
    "first_measured",
    "commit",
    "stack",
    "software",
    "n",
    "median",
    "interval_low",
    "interval_high",
    "interval",
    "competing",
    "baseline_study",
    "baseline_first_measured",
    "n_baseline",
    "verdict",
    "slowdown",
    "slowdown_low",
    "slowdown_high",
    "needed_n",
    "reason",
    "last_good",
    "first_bad",
    "changes",
]


def latest_verdicts(table: pd.DataFrame, study: str | None = None) -> pd.DataFrame:
    """Per series: its newest point (of `study`, where given) with its verdict: what a check
    against the history reports."""
    if table.empty:
        return table.iloc[0:0]
    rows = table if study is None else table[table["study"] == study]
    return rows.sort_values(["series", "point"]).groupby("series", sort=True).tail(1)


# ---- a study's own history (the workflow's `history` rule) ------------------------------------
@dataclass
class StudyHistory:
    """What the `history` rule found for a study: its series' table and verdicts, or why
    there is none."""

    table: pd.DataFrame
    verdicts: pd.DataFrame
    note: str  # the report's sentence when there is no comparison (else "")
    database: str


VERDICT_COLUMNS = [
    "hardware",
    "series",
    "metric",
    "verdict",
    "measured",
    "n",
    "baseline_study",
    "n_baseline",
    "slowdown",
    "slowdown_low",
    "slowdown_high",
    "threshold",
    "needed_n",
    "reason",
    "last_good",
    "first_bad",
    "changes",
]


def study_history(
    db: store.Database, study: str, match: str = DEFAULT_MATCH, threshold: float = THRESHOLD
) -> StudyHistory:
    """The history of every series the study measured (its own points and every earlier one
    of the same configuration, any study), judged; the verdicts of the study's newest points."""
    column = MATCHES[match]
    hashes = study_hashes(db, study, column)
    where = store.describe(db.url)
    if not hashes:
        return StudyHistory(
            pd.DataFrame(columns=HISTORY_COLUMNS),
            pd.DataFrame(columns=VERDICT_COLUMNS),
            "this study has no throughput measurement in the results database",
            where,
        )
    table = history_table(load(db, hashes=(column, hashes)), match, threshold)
    newest = latest_verdicts(table, study)
    judged = newest[newest["verdict"] != FIRST]
    verdicts = pd.DataFrame(
        [
            {
                "hardware": r["hardware"],
                "series": r["series"],
                "metric": MEASURE,
                "verdict": r["verdict"],
                "measured": r["median"],
                "n": r["n"],
                "baseline_study": r["baseline_study"],
                "n_baseline": r["n_baseline"],
                "slowdown": r["slowdown"],
                "slowdown_low": r["slowdown_low"],
                "slowdown_high": r["slowdown_high"],
                "threshold": threshold,
                "needed_n": r["needed_n"],
                "reason": r["reason"],
                "last_good": r["last_good"],
                "first_bad": r["first_bad"],
                "changes": r["changes"],
            }
            for r in judged.to_dict("records")
        ],
        columns=VERDICT_COLUMNS,
    )
    note = ""
    if judged.empty:
        note = (
            f"no earlier results of this study's {len(newest)} series in the results "
            "database: each is its series' first point"
        )
    return StudyHistory(table, verdicts, note, where)

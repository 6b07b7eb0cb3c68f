"""Bless (dlscale.decisions.regression_check bless): a study's current results become the
regression references of one system in config/references.yaml; every entry added or replaced is
printed, an existing one is replaced only with --force, and the file written is checked against
its schema first."""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path

import pandas as pd
import yaml

from dlscale.analysis.stats import EXACT, with_axes
from dlscale.decisions.reference_verdicts import METRICS, _measured, cell_name
from dlscale.study.config import ConfigError, load_schema, schema_problems
from dlscale.study.references import WILDCARD, read_reference_file, schema_path

DEFAULT_TOLERANCE = 0.05


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


def _dump(data: dict, published: list | None = None) -> str:
    """The file's `references:` as bless writes them, then its `published:` entries as read
    (dlscale.decisions.published), kept whole."""

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
    text = "\n".join(lines) + "\n"
    if published:
        text += yaml.safe_dump({"published": published}, sort_keys=False, allow_unicode=True)
    return text


def _merge(proposed: dict, mine: dict, system: str) -> tuple[list[str], list[str]]:
    """Put the proposed references into `mine` (one system's); the entries added (+) and
    replaced (~, with the old value), as printed."""
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
    return added, replaced


def _write_references(
    path: Path, text: str, current: dict, schema, changed: tuple, out, published=None
) -> None:
    """Write the references file (its header comments and its published entries kept) after
    checking it against the schema; `changed`: how many entries were added and replaced, as
    printed."""
    added, replaced = changed
    head, dropped = _leading_comments(text)
    new_text = ("\n".join(head) + "\n" if head else "") + _dump(current, published)
    problems = schema_problems(
        load_yaml_text(new_text, str(path)), load_schema(schema or schema_path())
    )
    if problems:  # never write a file the workflow would refuse
        raise ConfigError(str(path), problems)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(new_text)
    os.replace(tmp, path)
    print(f"wrote {added} new and {replaced} replaced reference(s) to {path}", file=out)
    if dropped:
        print(f"note: {dropped} comment line(s) below the file's header were not kept", file=out)


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
    added, replaced = _merge(proposed, mine, system)
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
    _write_references(
        path, text, current, schema, (len(added), len(replaced)), out, data.get("published")
    )
    return 0


def load_yaml_text(text: str, source: str):
    from dlscale.study.config import parse_yaml

    return parse_yaml(text, source)

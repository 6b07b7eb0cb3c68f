"""Regression references (config/references.yaml): reading, validating and the failed-check
mark. Pure Python (PyYAML and jsonschema through dlscale.study.config), so the workflow can validate
the references file at parse time without importing pandas or scipy
(dlscale.decisions.regression_check, which
computes the verdicts, imports them; every Slurm job's snakemake parses the workflow again)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from dlscale.study.config import ConfigError, load_schema, load_yaml, schema_problems

WILDCARD = "*"
REFERENCES_SCHEMA = Path("config") / "schemas" / "references.schema.json"
DEFAULT_REFERENCES = Path("config") / "references.yaml"
FAILED_MARK = "FAIL verdict(s)"  # what a failed check prints (and its log holds)


@dataclass(frozen=True)
class Reference:
    system: str
    pattern: str
    metric: str
    value: float
    lower: float | None
    upper: float | None
    unit: str
    order: int  # position in the file: the last tie-break

    @property
    def key(self) -> str:
        return f"{self.system}: {self.pattern}"

    def bounds(self) -> tuple[float, float]:
        low = -math.inf if self.lower is None else self.value * (1 + self.lower)
        high = math.inf if self.upper is None else self.value * (1 + self.upper)
        return low, high

    def tolerance(self) -> str:
        def pct(x):
            return "unbounded" if x is None else f"{x * 100:+g} %"

        return f"{pct(self.lower)} / {pct(self.upper)}"

    def specificity(self) -> tuple:
        literal = sum(c not in "*?[]!" for c in self.pattern)
        return (self.system != WILDCARD, literal, -self.order)


def schema_path(workflow_dir: str | Path | None = None) -> Path:
    """The references schema: under the workflow directory given, else under the current
    directory, else beside the package's checkout (an editable install)."""
    candidates = [Path(workflow_dir)] if workflow_dir else []
    candidates += [Path.cwd(), Path(__file__).resolve().parents[3]]
    for base in candidates:
        if (base / REFERENCES_SCHEMA).is_file():
            return base / REFERENCES_SCHEMA
    raise FileNotFoundError(f"{REFERENCES_SCHEMA} not found (looked in {candidates})")


def read_reference_file(path: str | Path, schema: str | Path | None = None) -> dict:
    """The file's content, schema-validated (every problem named at once, ConfigError)."""
    data = load_yaml(path, source=str(path))
    if data is None:
        data = {}
    problems = schema_problems(data, load_schema(schema or schema_path()))
    if problems:
        raise ConfigError(str(path), problems)
    return data


def load_references(path: str | Path, schema: str | Path | None = None) -> list[Reference]:
    data = read_reference_file(path, schema)
    refs = []
    for system, cells in (data.get("references") or {}).items():
        for pattern, metrics in cells.items():
            for metric, r in metrics.items():
                refs.append(
                    Reference(
                        system,
                        pattern,
                        metric,
                        float(r["value"]),
                        r["lower"],
                        r["upper"],
                        r["unit"],
                        len(refs),
                    )
                )
    return refs


def load_published(path: str | Path, schema: str | Path | None = None) -> list[dict]:
    """The file's `published:` entries (dlscale.decisions.published), schema-validated."""
    return list(read_reference_file(path, schema).get("published") or [])


def failed_since(log: str, since: float) -> bool:
    """True when a check job wrote FAIL verdicts to `log` after `since` (the onerror handler:
    a failed check leaves a complete study, so no partial build)."""
    try:
        return Path(log).stat().st_mtime >= since and FAILED_MARK in Path(log).read_text()
    except OSError:
        return False

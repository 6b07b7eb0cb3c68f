"""Move results of the layout before studies had their own folders into the current layout.

    python -m dlscale.store.migrate [--results results] [--dry-run]

Before, every study wrote `results/runs/<axes>/metrics.jsonl`, `results/tables/...` and so on,
so two studies with common cells shared (and overwrote) them. Now each study has
`results/<study>/`. This command moves each old cell folder to the study its metrics file names
(`run_start.study`); a cell whose new place already holds a measurement keeps that one as its
current measurement and gets the old one as an earlier measurement (measurements/). Everything
else of the old layout (tables, figures, report, logs, cells without a readable metrics file) is
moved, unchanged, into `results/_before-studies-<time>/`. Nothing is deleted or overwritten;
running it again finds nothing to do.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import time
from pathlib import Path

from dlscale.store.measurements import adopt_unarchived, measurement_id
from dlscale.study.cell import AXIS_PATH, KEY, MEASUREMENTS_DIR, METRICS_FILE

LEGACY_RUNS = "runs"  # results/runs/<axes>/metrics.jsonl
LEGACY_PARTS = (
    "tables",
    "figures",
    "report",
    "partial",
    "logs/train",
    "logs/figures",
    "logs/collect.log",
    "logs/report_inputs.log",
    "logs/report_tex.log",
    "logs/report_pdf.log",
)
_LEGACY_CELL = re.compile(
    re.escape(AXIS_PATH)
    .replace(r"\{", "{")
    .replace(r"\}", "}")
    .format(**{k: f"(?P<{k}>[^/]+)" for k in KEY})
)


def _study_of(metrics: Path) -> str | None:
    try:
        with open(metrics) as fh:
            study = json.loads(fh.readline())["value"]["study"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return study if isinstance(study, str) and re.fullmatch(r"[A-Za-z0-9_.-]+", study) else None


def plan(results: Path) -> tuple[list[tuple[Path, Path]], list[Path]]:
    """(cell folders to move to their study's runs/, everything else of the old layout)."""
    runs = results / LEGACY_RUNS
    cells, rest = [], []
    if runs.is_dir():
        for metrics in sorted(runs.rglob(METRICS_FILE)):
            if MEASUREMENTS_DIR in metrics.relative_to(runs).parts:
                continue
            folder = metrics.parent
            rel = folder.relative_to(runs).as_posix()
            study = _study_of(metrics)
            if _LEGACY_CELL.fullmatch(rel) and study:
                # the study's folder, STUDY_DIR, under this results folder
                cells.append((folder, results / study / "runs" / rel))
        rest.append(runs)
    rest += [results / part for part in LEGACY_PARTS if (results / part).exists()]
    return cells, rest


def move_cell(src: Path, dest: Path) -> str:
    """Move one old cell folder; never over an existing measurement."""
    if not (dest / METRICS_FILE).exists():
        dest.parent.mkdir(parents=True, exist_ok=True)
        if dest.exists():  # a folder without a measurement (a failed cell's records)
            for item in src.iterdir():
                target = dest / item.name
                if not target.exists():
                    shutil.move(str(item), str(target))
        else:
            shutil.move(str(src), str(dest))
        adopt_unarchived([dest / METRICS_FILE])
        return "moved"
    adopt_unarchived([dest / METRICS_FILE])  # the current one first has its own folder
    folder = (
        dest / MEASUREMENTS_DIR / measurement_id("migrated", (src / METRICS_FILE).stat().st_mtime)
    )
    folder.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(str(src), str(folder))
    return "kept as an earlier measurement"


def migrate(results: Path, dry_run: bool = False, out=sys.stdout) -> dict:
    cells, rest = plan(results)
    done = {"cells": len(cells), "other": len(rest)}
    for src, dest in cells:
        what = "would move" if dry_run else move_cell(src, dest)
        print(f"{src} -> {dest}: {what}", file=out)
    if rest:
        keep = results / f"_before-studies-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}"
        for path in rest:
            if not path.exists():  # runs/ emptied by the moves above
                continue
            target = keep / path.relative_to(results)
            print(f"{path} -> {target}" + (" (dry run)" if dry_run else ""), file=out)
            if not dry_run:
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.move(str(path), str(target))
        done["kept_in"] = str(keep)
    if not cells and not rest:
        print(f"{results}: nothing of the old layout; nothing to do", file=out)
    return done


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m dlscale.store.migrate", description=__doc__.split("\n\n")[0]
    )
    p.add_argument(
        "--results",
        type=Path,
        default=Path("results"),
        help="the results folder (default: results)",
    )
    p.add_argument("--dry-run", action="store_true", help="print what would move, move nothing")
    a = p.parse_args(argv)
    migrate(a.results, a.dry_run)
    return 0


if __name__ == "__main__":
    sys.exit(main())

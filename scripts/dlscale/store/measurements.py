"""A measured cell is never silently destroyed.

- Every measurement is kept in its own folder, `<cell>/measurements/<time>-<job>/` (metrics,
  the ranks' logs, the Slurm job), and the cell's `metrics.jsonl` is a hard link to the current
  one (`keep_measurement`, called by the launcher). When Snakemake removes `metrics.jsonl` to
  re-measure a cell (`--forcerun`, a re-measure the user asked for), only the link goes; the
  earlier measurement stays, with its provenance. A `metrics.jsonl` from before this layout (a
  plain file) is adopted into a measurement folder the first time the workflow plans its cell
  (`adopt_unarchived`), before anything could remove it.
- A measured cell whose identity (`Cell.identity`: axes, batch sizes, steps, optimizer,
  launcher, hardware entry, framework environment) differs from the cell the workflow now plans
  is not re-measured unless the user asks (`changed_cells`, checked when the workflow is parsed).
- A study keeps the launcher it was measured with (`keep_measured_launchers`): a run with
  another launcher (the local profile on a study measured with srun) rebuilds its tables,
  figures and report from the measurements and measures no cell; a cell is measured, or
  re-measured, only with the profile and launcher the study was measured with.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import time
from pathlib import Path

from dlscale.study.cell import (
    CHANGED_DEFAULTS,
    LATER_FIELDS,
    MEASUREMENTS_DIR,
    METRICS_FILE,
    NOT_IDENTITY,
    STUDY_DIR,
    WORKLOAD_DIRS,
    Cell,
)

# What the config asks for to re-measure changed cells (rules/common.smk).
REMEASURE_FLAG = "--config remeasure=True"


def measurement_id(tag: str | None = None, when: float | None = None) -> str:
    """<UTC time>-<tag>, the tag job<Slurm job id> or pid<pid> by default: unique per
    measurement, sorted by time."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(when if when is not None else time.time()))
    return f"{stamp}-{tag or 'pid' + str(os.getpid())}"


def link_current(measurement: Path, output: Path) -> None:
    """Make `output` (the cell's metrics.jsonl) a hard link to the measurement's metrics, in one
    rename (a copy where the filesystem has no hard links)."""
    tmp = output.parent / f".{output.name}.link"
    tmp.unlink(missing_ok=True)
    try:
        os.link(measurement / METRICS_FILE, tmp)
    except OSError:
        shutil.copy2(measurement / METRICS_FILE, tmp)
    os.replace(tmp, output)


def keep_measurement(
    output: Path,
    records: list[dict],
    write_atomic,
    *,
    slurm_job_id=None,
    extra_files: list[Path] = (),
) -> Path:
    """Write a measurement into its own folder beside `output`, with `extra_files` (logs, the
    Slurm job record) copied in, and make `output` point at it. Returns the folder."""
    folder = (
        output.parent
        / MEASUREMENTS_DIR
        / measurement_id(f"job{slurm_job_id}" if slurm_job_id else None)
    )
    folder.mkdir(parents=True, exist_ok=False)
    for path in extra_files:
        if Path(path).is_file():
            shutil.copy2(path, folder / Path(path).name)
    write_atomic(folder / METRICS_FILE, records)
    link_current(folder, output)
    return folder


def measurements(output: Path) -> list[Path]:
    """The cell's kept measurement folders, oldest first."""
    root = Path(output).parent / MEASUREMENTS_DIR
    try:
        return sorted(p for p in root.iterdir() if (p / METRICS_FILE).is_file())
    except OSError:
        return []


def earlier_measurements(output: Path) -> int:
    """How many kept measurements of the cell are not its current one."""
    return max(0, len(measurements(output)) - (1 if Path(output).exists() else 0))


def adopt_unarchived(paths) -> list[str]:
    """Give every existing metrics file that is not in a measurement folder (a plain file from
    before this layout) a folder of its own, without moving or changing it. Returns those."""
    adopted = []
    for path in map(Path, paths):
        try:
            st = path.stat()
        except OSError:
            continue
        if st.st_nlink > 1 or measurements(path):
            continue
        folder = path.parent / MEASUREMENTS_DIR / (measurement_id("adopted", st.st_mtime))
        folder.mkdir(parents=True, exist_ok=True)
        try:
            os.link(path, folder / METRICS_FILE)
        except OSError:
            shutil.copy2(path, folder / METRICS_FILE)
        adopted.append(str(path))
    return adopted


def stored_identity(path: Path) -> dict | None:
    """The identity a measured cell was measured with, from its metrics file's run_start record
    (None when the file cannot be read: the tables quarantine it). Files written before the
    launcher was part of the cell have it in their provenance."""
    try:
        with open(path) as fh:
            first = json.loads(fh.readline())
        value = first["value"]
        cell = dict(value["cell"])
        cell.setdefault("launcher", value["provenance"]["launcher"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return cell


def changed_cells(cells: list[Cell]) -> list[tuple[Cell, dict]]:
    """Measured cells whose measurement was made with another identity than the planned one:
    [(cell, {field: (measured, planned)})]. Fields the file does not record are not compared,
    but for a changed default (CHANGED_DEFAULTS), which the file recorded by leaving it out:
    a decoder cell measured with SGD is flagged when `auto` now plans it with AdamW."""
    changed = []
    # each workload's cell folder of a study, looked at once: a study not measured yet (the
    # dry run of a new 10,000-cell study) costs one stat, not one per cell
    folders: dict[tuple[str, str], bool] = {}
    for cell in cells:
        top = (cell.study, cell.workload)
        if top not in folders:
            folders[top] = Path(
                STUDY_DIR.format(study=cell.study), WORKLOAD_DIRS[cell.workload]
            ).is_dir()
        if not folders[top]:
            continue
        path = Path(cell.path)
        if not path.exists():
            continue
        stored = stored_identity(path)
        if stored is None:
            continue
        # a changed default: a file (or a planned cell) without the field is at its earlier
        # value, compared both ways
        earlier = {k: LATER_FIELDS[k] for k in CHANGED_DEFAULTS}
        stored = {**earlier, **stored}
        diff = {
            k: (stored[k], v)
            for k, v in {**earlier, **cell.identity()}.items()
            if k in stored and k not in NOT_IDENTITY and stored[k] != v
        }
        if diff:
            changed.append((cell, diff))
    return changed


def describe_changes(
    changed: list[tuple[Cell, dict]], remeasure_command: str, limit: int = 20
) -> str:
    """The message that stops a run: how many cells, which fields, the first cells, and the
    command that re-measures them (the run's own, with remeasure=True in its one --config:
    dlscale.workflow.advice)."""
    fields = sorted({k for _, diff in changed for k in diff})
    lines = [
        f"{len(changed)} measured cell(s) were measured with another configuration than "
        f"the one planned now (differing: {', '.join(fields)}):"
    ]
    for cell, diff in changed[:limit]:
        what = "; ".join(f"{k}: measured {old!r}, now {new!r}" for k, (old, new) in diff.items())
        lines.append(f"  - {cell.path}: {what}")
    if len(changed) > limit:
        lines.append(f"  ... and {len(changed) - limit} more")
    lines.append(
        "Nothing was run or removed. Either keep these measurements (run this study with "
        "its previous settings, or give the new one another `study` name, which gives it "
        "its own results folder), or re-measure them (each current measurement stays in its "
        f"cell's {MEASUREMENTS_DIR}/ folder) with:\n  {remeasure_command}"
    )
    return "\n".join(lines)


def keep_measured_launchers(
    cells: list[Cell], changed: list[tuple[Cell, dict]]
) -> tuple[list[Cell], dict[str, str], list[tuple[Cell, dict]]]:
    """A study is re-measured, redrawn and re-reported with the launcher it was measured with.
    Each measured cell among `changed` (changed_cells) whose launcher differs from the planned
    one is planned with its measured launcher: its identity, so its job's parameters, stay the
    measured ones, and rebuilding the tables, figures and report from it runs no cell. Returns
    the cells, {path: measured launcher} of the cells kept so, and what is left of `changed`
    (the cells whose other fields differ, planned with their measured launcher)."""
    kept: dict[str, str] = {}
    replaced: dict[str, Cell] = {}
    left = []
    for cell, diff in changed:
        if "launcher" in diff:
            kept[cell.path] = diff["launcher"][0]
            cell = replaced[cell.path] = dataclasses.replace(cell, launcher=kept[cell.path])
            diff = {k: v for k, v in diff.items() if k != "launcher"}
        if diff:
            left.append((cell, diff))
    return [replaced.get(c.path, c) for c in cells], kept, left


def _measured_with(kept: dict[str, str]) -> str:
    return " and ".join(repr(name) for name in sorted(set(kept.values())))


def measured_launcher_notice(study: str, kept: dict[str, str], launcher: str, command: str) -> str:
    """What a run with another launcher than its study's says first (dry runs too)."""
    return (
        f"study {study!r} was measured with launcher {_measured_with(kept)} ({len(kept)} "
        f"cell(s)) and this run's launcher is {launcher!r}: its tables, figures and report are "
        "rebuilt from those measurements, and no cell is measured with another launcher than "
        f"its study's. Measure or re-measure its cells with:\n  {command}"
    )


def launcher_refusal(
    study: str, kept: dict[str, str], launcher: str, cells: list[str], command: str, limit=5
) -> str:
    """Why a run that would measure `cells` (paths) of a study measured with another launcher
    stops before any job, and the command that measures them with the study's."""
    listed = "".join(f"\n  - {path}" for path in cells[:limit])
    more = f"\n  ... and {len(cells) - limit} more" if len(cells) > limit else ""
    return (
        f"{len(cells)} cell(s) of study {study!r} would be measured with launcher "
        f"{launcher!r}, but the study was measured with {_measured_with(kept)}:{listed}{more}\n"
        "A study is measured, re-measured, redrawn and re-reported with the profile and "
        "launcher it was measured with (measuring with another launcher is another study: give "
        "it its own `study` name). Nothing was run or removed. Run it with:\n"
        f"  {command}"
    )

"""Cells packed into allocations (config `pack`): a study waits in the queue once per pack, not
once per cell.

The driver side, called by the project's executor plugin (snakemake_executor_plugin_dlscale):
the ready cell jobs of one hardware entry and environment (`pack_key`: the same Slurm
resources but for nodes, tasks and time) are grouped into packs (`plan_packs`), each one Slurm
allocation of as many nodes as its largest cell and a time limit that holds its cells one after
another (a cell's measured duration where a repetition of its series was measured before, else
its `runtime_min`), never above the partition's maximum time (hardware key `max_time_min`, else
the partition's MaxTime as `scontrol show partition` reports it). A pack's manifest
(logs/packs/<pack>/manifest.json in the study folder) lists its cells with the command each
cell's own job would run; inside the allocation dlscale.workflow.pack_runner runs them, each as
its own job step with exactly its nodes and ranks, and writes one state file per cell
(`<slot>.json`: running, done, failed, timeout), which the driver reads to report each cell
(`cell_outcome`).

What a cell measures, and where, is unchanged: its metrics path, identity, log and provenance
are those of its own job; its Slurm job id is the pack's allocation, and its nodes the step's.

Pure Python, light at import (the plugin imports it in the driver).
"""

from __future__ import annotations

import json
import math
import os
import re
import shlex
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from dlscale.study.cell import study_dir_of
from dlscale.workflow.jobstep import payload_of

PACKS_DIR = Path("logs") / "packs"  # under the study folder
MANIFEST = "manifest.json"
RUNNER = "dlscale.workflow.pack_runner"
# Seconds a pack adds per cell beyond the cell itself (the step's start, the launcher's
# checks) and once (the runner's start): part of its time limit.
STEP_OVERHEAD_S = 30
PACK_OVERHEAD_S = 60
# A measured duration is stretched by this factor before it sizes a pack (noise, a slower node).
MEASURED_MARGIN = 1.5
FINAL_STATES = ("done", "failed", "timeout")
# The resources that may differ between the cells of one pack: the allocation takes the largest.
SIZED = ("nodes", "tasks", "runtime")


def pack_setting(config: dict) -> int | None:
    """Cells per pack from config `pack` (validated by the schema): None (off: false, 0 or
    absent), an integer (at most that many cells in one allocation), or 0 for `true` (as many
    as the time limit holds)."""
    value = config.get("pack", False)
    if value is True:
        return 0
    if value in (False, None, 0):
        return None
    return int(value)


@dataclass
class PackCell:
    """One cell to pack: its metrics path, nodes, time limit as one job (minutes), the seconds
    it is expected to take (measured, or None), and what its job would run (jobstep payload)."""

    path: str
    nodes: int
    runtime_min: int
    measured_s: float | None = None
    payload: dict = field(default_factory=dict)

    @property
    def expected_s(self) -> float:
        if self.measured_s is not None:
            return min(self.measured_s * MEASURED_MARGIN, self.runtime_min * 60)
        return self.runtime_min * 60

    @property
    def limit_s(self) -> int:
        """The step's own time limit: what the cell's own job would get."""
        return self.runtime_min * 60


@dataclass
class Pack:
    cells: list[PackCell]

    @property
    def nodes(self) -> int:
        return max(c.nodes for c in self.cells)

    @property
    def time_min(self) -> int:
        return pack_minutes(self.cells)


def pack_minutes(cells: list[PackCell]) -> int:
    """A pack's time limit: its cells one after another, each with its step overhead."""
    seconds = PACK_OVERHEAD_S + sum(c.expected_s + STEP_OVERHEAD_S for c in cells)
    return max(1, math.ceil(seconds / 60))


def plan_packs(
    cells: list[PackCell], per_pack: int, max_time_min: int | None
) -> tuple[list[Pack], list[PackCell]]:
    """Packs of `cells` in their order (first fit: a new pack when the next cell would pass
    `per_pack` cells, 0 = no count limit, or the time limit `max_time_min`, None = none), and
    the cells no pack can hold (alone above the time limit: they run as their own jobs)."""
    packs: list[Pack] = []
    alone: list[PackCell] = []
    current: list[PackCell] = []
    for cell in cells:
        if max_time_min is not None and pack_minutes([cell]) > max_time_min:
            alone.append(cell)
            continue
        full = per_pack and len(current) >= per_pack
        too_long = max_time_min is not None and pack_minutes([*current, cell]) > max_time_min
        if current and (full or too_long):
            packs.append(Pack(current))
            current = []
        current.append(cell)
    if current:
        packs.append(Pack(current))
    return packs, alone


def natural(path: str) -> tuple:
    """Sort key of a cell path with its numbers as numbers (n2 before n10, r2 before r10)."""
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", path))


def pack_key(job) -> tuple:
    """Cells that may share an allocation: the same rule family's hardware entry, environment
    (the python their launcher runs) and Slurm resources but for nodes, tasks and time."""
    resources = tuple(
        sorted(
            (k, str(v))
            for k, v in job.resources.items()
            if k not in SIZED and not k.startswith("_")
        )
    )
    return (job.wildcards_dict.get("hardware"), str(job.params.get("python")), resources)


# -- measured durations --------------------------------------------------------------------
def measured_seconds(cell_path: str) -> float | None:
    """How long a cell of this series took before: the longest of its repetitions' measured
    jobs (slurm_job.json's start beside the metrics file's last write), or None."""
    path = Path(cell_path)
    rep_dir = path.parent
    series = rep_dir.parent
    found = []
    if not series.is_dir():
        return None
    for rep in series.iterdir():
        metrics, job = rep / path.name, rep / "slurm_job.json"
        if not (metrics.is_file() and job.is_file()):
            continue
        try:
            start = float(json.loads(job.read_text())["time"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        took = metrics.stat().st_mtime - start
        if 0 < took < 7 * 86400:
            found.append(took)
    return max(found) if found else None


# -- the partition's maximum time ----------------------------------------------------------
_MAXTIME = re.compile(r"MaxTime=(\S+)")


def slurm_minutes(text: str) -> int | None:
    """Minutes of a Slurm time, seconds rounded up (UNLIMITED: None). Slurm's forms (sbatch
    --time): minutes, minutes:seconds, hours:minutes:seconds, days-hours, days-hours:minutes,
    days-hours:minutes:seconds: after a day count the first field is hours."""
    text = text.strip()
    if not text or text.upper() in ("UNLIMITED", "INFINITE", "NONE"):
        return None
    days, with_days = 0, "-" in text
    if with_days:
        d, text = text.split("-", 1)
        days = int(d)
    parts = [int(p) for p in text.split(":")]
    if with_days or len(parts) == 3:  # [days-]hours[:minutes[:seconds]]
        h, m, s = parts + [0] * (3 - len(parts))
    else:  # minutes[:seconds]
        h, (m, s) = 0, (parts + [0])[:2]
    return days * 1440 + h * 60 + m + (1 if s else 0)


def partition_max_minutes(partition: str | None) -> int | None:
    """The partition's MaxTime from `scontrol show partition` (the default partition where
    none is named), or None when unlimited or unknown."""
    cmd = ["scontrol", "show", "partition", "-o"] + ([partition] if partition else [])
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    lines = [ln for ln in out.splitlines() if ln.strip()]
    if not partition:
        lines = [ln for ln in lines if "Default=YES" in ln] or lines[:1]
    for line in lines:
        found = _MAXTIME.search(line)
        if found:
            return slurm_minutes(found.group(1))
    return None


# -- the pack's files ----------------------------------------------------------------------
def pack_dir(study_dir: str | Path, pack_id: str) -> Path:
    return Path(study_dir) / PACKS_DIR / pack_id


def write_manifest(study_dir: str | Path, pack_id: str, pack: Pack, run_id: str | None) -> Path:
    folder = pack_dir(study_dir, pack_id)
    folder.mkdir(parents=True, exist_ok=True)
    manifest = {
        "pack": pack_id,
        "run_id": run_id,
        "created": time.time(),
        "nodes": pack.nodes,
        "time_min": pack.time_min,
        "cells": [
            {
                "slot": i,
                "cell": c.path,
                "nodes": c.nodes,
                "limit_s": c.limit_s,
                "expected_s": round(c.expected_s, 1),
                "measured_s": None if c.measured_s is None else round(c.measured_s, 1),
                "payload": c.payload,
            }
            for i, c in enumerate(pack.cells)
        ],
    }
    write_json(folder / MANIFEST, manifest)
    return folder / MANIFEST


def write_json(path: Path, record: dict) -> None:
    """A JSON file renamed into place whole (the driver reads it while the runner writes)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(record, indent=1, sort_keys=True))
    os.replace(tmp, path)


def read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def read_manifest(folder: Path) -> dict | None:
    return read_json(folder / MANIFEST)


def cell_state(folder: Path, slot: int) -> dict | None:
    """The runner's state of a pack's cell (`<slot>.json`), or None before it started."""
    return read_json(folder / f"{slot}.json")


def find_slot(study_dir: str | Path, cell_path: str, allocation: str) -> tuple[str, int] | None:
    """The pack and slot of a cell in the pack that allocation `allocation` runs (its
    manifest's `slurm_job_id`, written at submission), or None: that job is not a pack."""
    root = Path(study_dir) / PACKS_DIR
    if not root.is_dir():
        return None
    for folder in sorted(root.iterdir()):
        manifest = read_manifest(folder)
        if not manifest or str(manifest.get("slurm_job_id")) != str(allocation):
            continue
        for cell in manifest["cells"]:
            if cell["cell"] == cell_path:
                return manifest["pack"], cell["slot"]
    return None


def record_allocation(folder: Path, slurm_job_id: str) -> None:
    """The allocation's id in the manifest (a later driver finds a cell's pack by it)."""
    manifest = read_manifest(folder)
    if manifest is not None:
        manifest["slurm_job_id"] = str(slurm_job_id)
        write_json(folder / MANIFEST, manifest)


def cell_outcome(state: dict | None, allocation_state: str | None, live: bool) -> tuple[str, str]:
    """What the driver reports for a packed cell: ("running", ""), ("done", ""), or
    ("failed", why). `state`: the runner's state file; `allocation_state`: the pack's Slurm
    state (None: unknown to the controller); `live`: the allocation still holds or waits for
    its nodes."""
    if state and state.get("state") == "done":
        return "done", ""
    if state and state.get("state") in ("failed", "timeout"):
        return "failed", state.get("reason") or f"{state['state']} (exit {state.get('exit')})"
    if live:
        return "running", ""
    where = allocation_state or "no longer known to Slurm"
    started = " after it started" if state else " before it started"
    return "failed", f"its pack's allocation ended ({where}){started}"


# -- in the driver: the executor plugin's side ---------------------------------------------
class PackResources(dict):
    """A pack's Slurm resources, read as the Slurm plugin reads a job's (`.get`, attributes)."""

    def __getattr__(self, name):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


class PackJob:
    """What the Slurm plugin's own `run_job` submits for a pack: its largest cell's job with the
    pack's nodes, tasks and time limit (and `--no-kill`: a node failing mid-pack leaves the
    allocation to the remaining cells), named `pack` with the pack's id as its one wildcard (its
    log: <logdir>/rule_pack/<pack>/<job id>.log; its comment: rule_pack_wildcards_<pack>). Every
    other attribute is that cell job's."""

    name = "pack"

    def __init__(self, pack_id: str, largest, members: list, manifest: Path, time_min: int):
        self._largest = largest
        self.pack_id = pack_id
        self.members = members  # [(slot, job)]
        self.manifest = manifest
        res = dict(largest.resources.items())
        extra = f"{res.get('slurm_extra') or ''} --no-kill".strip()
        res.update(runtime=time_min, slurm_extra=extra)
        self.resources = PackResources(res)
        self.wildcards = [pack_id]
        self.wildcards_dict = {"pack": pack_id}

    def is_group(self) -> bool:
        return False

    def __getattr__(self, name):
        return getattr(self._largest, name)

    def command(self, python: str) -> str:
        return f"{shlex.quote(python)} -m {RUNNER} {shlex.quote(str(self.manifest))}"


class Packer:
    """Packs a driver's ready cell jobs (`submit`) and reports each packed cell from its
    runner's state file (`check`). Created by the executor plugin when config `pack` is set."""

    def __init__(self, executor, per_pack: int):
        self.executor = executor
        self.per_pack = per_pack
        self.count = 0
        self._max_time: dict[str, int | None] = {}

    def max_time(self, job) -> int | None:
        stated = job.resources.get("dlscale_max_time_min")
        if stated:
            return int(stated)
        partition = job.resources.get("slurm_partition") or ""
        if partition not in self._max_time:
            self._max_time[partition] = partition_max_minutes(partition or None)
        return self._max_time[partition]

    def submit(self, jobs: list, is_cell, submit_one) -> list:
        """Submit the packable cell jobs among `jobs` as packs (`submit_one(PackJob)`); returns
        the jobs left to submit one by one (other rules, and cells no pack can hold)."""
        rest, groups = [], {}
        for job in jobs:
            if is_cell(job) and study_dir_of(str(job.output[0])) is not None:
                groups.setdefault(pack_key(job), []).append(job)
            else:
                rest.append(job)
        for members in groups.values():
            by_path = {str(j.output[0]): j for j in members}
            cells = [
                PackCell(
                    path,
                    int(job.resources.get("nodes") or 1),
                    int(job.resources.get("runtime") or 30),
                    measured_seconds(path),
                    payload=payload_of(job),
                )
                for path, job in sorted(by_path.items(), key=lambda kv: natural(kv[0]))
            ]  # a series' repetitions together, r2 before r10
            packs, alone = plan_packs(cells, self.per_pack, self.max_time(members[0]))
            rest += [by_path[c.path] for c in alone]
            for pack in packs:
                if len(pack.cells) == 1 and self.per_pack != 1:
                    rest.append(by_path[pack.cells[0].path])  # one cell: its own job
                    continue
                submit_one(self.pack_job(pack, by_path))
        return rest

    def pack_job(self, pack: Pack, by_path: dict) -> PackJob:
        self.count += 1
        run = (getattr(self.executor, "run_uuid", None) or "run")[:8]
        pack_id = f"{run}-{self.count:03d}"
        study_dir = study_dir_of(pack.cells[0].path)
        manifest = write_manifest(
            study_dir, pack_id, pack, getattr(self.executor, "run_uuid", None)
        )
        largest = max(pack.cells, key=lambda c: c.nodes)
        members = [(i, by_path[c.path]) for i, c in enumerate(pack.cells)]
        return PackJob(pack_id, by_path[largest.path], members, manifest.resolve(), pack.time_min)

    def check(self, packed: list, job_states, live_states) -> tuple[list, list]:
        """The packed cells' outcomes: (still running, [(job_info, None | why failed)] ended).
        `job_states(ids)`: the allocations' Slurm states (dlscale.workflow.resume.job_states),
        `live_states`: those of an allocation that holds or waits for its nodes."""
        allocations = job_states(sorted({str(j.external_jobid) for j in packed}))
        running, ended = [], []
        for info in packed:
            alloc = allocations.get(str(info.external_jobid), {})
            state = cell_state(Path(info.aux["pack_dir"]), info.aux["slot"])
            outcome, why = cell_outcome(
                state, alloc.get("state"), alloc.get("state") in live_states
            )
            if outcome == "running":
                running.append(info)
            else:
                ended.append((info, None if outcome == "done" else why))
        return running, ended


def is_packed(job_info) -> bool:
    """Whether a submitted job (SubmittedJobInfo) is a cell of a pack."""
    return bool((getattr(job_info, "aux", None) or {}).get("pack"))


def packed_aux(study_dir: str | Path, pack_id: str, slot: int, logfile) -> dict:
    """The SubmittedJobInfo aux of a packed cell: where its state is read."""
    return {
        "slurm_logfile": logfile,
        "pack": pack_id,
        "slot": slot,
        "pack_dir": str(pack_dir(study_dir, pack_id).resolve()),
    }

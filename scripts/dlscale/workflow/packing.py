"""Cells packed into allocations (config `pack`): a study waits in the queue once per pack, not
once per cell, and a pack runs its cells side by side on disjoint nodes of its allocation.

The driver side, called by the project's executor plugin (snakemake_executor_plugin_dlscale):
the ready cell jobs of one hardware entry and environment (`pack_key`: the same Slurm
resources but for nodes, tasks and time) are grouped into packs, each one Slurm allocation
whose shape and cell order dlscale.workflow.pack_plan chooses, within the nodes the entry may
use at once (hardware `nodes_available`, else `max_nodes`, and the partition's node count as
`scontrol show partition` reports it) and the partition's maximum time (hardware key
`max_time_min`, else the partition's MaxTime).

A pack's manifest (logs/packs/<pack>/manifest.json in the study folder) lists its cells in
that order with the command each cell's own job would run and the planned start and nodes;
inside the allocation dlscale.workflow.pack_runner runs them, each as its own job step with
exactly its nodes and ranks, and writes one state file per cell (`<slot>.json`: running, done,
failed, timeout, with its nodes, start and end, and the cells whose steps ran beside it), which
the driver reads to report each cell (`cell_outcome`). A dry run prints the plan
(`study_plan`).

What a cell measures, and where, is unchanged: its metrics path, identity, log and provenance
are those of its own job; its Slurm job id is the pack's allocation, and its nodes the step's.

Pure Python, light at import (the plugin imports it in the driver).
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import time
from pathlib import Path

from dlscale.store.pack_files import (
    MANIFEST,
    cell_state,
    pack_dir,
    read_manifest,
    write_json,
)
from dlscale.study.cell import study_dir_of
from dlscale.workflow.jobstep import payload_of
from dlscale.workflow.pack_plan import (
    Pack,
    PackCell,
    natural,
    pack_setting,
    pack_steps_setting,
    plan_lines,
    plan_packs,
)

RUNNER = "dlscale.workflow.pack_runner"
# The resources that may differ between the cells of one pack: the allocation takes the largest.
SIZED = ("nodes", "tasks", "runtime")


def study_plan(
    cells: list, hardware: dict, config: dict, runs_dir: str, partition_of=None
) -> list[str]:
    """What a dry run of a packed study prints (config `pack`): the packs the driver would
    submit for `cells` (the study's cells still to measure, all ready at once, as at a run's
    start), grouped as the driver groups them (hardware entry and framework environment) and
    planned by plan_packs with the entry's limits; `partition_of(name)`: the partition's
    (MaxTime, node count), partition_limits by default."""
    per_pack = pack_setting(config)
    if per_pack is None or not cells:
        return []
    partition_of = partition_of or partition_limits
    concurrent = pack_steps_setting(config)
    groups: dict[tuple, list] = {}
    for cell in sorted(cells, key=lambda c: natural(c.path)):
        groups.setdefault((cell.hardware, cell.framework), []).append(cell)
    lines, count = [], 0
    for (key, framework), members in groups.items():
        hw = hardware[key]
        max_time, total = partition_of(hw.get("partition") or None)
        stated = [v for v in (hw.get("nodes_available") or hw.get("max_nodes"), total) if v]
        packs, alone = plan_packs(
            [
                PackCell(c.path, c.nodes, int(hw["runtime_min"]), measured_seconds(c.path))
                for c in members
            ],
            per_pack,
            hw.get("max_time_min") or max_time,
            min(stated) if stated else None,
            concurrent,
        )
        lines.append(f"hardware {key}, {framework}: {len(members)} cell(s) to measure")
        single = 0
        for pack in packs:
            if len(pack.cells) == 1 and per_pack != 1:
                single += 1  # one cell: its own job
                continue
            count += 1
            lines += plan_lines(str(count), pack, runs_dir)
        if alone or single:
            lines.append(
                f"  as their own jobs: {len(alone)} cell(s) alone above the partition's "
                f"maximum time, {single} alone in a pack"
            )
    return lines


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
_TOTAL_NODES = re.compile(r"TotalNodes=(\d+)")


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


def partition_limits(partition: str | None) -> tuple[int | None, int | None]:
    """The partition's (MaxTime in minutes, node count) from `scontrol show partition` (the
    default partition where none is named); None for what is unlimited or unknown."""
    cmd = ["scontrol", "show", "partition", "-o"] + ([partition] if partition else [])
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return None, None
    lines = [ln for ln in out.splitlines() if ln.strip()]
    if not partition:
        lines = [ln for ln in lines if "Default=YES" in ln] or lines[:1]
    for line in lines:
        found, nodes = _MAXTIME.search(line), _TOTAL_NODES.search(line)
        if found or nodes:
            return (
                slurm_minutes(found.group(1)) if found else None,
                int(nodes.group(1)) if nodes else None,
            )
    return None, None


# -- the pack's files ----------------------------------------------------------------------
def write_manifest(study_dir: str | Path, pack_id: str, pack: Pack, run_id: str | None) -> Path:
    folder = pack_dir(study_dir, pack_id)
    folder.mkdir(parents=True, exist_ok=True)
    manifest = {
        "pack": pack_id,
        "run_id": run_id,
        "created": time.time(),
        "nodes": pack.nodes,
        "time_min": pack.time_min,
        "concurrent": pack.concurrent,  # the runner's: side by side, or one at a time
        "cells": [
            {
                "slot": i,
                "cell": c.path,
                "nodes": c.nodes,
                "limit_s": c.limit_s,
                "expected_s": round(c.expected_s, 1),
                "measured_s": None if c.measured_s is None else round(c.measured_s, 1),
                # the plan (list_schedule): start after the pack's, node indices
                "planned": {"start_s": round(s.start_s, 1), "nodes": list(s.nodes)},
                "payload": c.payload,
            }
            for i, (c, s) in enumerate(zip(pack.cells, pack.steps))
        ],
    }
    write_json(folder / MANIFEST, manifest)
    return folder / MANIFEST


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

    def __init__(
        self, pack_id: str, largest, members: list, manifest: Path, time_min: int, nodes: int
    ):
        self._largest = largest
        self.pack_id = pack_id
        self.members = members  # [(slot, job)]
        self.manifest = manifest
        res = dict(largest.resources.items())
        extra = f"{res.get('slurm_extra') or ''} --no-kill".strip()
        # the pack's nodes (pack_shape), each with the largest cell's tasks per node
        per_node = int(res.get("tasks") or 1) // max(1, int(res.get("nodes") or 1))
        res.update(nodes=nodes, tasks=nodes * per_node, runtime=time_min, slurm_extra=extra)
        self.resources = PackResources(res)
        self.plan: list[str] = []  # plan_lines, as the driver prints it at submission
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

    def __init__(self, executor, per_pack: int, concurrent: bool = True):
        self.executor = executor
        self.per_pack = per_pack
        self.concurrent = concurrent  # config pack_steps
        self.count = 0
        self._partitions: dict[str, tuple[int | None, int | None]] = {}

    def partition(self, job) -> tuple[int | None, int | None]:
        partition = job.resources.get("slurm_partition") or ""
        if partition not in self._partitions:
            self._partitions[partition] = partition_limits(partition or None)
        return self._partitions[partition]

    def max_time(self, job) -> int | None:
        """The partition's maximum time: the hardware entry's max_time_min, else Slurm's."""
        stated = job.resources.get("dlscale_max_time_min")
        return int(stated) if stated else self.partition(job)[0]

    def max_width(self, job) -> int | None:
        """The nodes a pack may take: the fewer of the hardware entry's nodes_available (else
        max_nodes) and the partition's node count, where each is known."""
        known = [
            int(v) for v in (job.resources.get("dlscale_pack_nodes"), self.partition(job)[1]) if v
        ]
        return min(known) if known else None

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
            packs, alone = plan_packs(
                cells,
                self.per_pack,
                self.max_time(members[0]),
                self.max_width(members[0]),
                self.concurrent,
            )
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
        job = PackJob(
            pack_id, by_path[largest.path], members, manifest.resolve(), pack.time_min, pack.width
        )
        job.plan = plan_lines(pack_id, pack, f"{study_dir}/runs")
        return job

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

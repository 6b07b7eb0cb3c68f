"""The preflight in the driver: one short job per (hardware entry, environment) that holds that
entry's cells (the job's side is dlscale.run.preflight_job).

Under the dlscale executor (profiles/slurm), when the first cell of an (entry, environment)
reaches the executor, the driver submits the preflight (`sbatch --parsable`, the cells' own
partition, GPUs and task geometry on min(2, the cells' largest node count) nodes, a short time
limit) and every cell of that pair goes to Slurm with `--dependency=afterok:<preflight>
--kill-on-invalid-dep=yes`: the cells queue beside the preflight, so a passing one costs no
queue wait of its own, and a failing one makes Slurm cancel them before any starts; the driver
cancels them itself as soon as it reads the failed result (cancel_held), since Slurm does only
once the preflight has ended on every node, which a node that cannot be reached delays until
Slurm declares it down (SlurmdTimeout, minutes). A cell that
reaches the executor after a failed result is not submitted at all. Either way its error names
the entry, what failed and the fix; the driver also says it once when the result arrives.

A passed result is kept under results/<study>/preflight/, named by a key the login side knows
(the entry's hashed facts, its modules and env included, the environment's identity, the
declared driver and the probe's node count): a rerun within `preflight_max_age_h` submits none.
`--config preflight=False` skips it (the report says so). The local launcher has no queue to
protect and runs none.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import subprocess
import time
from pathlib import Path

from dlscale.registry.frameworks import FRAMEWORKS
from dlscale.registry.launchers import on_slurm
from dlscale.store.preflight_results import PREFLIGHT_DIR, read_result
from dlscale.study.cell import Cell
from dlscale.study.hardware import environment_variant
from dlscale.study.hashes import hashed_hardware
from dlscale.study.resources import preflight_sbatch_args
from dlscale.study.script_workload import environments_of
from dlscale.workflow.resume_journal import say

PREFLIGHT_RUNTIME_MIN = 10  # the preflight job's time limit (the job itself takes seconds)
PROBE_NODES = 2  # a multi-node entry's communicator is checked across this many nodes
KEY_VERSION = 1
DRIVER_KEYS = ("nvidia_driver", "max_cuda", "cuda_forward_compat")  # declared, not hashed


def environment_name(framework: str, entry: dict) -> str:
    """The environment a framework's ranks run in on a hardware entry (<environments>/<name>,
    `driver` for .venv, or `container-<engine>` for the entry's image: its digest is in the
    probe's key through the cells' environment identity)."""
    if entry.get("container"):
        return f"container-{entry['container']['engine']}"
    name = FRAMEWORKS[framework].environment_for(environment_variant(entry), entry)
    return name or "driver"


@dataclasses.dataclass(frozen=True)
class Probe:
    """One (entry, environment): its probe cell (the group's largest, on at most PROBE_NODES
    nodes) and the key its result is kept under."""

    hardware: str
    environment: str
    cell: Cell
    entry: dict = dataclasses.field(compare=False, hash=False)

    @property
    def key(self) -> str:
        facts = {
            "version": KEY_VERSION,
            "hardware": self.hardware,
            "entry": hashed_hardware(self.entry),
            "declared_driver": {k: self.entry.get(k) for k in DRIVER_KEYS},
            "environment": self.cell.environment,
            "framework": self.cell.framework,
            "nodes": self.cell.nodes,
            "ranks_per_node": self.cell.ranks_per_node,
        }
        text = json.dumps(facts, sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:12]

    @property
    def name(self) -> str:
        return f"{self.hardware}-{self.environment}-{self.key}"


def plan(cells: list[Cell], hardware: dict) -> dict[tuple[str, str], Probe]:
    """The probes of a study's srun cells, by (hardware entry, environment)."""
    groups: dict[tuple[str, str], list[Cell]] = {}
    for cell in cells:
        if not on_slurm(cell.launcher):
            continue
        entry = hardware[cell.hardware]
        groups.setdefault((cell.hardware, environment_name(cell.framework, entry)), []).append(cell)
    probes = {}
    for (hw, env), group in sorted(groups.items()):
        largest = max(group, key=lambda c: (c.nodes, c.ranks_per_node, c.path))
        nodes = min(PROBE_NODES, largest.nodes)
        batch = largest.per_rank_batch * nodes * largest.ranks_per_node
        cell = dataclasses.replace(largest, nodes=nodes, global_batch=batch)
        probes[hw, env] = Probe(hw, env, cell, hardware[hw])
    return probes


def fresh(result: dict | None, max_age_s: float, now: float | None = None) -> bool:
    """A passed result younger than max_age_s (a cache hit)."""
    now = time.time() if now is None else now
    return bool(result and result.get("passed") and now - result["finished_at"] <= max_age_s)


def failure_text(probe: Probe, result: dict | None, job: str | None) -> str:
    """What a held cell's error says: the entry, what failed and the fix."""
    head = (
        f"the preflight of hardware entry '{probe.hardware}' with environment '{probe.environment}'"
    )
    if result is None:
        return (
            f"{head} (Slurm job {job}) ended without a result; its log: "
            f"{PREFLIGHT_DIR}/{probe.name}-{job}.log in the study's folder"
        )
    bad = result["failed"]
    return (
        f"{head} failed (Slurm job {result.get('slurm_job')} on {result.get('host')}): "
        f"{bad['name']}: {bad['detail']}. Fix: {bad['fix']}. No cell of this entry and "
        "environment ran."
    )


class Preflight:
    """The driver's preflights of one run (held by the dlscale executor)."""

    def __init__(self, study_dir: str, config: dict, cells: list[Cell], hardware: dict, python):
        self.study_dir = Path(study_dir)
        self.folder = self.study_dir / PREFLIGHT_DIR
        self.config, self.hardware, self.python = config, hardware, python
        self.max_age_s = float(config["preflight_max_age_h"]) * 3600
        self.probes = plan(cells, hardware)
        self.jobs: dict[tuple[str, str], str] = {}  # submitted in this run: Slurm job ids
        self.passed: dict[tuple[str, str], dict] = {}
        self.failed: dict[tuple[str, str], str] = {}  # the failure text, once known
        self.said: set[tuple[str, str]] = set()

    def result_path(self, probe: Probe) -> Path:
        return self.folder / f"{probe.name}.json"

    # -- cell jobs through the executor ------------------------------------------------------
    def probe_of(self, job) -> tuple[str, str] | None:
        wc = job.wildcards
        hw, fw = wc.get("hardware"), wc.get("framework")
        if hw is None or fw is None or hw not in self.hardware:
            return None
        fw = environments_of(self.config).get(fw, fw)  # a script's label: its environment's
        env = environment_name(fw, self.hardware[hw])
        return (hw, env) if (hw, env) in self.probes else None

    def hold(self, jobs, refuse) -> list:
        """The jobs to submit now: a cell job gets its preflight's dependency (submitting the
        preflight first where needed), or, after a failed preflight, is refused through
        `refuse(job, text)` instead of submitted. Other jobs pass unchanged."""
        self.poll()  # once per batch: what ended since the last one
        keep = []
        for job in jobs:
            which = None if job.is_group() else self.probe_of(job)
            if which is None:
                keep.append(job)
                continue
            state = self.state(which)
            if state == "failed":
                refuse(job, self.failed[which])
                continue
            if state != "passed":
                extra = job.resources.get("slurm_extra") or ""
                job.resources.slurm_extra = (
                    f"{extra} --dependency=afterok:{state} --kill-on-invalid-dep=yes".strip()
                )
            keep.append(job)
        return keep

    def state(self, which: tuple[str, str]) -> str:
        """'passed', 'failed', or the Slurm id of the preflight still to end (submitted now if
        there is neither a fresh result nor a job)."""
        if which in self.passed:
            return "passed"
        if which in self.failed:
            return "failed"
        if which in self.jobs:
            return self.jobs[which]
        probe = self.probes[which]
        cached = read_result(self.result_path(probe))
        if fresh(cached, self.max_age_s):
            self.passed[which] = cached
            say(
                self.study_dir,
                f"preflight of {probe.hardware} / {probe.environment}: passed "
                f"{_age(cached)} ago (Slurm job {cached.get('slurm_job')}), not repeated "
                f"(preflight_max_age_h: {self.config['preflight_max_age_h']})",
            )
            return "passed"
        self.jobs[which] = self.submit(probe)
        return self.jobs[which]

    def submit(self, probe: Probe) -> str:
        self.folder.mkdir(parents=True, exist_ok=True)
        spec_path = self.folder / f"{probe.name}.spec.json"
        spec = {
            "key": probe.key,
            "environment": probe.environment,
            "cell": probe.cell.as_dict(),
            "entry": probe.entry,
        }
        spec_path.write_text(json.dumps(spec, indent=1, sort_keys=True, default=str))
        output = self.result_path(probe)
        output.unlink(missing_ok=True)  # a stale result is not this job's
        python = self.python(probe.hardware, probe.cell.framework)
        command = [
            "sbatch",
            "--parsable",
            f"--job-name=dlscale-preflight-{probe.hardware}",
            f"--chdir={os.getcwd()}",
            f"--output={self.folder / probe.name}-%j.log",
            *preflight_sbatch_args(
                self.config,
                probe.entry,
                probe.cell.nodes,
                probe.cell.ranks_per_node,
                PREFLIGHT_RUNTIME_MIN,
            ),
            "--wrap",
            subprocess.list2cmdline(
                [python, "-m", "dlscale.run.preflight_job", "job", "--spec", str(spec_path)]
                + ["--output", str(output)]
            ),
        ]
        proc = subprocess.run(command, capture_output=True, text=True, timeout=60)
        if proc.returncode != 0:
            raise RuntimeError(
                f"dlscale: the preflight of {probe.hardware} / {probe.environment} could not "
                f"be submitted: {proc.stderr.strip() or proc.stdout.strip()}\n"
                f"  {' '.join(command)}\nSkip it with --config preflight=False"
            )
        job = proc.stdout.strip().split(";")[0]
        say(
            self.study_dir,
            f"preflight of {probe.hardware} / {probe.environment}: Slurm job {job} on "
            f"{probe.cell.nodes} node(s) x {probe.cell.ranks_per_node} rank(s); the entry's "
            "cells wait for it (afterok)",
        )
        return job

    # -- results -------------------------------------------------------------------------------
    def poll(self) -> None:
        """Read the results of this run's preflights that have ended; say each once."""
        for which, job in self.jobs.items():
            if which in self.passed or which in self.failed:
                continue
            probe = self.probes[which]
            result = read_result(self.result_path(probe))
            if result is None or result.get("slurm_job") != job:
                if result is None and not _job_alive(job):
                    self.failed[which] = failure_text(probe, None, job)
                    self._say(which, self.failed[which])
                continue
            if result["passed"]:
                self.passed[which] = result
                self._say(which, f"preflight of {probe.hardware} / {probe.environment}: passed")
            else:
                self.failed[which] = failure_text(probe, result, job)
                self._say(which, self.failed[which])
                cancel_held(job)

    def explain(self, job) -> str | None:
        """A held cell's failure: its preflight's, when that failed."""
        which = None if job.is_group() else self.probe_of(job)
        if which is None:
            return None
        self.poll()
        return self.failed.get(which)

    def _say(self, which, text: str) -> None:
        if which not in self.said:
            self.said.add(which)
            say(self.study_dir, text)


def _age(result: dict) -> str:
    minutes = (time.time() - result["finished_at"]) / 60
    return f"{minutes:.0f} min" if minutes < 120 else f"{minutes / 60:.1f} h"


def cancel_held(job: str) -> list[str]:
    """Cancel the queued jobs held behind preflight `job` (--dependency=afterok:<job>), which
    failed, and return their ids: Slurm cancels them itself (--kill-on-invalid-dep) only once
    the preflight has ended on every node, and a node that cannot be reached keeps it
    completing until Slurm declares that node down (SlurmdTimeout, minutes)."""
    try:
        proc = subprocess.run(
            ["squeue", "--me", "-h", "-t", "PD", "-o", "%i|%E"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.SubprocessError):
        return []
    held = [
        line.split("|", 1)[0]
        for line in proc.stdout.splitlines()
        if re.search(rf"\bafterok:{re.escape(job)}\b", line.partition("|")[2])
    ]
    if held:
        subprocess.run(["scancel", *held], capture_output=True, timeout=60)
    return held


def _job_alive(job: str) -> bool:
    """Whether Slurm still knows the job as queued or running (squeue)."""
    try:
        proc = subprocess.run(
            ["squeue", "-h", "-j", job, "-o", "%T"], capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.SubprocessError):
        return True  # unknown: keep waiting for the result
    if proc.returncode != 0:
        return "Invalid job id" not in proc.stderr
    return bool(proc.stdout.strip())


def start(workflow, study_dir: str, config: dict, cells: list[Cell], hardware: dict, python):
    """onstart, in the driver: the run's Preflight, held by the dlscale executor; None (with a
    line saying why) where no preflight runs."""
    from dlscale.workflow.resume import executor_of

    executor = executor_of(workflow)
    if executor is None or not on_slurm(config["launcher"]):
        return None
    if not config["preflight"]:
        say(study_dir, "preflight skipped (--config preflight=False): cells are not held")
        return None
    executor.preflight = Preflight(study_dir, config, cells, hardware, python)
    return executor.preflight

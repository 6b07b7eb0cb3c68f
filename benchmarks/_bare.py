"""The bare baselines of the workflow benchmarks (planning.py, noop_rerun.py) and the planning
ablation test: Snakefiles with no dlscale in them.

- write_bare(): the bare Snakefile with the same N outputs (one wildcard rule, one aggregation
  over all N, rule all);
- planned_jobs()/write_same_jobs_bare(): the bare Snakefile with the same jobs as a project's
  dry run (the cells by one wildcard rule, every other job literally, from Snakemake's listing).
"""

from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

BARE_SNAKEFILE = """\
# The bare baseline of the dlscale benchmarks: the same N outputs as the study (cells.txt), one
# wildcard rule that would make each, one aggregation over all N (like dlscale's collect), rule all.
with open("cells.txt") as fh:
    CELLS = fh.read().split()


rule all:
    input:
        "results/tables/cells.txt",


rule collect:
    input:
        CELLS,
    output:
        "results/tables/cells.txt",
    run:
        with open(output[0], "w") as out:
            for path in input:
                with open(path) as fh:
                    out.write(f"{path} {sum(1 for _ in fh)}\\n")


rule train:
    output:
        "CELL_PATTERN",
    shell:
        "touch {output}"
"""


def write_bare(dest: Path, cell_paths: list[str], config_path: Path) -> tuple[Path, Path]:
    """The bare workflow: Snakefile, cells.txt, and a copy of the study config (passed with the
    same --configfile flag as the project, unused)."""
    dest.mkdir(parents=True)
    return _bare_files(dest, BARE_SNAKEFILE, cell_paths, config_path)


def _bare_files(
    dest: Path, snakefile: str, cell_paths: list[str], config_path: Path
) -> tuple[Path, Path]:
    """A bare workflow's Snakefile (its CELL_PATTERN filled in), cells.txt and config copy."""
    # the measured checkout's own cell pattern (dlscale.study.cell.CELL_PATTERN;
    # dlscale.study.matrix's before the cell module existed): the same wildcards as the study's
    # train rules
    try:
        from dlscale.study.cell import CELL_PATTERN as pattern
    except ImportError:
        from dlscale.study.matrix import CELL_PATTERN as pattern
    (dest / "Snakefile").write_text(snakefile.replace("CELL_PATTERN", pattern))
    (dest / "cells.txt").write_text("\n".join(cell_paths) + "\n")
    cfg = dest / config_path.name
    shutil.copy2(config_path, cfg)
    return dest / "Snakefile", cfg


# The bare baseline with the project's own jobs (planning.py; "a bare Snakefile with the same number
# of jobs", docs/pages/decisions/dry-run-baseline.md): the N cells made by one wildcard rule, as in
# BARE_SNAKEFILE, and every other job the project's dry run planned (jobs.json: its rule and its
# input and output files, read from Snakemake's own per-job listing) as a rule of its own with those
# literal files, so the same files link the same jobs; no params, resources, logs or conda.
SAME_JOBS_SNAKEFILE = """\
# The bare baseline of dlscale's planning benchmark with the same jobs as the project's dry run:
# the cells (cells.txt) by one wildcard rule, every other planned job (jobs.json) by a rule of its
# own naming that job's input and output files.
import json

with open("cells.txt") as fh:
    CELLS = fh.read().split()
with open("jobs.json") as fh:
    JOBS = json.load(fh)


for _k, _job in enumerate(JOBS):

    rule:
        name:
            f"{_job['rule']}_{_k}"
        default_target: _job["rule"] == "all"
        input:
            CELLS if _job["cells"] else [],
            _job["input"],
        output:
            _job["output"],
        shell:
            "touch {output}"


rule train:
    output:
        "CELL_PATTERN",
    shell:
        "touch {output}"
"""


@dataclass
class PlannedJob:
    rule: str
    input: list[str]
    output: list[str]

    def makes_only(self, files: set[str]) -> bool:
        """Whether the job has outputs and every one is among `files` (a cell's job)."""
        return bool(self.output) and set(self.output) <= files


_JOB_HEAD = re.compile(r"^(?:local)?(?:rule|checkpoint) (\S+):$")


def planned_jobs(listing: str) -> list[PlannedJob]:
    """Every job of a dry run's per-job listing (`snakemake -n` without --quiet): its rule and
    its input and output files, as Snakemake printed them."""
    jobs: list[PlannedJob] = []
    job = None
    for line in listing.splitlines():
        head = _JOB_HEAD.match(line)
        if head:
            job = PlannedJob(head.group(1), [], [])
            jobs.append(job)
        elif job is not None and line.startswith("    "):
            key, _, files = line.strip().partition(": ")
            if key in ("input", "output"):
                setattr(job, key, files.split(", "))
        else:
            job = None
    return jobs


def write_same_jobs_bare(
    dest: Path, cell_paths: list[str], jobs: list[PlannedJob], workdir: Path, config_path: Path
) -> tuple[Path, Path]:
    """The bare workflow with the project's jobs (SAME_JOBS_SNAKEFILE): the cells by the wildcard
    rule, every other job of `jobs` literally; an input no job makes is made here as an empty
    file when the project's workdir has it (a config file, the shipped data), else the listing
    and the project disagree and this stops. Returns the Snakefile and the copied config."""
    cells = set(cell_paths)
    made = {f for job in jobs for f in job.output}
    others, cell_jobs = [], 0
    for job in jobs:
        if job.makes_only(cells):
            cell_jobs += 1
            continue
        # collect's inputs: every cell (the wildcard rule's, read from cells.txt) and the rest
        reads_cells = bool(cells) and cells <= set(job.input)
        files = [f for f in job.input if f not in cells] if reads_cells else job.input
        others.append(
            {"rule": job.rule, "cells": reads_cells, "input": files, "output": job.output}
        )
    if cell_jobs != len(cells):
        raise SystemExit(f"the listing names {cell_jobs} cell jobs, the study {len(cells)}")
    dest.mkdir(parents=True)
    for job in others:
        for f in job["input"]:
            if f in made or f in cells or os.path.isabs(f):
                continue
            if not (workdir / f).exists():
                raise SystemExit(f"{job['rule']}: input {f} is neither made nor in {workdir}")
            (dest / f).parent.mkdir(parents=True, exist_ok=True)
            (dest / f).touch()
    (dest / "jobs.json").write_text(json.dumps(others))
    return _bare_files(dest, SAME_JOBS_SNAKEFILE, cell_paths, config_path)

"""A packed study's plan against what its pack runner did (benchmarks/packing.py): the order
the dry run printed (dlscale.workflow.packing.study_plan), the order the steps started (the
runner's state files under results/<study>/logs/packs/) and how much of the steps' time ran
side by side."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

PLAN_LINE = re.compile(r"^dlscale:\s+(\d+)\. \+\S+ min\s+node\(s\) \S+\s+(\S+) ")
PACK_LINE = re.compile(r"^dlscale: pack (\d+): ")


def planned_order(work: Path, env: dict, snakemake: Path) -> list[list[str]]:
    """The dry run's plan (dlscale.workflow.packing.study_plan): each pack's cells, by their
    folders under runs/, in the order the plan starts them."""
    dry = subprocess.run(
        [str(snakemake), "--profile", "profiles/slurm", "-n"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if dry.returncode != 0:
        raise SystemExit(f"dry run failed:\n{dry.stderr[-3000:]}")
    packs: list[list[str]] = []
    for line in dry.stderr.splitlines():
        if PACK_LINE.match(line):
            packs.append([])
        elif (m := PLAN_LINE.match(line)) and packs:
            packs[-1].append(m.group(2))
    return packs


def recorded_order(work: Path, study: str) -> list[list[str]]:
    """Each pack's cells in the order their steps started (the runner's state files)."""
    runs = f"results/{study}/runs/"
    out = []
    for folder in sorted((work / "results" / study / "logs" / "packs").iterdir()):
        states = [json.loads(p.read_text()) for p in folder.glob("[0-9]*.json")]
        states = sorted((s for s in states if s.get("start")), key=lambda s: s["start"])
        out.append([s["cell"].removeprefix(runs).removesuffix("/metrics.jsonl") for s in states])
    return out


def side_by_side(work: Path, study: str) -> float:
    """The fraction of the packed cells' step time during which another step of their pack ran
    (0: one at a time)."""
    total = overlap = 0.0
    for folder in (work / "results" / study / "logs" / "packs").iterdir():
        states = [json.loads(p.read_text()) for p in folder.glob("[0-9]*.json")]
        spans = [(s["start"], s["end"]) for s in states if s.get("start") and s.get("end")]
        for i, (a, b) in enumerate(spans):
            total += b - a
            cut = sorted(
                (max(a, c), min(b, d))
                for j, (c, d) in enumerate(spans)
                if j != i and c < b and d > a
            )
            covered, edge = 0.0, a
            for lo, hi in cut:
                lo = max(lo, edge)
                if hi > lo:
                    covered, edge = covered + hi - lo, hi
            overlap += covered
    return overlap / total if total else 0.0

"""No-op rerun at scale: `snakemake --cores 1` on a study of N cells whose every output is up to
date, against a bare Snakefile with the same N outputs up to date, side by side in one run.

    .venv/bin/python benchmarks/noop_rerun.py [--cells 10000] [--rounds 3]
                                              [--workflow-dir DIR] [--workdir DIR] [--slurm-probe]

Setup (once; reused from --workdir when that holds a setup of the same N and workflow files):
a copy of the workflow of --workflow-dir with a study config of N cells (the generator of
planning.py; node counts 1 and 2 by default so that N synthetic files stay small), one synthetic
metrics file per cell in the real format at the real cell path (the real Cell dicts of
dlscale.study.matrix.load_study, records built with
dlscale.store.metrics.make_record/rank_summary/assemble
and written with write_atomic), then the real downstream once (`snakemake --cores 2`: collect
over all N cells, figures, report; its wall time is printed), falling back to
`snakemake --touch` only where that run fails (said so). The bare workflow: the same N cell
paths written directly, then its aggregation run once for real. Then --rounds no-op reruns of
each (alternating which goes first), each checked to print "Nothing to be done": median/min/
max/n of the wall time and of the peak RSS of the snakemake process (os.wait4 rusage of the
child), and the project/bare ratios.

The scontrol shim of planning.py applies here too (--slurm-probe keeps the real scontrol).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _bare as bare_files  # noqa: E402
import _common as common  # noqa: E402

NOTHING = "Nothing to be done"
SETUP_VERSION = 2


def setup(a, src: Path, venvs: Path, root: Path, shim: Path | None) -> dict:
    """Build the project copy with every output up to date, and the bare workflow; returns the
    facts printed with the results (also stored in root/setup.json for a cached rerun)."""
    from dlscale.store import metrics
    from dlscale.study.matrix import load_study

    from helpers.synthetic_metrics import cell_records

    facts = {}
    wf = common.bench_checkout(src, root / "project", venvs)
    cfg, config, shape = common.write_study(wf, a.cells, a.max_nodes)
    study = load_study(config, wf)
    common.cell_count_check(study, shape.cells)
    facts["study"] = (
        f"{len(study.cells)} cells (asked for {a.cells}): {common.describe(shape, config)}"
    )
    print(f"== {facts['study']}", flush=True)

    t0 = time.perf_counter()
    ranks = 0
    for cell in study.cells:
        metrics.write_atomic(wf / cell.path, cell_records(cell, study.hardware[cell.hardware]))
        ranks += cell.world_size
    facts["synthetic"] = (
        f"wrote {len(study.cells)} synthetic metrics files ({ranks} ranks, "
        f"{config['steps']} steps each) with full validation in "
        f"{time.perf_counter() - t0:.1f} s"
    )
    print(f"   {facts['synthetic']}", flush=True)

    env = common.child_env(wf, a.snakemake, shim)
    project = [
        str(a.snakemake),
        "-s",
        str(wf / "Snakefile"),
        "-d",
        str(wf),
        "--configfile",
        str(cfg),
    ]
    run = common.run_child(project + ["--cores", "2"], root, env, root / "project-downstream.log")
    ran = common.job_stats(run.log.read_text())
    if run.rc == 0:
        if common.train_jobs(run.log.read_text()):
            raise SystemExit(f"the downstream run started train jobs; see {run.log}")
        jobs = ", ".join(f"{rule} {count}" for rule, count in ran.items())
        facts["downstream"] = (
            f"real downstream run `snakemake --cores 2` ({jobs}): "
            f"{run.wall_s:.1f} s, peak RSS {run.maxrss_mib:.0f} MiB"
        )
    else:
        tail = run.tail(1500)
        made = touch_up_to_date(project, root, env)
        facts["downstream"] = (
            f"FALLBACK: the real downstream run failed (exit {run.rc}, "
            f"{run.wall_s:.1f} s, log {run.log}); the outputs it did not "
            f"make were created empty ({len(made)}: {', '.join(made)}) and "
            f"all marked up to date with `snakemake --touch` instead. "
            f"Its log ends:\n{tail}"
        )
    print(f"   {facts['downstream']}", flush=True)

    paths = [c.path for c in study.cells]
    bare_snakefile, bare_cfg = bare_files.write_bare(root / "bare", paths, cfg)
    for path in paths:
        out = bare_snakefile.parent / path
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text("synthetic\n")
    bare = [
        str(a.snakemake),
        "-s",
        str(bare_snakefile),
        "-d",
        str(bare_snakefile.parent),
        "--configfile",
        str(bare_cfg),
    ]
    run = common.run_child(bare + ["--cores", "2"], root, env, root / "bare-downstream.log")
    common.check(run, "bare aggregation run")
    facts["bare"] = f"bare aggregation run `snakemake --cores 2`: {run.wall_s:.1f} s"
    print(f"   {facts['bare']}", flush=True)
    facts["commands"] = {"project": project, "bare": bare}
    facts["pythonpath_root"] = str(wf)
    return facts


def touch_up_to_date(cmd: list[str], root: Path, env: dict) -> list[str]:
    """The fallback: `snakemake --touch` marks existing outputs up to date but skips missing
    ones, so first create, empty, every output the pending jobs of a dry run list; returns
    those created."""
    dry = common.run_child(cmd + ["-n", "--cores", "1"], root, env, root / "project-pending.log")
    common.check(dry, "dry run listing the pending jobs")
    workdir = Path(cmd[cmd.index("-d") + 1])
    made = []
    for line in re.findall(r"^\s+output: (.*)$", dry.log.read_text(), re.M):
        for path in line.split(", "):
            out = workdir / path
            if not out.exists():
                out.parent.mkdir(parents=True, exist_ok=True)
                out.touch()
                made.append(path)
    touch = common.run_child(
        cmd + ["--cores", "1", "--touch"], root, env, root / "project-touch.log"
    )
    common.check(touch, "snakemake --touch")
    return made


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cells", type=int, default=10000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument(
        "--workflow-dir",
        type=Path,
        default=common.REPO,
        help="the checkout to measure (default: this repository)",
    )
    p.add_argument(
        "--venvs",
        type=Path,
        default=None,
        help="framework environments to link as .venvs (default: the checkout's "
        ".venvs, else this repository's)",
    )
    p.add_argument(
        "--workdir",
        type=Path,
        default=None,
        help="where the copies go; a finished setup there is reused "
        "(default: a new directory under /var/tmp)",
    )
    p.add_argument(
        "--max-nodes",
        type=int,
        default=2,
        help="node counts are the powers of two up to this (world sizes, and so "
        "the synthetic files, grow with it)",
    )
    p.add_argument("--snakemake", type=Path, default=common.REPO / ".venv" / "bin" / "snakemake")
    p.add_argument(
        "--slurm-probe",
        action="store_true",
        help="let the Slurm plugin query scontrol in every run (see planning.py)",
    )
    a = p.parse_args()
    src, venvs, root, shim = common.start(a, "dlscale-noop-")
    key = {
        "version": SETUP_VERSION,
        "cells": a.cells,
        "max_nodes": a.max_nodes,
        "workflow_dir": str(src),
        "workflow_files": common.tree_hash(src),
    }
    stamp = root / "setup.json"
    cached = json.loads(stamp.read_text()) if stamp.exists() else None
    if cached and cached["key"] == key:
        facts = cached["facts"]
        print(
            f"reusing the setup in {root} (same workflow files; delete {stamp.name} there "
            "to rebuild):"
        )
        for k in ("study", "synthetic", "downstream", "bare"):
            print(f"   {facts[k]}")
    else:
        if cached:  # our own earlier setup, of something else
            stamp.unlink()
            for d in ("project", "bare"):
                shutil.rmtree(root / d, ignore_errors=True)
        elif (root / "project").exists() or (root / "bare").exists():
            raise SystemExit(
                f"{root} holds project/ or bare/ but no {stamp.name}: not a setup "
                "of this script; choose another --workdir"
            )
        facts = setup(a, src, venvs, root, shim)
        stamp.write_text(json.dumps({"key": key, "facts": facts}, indent=1))

    env = common.child_env(Path(facts["pythonpath_root"]), a.snakemake, shim)
    logs = root / "logs"
    logs.mkdir(exist_ok=True)

    def variant(name):
        def go(r):
            run = common.run_child(
                facts["commands"][name] + ["--cores", "1"], root, env, logs / f"{name}-{r}.log"
            )
            common.check(run, f"{name} no-op rerun", expect=NOTHING)
            return run

        return go

    for name in ("project", "bare"):  # untimed warm-up, also checks the no-op
        variant(name)("warmup")
    print(
        f"   no-op rerun `snakemake --cores 1` (same flags + --configfile for both; each "
        f"checked to print {NOTHING!r}), {a.rounds} rounds alternating:"
    )
    results = common.alternate(
        a.rounds,
        {"project": variant("project"), "bare": variant("bare")},
        on_run=lambda r, name, run: print(
            f"     round {r + 1} {name:7s} {run.wall_s:6.2f} s {run.maxrss_mib:5.0f} MiB",
            flush=True,
        ),
    )
    for line in common.report(results):
        print(line)
    print(f"\nlogs and copies under {root}")


if __name__ == "__main__":
    main()

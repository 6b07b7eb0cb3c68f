"""Your script as a cell, on the project's local Slurm cluster: the two torchrun-style scripts of
the tests (tests/fixtures/scripts: a DDP script and an FSDP2 script, no dlscale import) as a
study of their own, and each script cell's wall time beside the same script run by hand with
srun, side by side in one run.

    bash scripts/slurm/cluster-up.sh --nodes 2          # (with its state folder and ports)
    .venv/bin/python benchmarks/script_cells.py [--reps 3] [--rounds 3] [--steps 20]

1. study: the scripts (DDP under launch `ranks`, FSDP2 under launch `torchrun`) at 1 and 2
   nodes, `--reps` repetitions each, through `snakemake --profile profiles/slurm` to the report,
   in a user's checkout under /var/tmp (the nodes see it). Printed: every cell's throughput
   beside the value its script printed (equal, to the digit, or the run fails), the scaling
   table of each script (median throughput, speedup, efficiency, n) and the report's figures.
2. wall: per script and node count, inside one allocation (salloc), `--rounds` alternating
   runs of the cell through the launcher (`python -m dlscale.run.launch`, launcher srun: the
   command's wall, start to exit, and the cell's own wall_seconds) and of the same script by
   hand with srun (`srun ... bash -c 'RANK=$SLURM_PROCID ... python train.py ...'`, under
   torchrun `srun ... torchrun --node-rank $SLURM_NODEID ...`): medians, the ratio and the
   target, cell <= 1.05 x by hand + 2 s.

`--help` only in the test command (it needs a cluster and minutes).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import REPO, bench_checkout, child_env, default_venvs, run_child  # noqa: E402

SNAKEMAKE = REPO / ".venv" / "bin" / "snakemake"

SCRIPTS = {  # label -> (its folder under tests/fixtures/scripts, launch)
    "ddp_script": ("ddp", "ranks"),
    "fsdp2_script": ("fsdp2", "torchrun"),
}
PATTERN = "throughput: (?P<value>[0-9.]+) samples/s"
TARGET_RATIO, TARGET_SLACK_S = 1.05, 2.0


def study_file(steps: int, reps: int) -> dict:
    scripts = {}
    for label, (folder, launch) in SCRIPTS.items():
        scripts[label] = {
            "script": f"user_scripts/{folder}/train.py",
            "launch": launch,
            "command": [
                "{python}",
                "{script}",
                "--batch-size",
                "{per_rank_batch}",
                "--steps",
                "{steps}",
                "--warmup",
                "{warmup_steps}",
                "--seed",
                "{seed}",
                "--out",
                "{output_dir}",
            ],
            "throughput": {"pattern": PATTERN, "unit": "samples"},
        }
    return {
        "study": "scripts",
        "workloads": ["script"],
        "axes": {"hardware": ["cpu"], "nodes": [1, 2], "policy": ["weak"], "precision": ["fp32"]},
        "ranks_per_node": 1,
        "per_rank_batch": 32,
        "warmup_steps": 3,
        "steps": steps,
        "repetitions": reps,
        "database": "off",
        "script": {"scripts": scripts},
    }


def checkout(dest: Path, steps: int, reps: int) -> Path:
    bench_checkout(REPO, dest, default_venvs(REPO))
    for folder, _ in SCRIPTS.values():
        (dest / "user_scripts" / folder).mkdir(parents=True)
        shutil.copy(
            REPO / "tests" / "fixtures" / "scripts" / folder / "train.py",
            dest / "user_scripts" / folder / "train.py",
        )
    (dest / "script-study.yaml").write_text(yaml.safe_dump(study_file(steps, reps)))
    return dest


# ---- 1. the study -------------------------------------------------------------------------
def run_study(work: Path) -> float:
    command = [
        str(SNAKEMAKE),
        "--profile",
        "profiles/slurm",
        "--config",
        "study_file=script-study.yaml",
        "launcher=srun",
    ]
    run = run_child(command, work, child_env(work, SNAKEMAKE), work / "study.log")
    if run.rc != 0:
        raise SystemExit(f"the study failed (exit {run.rc}); its log {run.log}:\n{run.tail(4000)}")
    return run.wall_s


def check_cells(work: Path) -> list[dict]:
    """Each cell's throughput beside its rank 0's printed line: equal, to the digit."""
    import pandas as pd

    cells = pd.read_csv(work / "results" / "scripts" / "tables" / "cells.csv")
    rows = []
    for r in cells.itertuples():
        kept = sorted((work / Path(r.metrics_path).parent / "measurements").iterdir())[-1]
        printed = next(
            line.split()[1]
            for line in (kept / "rank0.log").read_text().splitlines()
            if line.startswith("throughput: ")
        )
        rows.append(
            {
                "cell": f"{r.framework}/n{r.nodes}/r{r.rep}",
                "printed": printed,
                "cell_value": repr(float(r.throughput_samples_per_s)),
                "equal": float(printed) == float(r.throughput_samples_per_s),
                "wall_s": float(r.wall_seconds),
            }
        )
    return rows


def scaling_rows(work: Path) -> list[dict]:
    import pandas as pd

    scaling = pd.read_csv(work / "results" / "scripts" / "tables" / "scaling.csv")
    return [
        {
            "script": r.framework,
            "nodes": int(r.nodes),
            "n": int(r.n),
            "median": float(r.throughput_samples_per_s_median),
            "speedup": float(r.speedup_median),
            "efficiency": float(r.scaling_efficiency_median),
        }
        for r in scaling.sort_values(["framework", "nodes"]).itertuples()
    ]


# ---- 2. the wall time, inside one allocation ------------------------------------------------
def hand_command(work: Path, label: str, nodes: int, steps: int, master: str, port: int) -> list:
    """The same script run by hand with srun, as a user writes it."""
    folder, launch = SCRIPTS[label]
    python = str(REPO / ".venv" / "bin" / "python")
    args = (
        f"user_scripts/{folder}/train.py --batch-size 32 --steps {steps} --warmup 3 --seed 0 "
        f"--out {work / 'by-hand'}"
    )
    if launch == "torchrun":
        inner = (
            f"exec {python} -m torch.distributed.run --nnodes={nodes} --nproc-per-node=1 "
            f"--node-rank=$SLURM_NODEID --master-addr={master} --master-port={port} {args}"
        )
    else:
        inner = (
            "export RANK=$SLURM_PROCID LOCAL_RANK=$SLURM_LOCALID WORLD_SIZE=$SLURM_NTASKS "
            f"LOCAL_WORLD_SIZE=1 MASTER_ADDR={master} MASTER_PORT={port}; exec {python} {args}"
        )
    return [
        "srun",
        f"--nodes={nodes}",
        f"--ntasks={nodes}",
        "--ntasks-per-node=1",
        "--cpus-per-task=1",
        "--kill-on-bad-exit=1",
        "bash",
        "-c",
        inner,
    ]


def inside(spec_path: Path) -> None:
    """In the allocation: alternate the launcher and the by-hand srun, `rounds` times each."""
    spec = json.loads(spec_path.read_text())
    work = Path(spec["work"])
    hosts = subprocess.run(
        ["scontrol", "show", "hostnames", os.environ["SLURM_JOB_NODELIST"]],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    out = {"cell": [], "cell_own": [], "hand": []}
    env = child_env(work, SNAKEMAKE)
    (work / "by-hand").mkdir(exist_ok=True)
    for r in range(spec["rounds"]):
        for variant in ("cell", "hand") if r % 2 == 0 else ("hand", "cell"):
            if variant == "cell":
                metrics = work / "walltime" / f"{spec['label']}-n{spec['nodes']}-{r}" / "m.jsonl"
                command = [
                    str(REPO / ".venv" / "bin" / "python"),
                    "-m",
                    "dlscale.run.launch",
                    "--cell-json",
                    spec["cell"],
                    "--output",
                    str(metrics),
                ]
            else:
                port = 12000 + (int(os.environ["SLURM_JOB_ID"]) * 7 + r) % 3000
                command = hand_command(
                    work, spec["label"], spec["nodes"], spec["steps"], hosts[0], port
                )
            t0 = time.perf_counter()
            done = subprocess.run(command, cwd=work, env=env, capture_output=True, text=True)
            wall = time.perf_counter() - t0
            if done.returncode != 0:
                raise SystemExit(f"{variant} failed:\n{done.stdout[-2000:]}{done.stderr[-3000:]}")
            out[variant].append(wall)
            if variant == "cell":
                last = json.loads(metrics.read_text().splitlines()[-1])
                out["cell_own"].append(last["value"]["wall_seconds"])
    print(json.dumps(out))


def wall_times(work: Path, label: str, nodes: int, steps: int, rounds: int) -> dict:
    sys.path.insert(0, str(work / "scripts"))
    from dlscale.study.matrix import load_workflow_study

    study = load_workflow_study({"study_file": "script-study.yaml", "launcher": "srun"}, work)
    cell = next(c for c in study.cells if c.framework == label and c.nodes == nodes)
    spec = work / f"wall-{label}-{nodes}.json"
    spec.write_text(
        json.dumps(
            {
                "work": str(work),
                "label": label,
                "nodes": nodes,
                "steps": steps,
                "rounds": rounds,
                "cell": cell.to_json(),
            }
        )
    )
    command = [
        "salloc",
        f"--nodes={nodes}",
        f"--ntasks={nodes}",
        "--ntasks-per-node=1",
        "--cpus-per-task=1",
        "--mem=3000",
        "--time=60",
        str(REPO / ".venv" / "bin" / "python"),
        str(Path(__file__).resolve()),
        "--inside",
        str(spec),
    ]
    env = child_env(work, SNAKEMAKE)
    done = subprocess.run(command, cwd=work, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"salloc failed:\n{done.stdout[-2000:]}{done.stderr[-3000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    cell, hand = statistics.median(result["cell"]), statistics.median(result["hand"])
    return {
        "script": label,
        "nodes": nodes,
        "cell_s": result["cell"],
        "cell_own_s": result["cell_own"],
        "hand_s": result["hand"],
        "cell_median": cell,
        "hand_median": hand,
        "ratio": cell / hand,
        "bound_s": TARGET_RATIO * hand + TARGET_SLACK_S,
        "within": cell <= TARGET_RATIO * hand + TARGET_SLACK_S,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=3, help="repetitions of each study cell")
    parser.add_argument("--rounds", type=int, default=3, help="alternations of the wall test")
    parser.add_argument("--steps", type=int, default=20, help="timed steps of each script")
    parser.add_argument("--keep", type=Path, default=None, help="work in this (new) folder")
    parser.add_argument("--skip-study", action="store_true", help="the wall test only")
    parser.add_argument("--inside", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.inside:
        inside(args.inside)
        return 0
    from submission import cluster_ready

    cluster_ready()
    work = args.keep or Path(tempfile.mkdtemp(prefix="dlscale-script-bench-", dir="/var/tmp"))
    if args.keep:
        shutil.rmtree(work, ignore_errors=True)
    checkout(work, args.steps, args.reps)
    print(f"checkout {work} on {socket.gethostname()}")
    report = {}
    if not args.skip_study:
        wall = run_study(work)
        report["study_wall_s"] = wall
        report["cells"] = check_cells(work)
        report["scaling"] = scaling_rows(work)
        print(f"study: {len(report['cells'])} cells to the report in {wall:.0f} s")
        for row in report["cells"]:
            print(
                f"  {row['cell']:<20} printed {row['printed']:>12}  cell {row['cell_value']:>12}"
                f"  equal {row['equal']}  wall {row['wall_s']:.1f} s"
            )
        for row in report["scaling"]:
            print(
                f"  {row['script']:<13} n{row['nodes']}  n={row['n']}  median {row['median']:.2f}"
                f" samples/s  speedup {row['speedup']:.3f}  efficiency {row['efficiency']:.3f}"
            )
        figures = sorted((work / "results" / "scripts" / "figures" / "cpu").glob("*.pdf"))
        print(f"  figures: {', '.join(f.name for f in figures)}")
        if not all(row["equal"] for row in report["cells"]):
            raise SystemExit("a cell's throughput is not what its script printed")
    report["wall"] = [
        wall_times(work, label, nodes, args.steps, args.rounds)
        for label in SCRIPTS
        for nodes in (1, 2)
    ]
    for row in report["wall"]:
        print(
            f"wall {row['script']:<13} n{row['nodes']}: cell median {row['cell_median']:.2f} s "
            f"(own {statistics.median(row['cell_own_s']):.2f} s), by hand {row['hand_median']:.2f}"
            f" s, ratio {row['ratio']:.3f}, bound {row['bound_s']:.2f} s: "
            f"{'within' if row['within'] else 'OUTSIDE'}"
        )
    (work / "script_cells.json").write_text(json.dumps(report, indent=1))
    print(f"results: {work / 'script_cells.json'}")
    return 0 if all(row["within"] for row in report["wall"]) else 1


if __name__ == "__main__":
    sys.exit(main())

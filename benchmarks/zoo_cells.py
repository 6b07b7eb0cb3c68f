"""Models from the zoo as cells, on the project's local Slurm cluster: the transformers
configurations of benchmarks/zoo-models.yaml (a 2-layer Llama, Mistral and GPT-2, a ViT, a ResNet
and a ConvNeXt, small sizes) and the example package's model by its `dlscale.models` entry point
(tests/fixtures/models/dlscale-example-models, installed by pip into a venv of the benchmark's
own), as one study at 1 and 2 nodes, one rank per node.

    bash scripts/slurm/cluster-up.sh --nodes 2          # (with its state folder and ports)
    .venv/bin/python benchmarks/zoo_cells.py [--reps 3] [--steps 5]

The study runs through `snakemake --profile profiles/slurm` to the report, in a user's checkout
under /var/tmp (the nodes see it). Printed per model, strategy and node count: the cells' status
(status.csv), the throughput's median and spread (min-max) over the repetitions (cells.csv,
samples/s), the parameters each rank built (its rank_start record) beside the library's own
count (the probe's `hf.num_parameters()`, an entry point's: the builder's module), equal or not;
then per model the speedup and efficiency at 2 nodes (scaling.csv). Exit 1 when a cell failed or
a count differs.

`--help` only in the test command (it needs a cluster and minutes).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import sys
import tempfile
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import REPO, bench_checkout, child_env, default_venvs, run_child  # noqa: E402

SNAKEMAKE = REPO / ".venv" / "bin" / "snakemake"
from helpers.model_package import install, own_venv  # noqa: E402

STUDY = Path(__file__).resolve().parent / "zoo-models.yaml"
ENTRY_MODEL = "example_convnet"
ENTRY_KWARGS = {"width": 8, "blocks": 2}


def study_file(env: Path, steps: int, reps: int) -> dict:
    """zoo-models.yaml with the entry point's model (its environment: `env`) under ddp."""
    config = yaml.safe_load(STUDY.read_text())
    config["models"][ENTRY_MODEL] = {
        "entry_point": ENTRY_MODEL,
        "environment": str(env),
        "kwargs": ENTRY_KWARGS,
    }
    config["axes"]["model"].append(ENTRY_MODEL)
    config["exclude"].append({"parallelism": "fsdp", "model": ENTRY_MODEL})
    config.update(steps=steps, repetitions=reps)
    return config


def checkout(dest: Path, steps: int, reps: int) -> Path:
    bench_checkout(REPO, dest, default_venvs(REPO))
    env = dest / "example-models-env"
    install(own_venv(env), "0.1.0", dest)
    (dest / "zoo-study.yaml").write_text(yaml.safe_dump(study_file(env, steps, reps)))
    return dest


def run_study(work: Path) -> float:
    command = [
        str(SNAKEMAKE),
        "--profile",
        "profiles/slurm",
        "--config",
        "study_file=zoo-study.yaml",
        "launcher=srun",
    ]
    run = run_child(command, work, child_env(work, SNAKEMAKE), work / "study.log")
    if run.rc != 0:
        print(f"the study failed (exit {run.rc}); its log {run.log}:\n{run.tail(4000)}")
    return run.wall_s


def rank_params(metrics: Path) -> list[int]:
    """The parameters each rank built, from its rank_start record."""
    counts = []
    for line in metrics.read_text().splitlines():
        record = json.loads(line)
        if record.get("event") == "rank_start":
            counts.append(record["value"]["param_count"])
    return counts


def rows_of(work: Path) -> list[dict]:
    """Per model, strategy and node count: status, throughput over the repetitions, counts."""
    import pandas as pd

    tables = work / "results" / "zoo-models" / "tables"
    status = pd.read_csv(tables / "status.csv")
    cells = pd.read_csv(tables / "cells.csv") if (tables / "cells.csv").is_file() else None
    rows = []
    for (model, parallelism, nodes), group in status.groupby(["model", "parallelism", "nodes"]):
        row = {
            "model": model,
            "parallelism": parallelism,
            "nodes": int(nodes),
            "status": {k: int(v) for k, v in group["status"].value_counts().items()},
        }
        if cells is not None:
            mine = cells[
                (cells.model == model) & (cells.parallelism == parallelism) & (cells.nodes == nodes)
            ]
            values = sorted(mine["throughput_samples_per_s"].astype(float))
            row.update(
                n=len(values),
                median=float(pd.Series(values).median()) if values else None,
                low=values[0] if values else None,
                high=values[-1] if values else None,
            )
        params = set()
        for path in group["metrics_path"]:
            if (work / path).is_file():
                params.update(rank_params(work / path))
        row["rank_params"] = sorted(params)
        rows.append(row)
    return rows


def library_counts(work: Path) -> dict:
    """Each model's parameters as its library counts them (the parse-time probe's record)."""
    sys.path.insert(0, str(work / "scripts"))
    from dlscale.study.matrix import load_workflow_study

    study = load_workflow_study({"study_file": "zoo-study.yaml", "launcher": "srun"}, work)
    out = {}
    for cell in study.cells:
        facts = json.loads(cell.model_source)["facts"]
        out[cell.model] = {
            "library": facts["library_param_count"],
            "title": json.loads(cell.model_source)["title"],
        }
    return out


def scaling_of(work: Path) -> list[dict]:
    import pandas as pd

    path = work / "results" / "zoo-models" / "tables" / "scaling.csv"
    if not path.is_file():
        return []
    scaling = pd.read_csv(path)
    return [
        {
            "model": r.model,
            "parallelism": r.parallelism,
            "nodes": int(r.nodes),
            "speedup": float(r.speedup_median),
            "efficiency": float(r.scaling_efficiency_median),
        }
        for r in scaling.sort_values(["model", "parallelism", "nodes"]).itertuples()
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=3, help="repetitions of each cell")
    parser.add_argument("--steps", type=int, default=5, help="timed steps of each cell")
    parser.add_argument("--keep", type=Path, default=None, help="work in this (new) folder")
    args = parser.parse_args()
    from submission import cluster_ready

    cluster_ready()
    load_before = os.getloadavg()
    work = args.keep or Path(tempfile.mkdtemp(prefix="dlscale-zoo-bench-", dir="/var/tmp"))
    if args.keep:
        shutil.rmtree(work, ignore_errors=True)
    checkout(work, args.steps, args.reps)
    print(f"checkout {work} on {socket.gethostname()}; load average {load_before}")
    counts = library_counts(work)
    wall = run_study(work)
    load_after = os.getloadavg()
    rows = rows_of(work)
    scaling = scaling_of(work)
    cells = sum(sum(r["status"].values()) for r in rows)
    print(f"study: {cells} cells to the report in {wall:.0f} s; load average after {load_after}")
    ok = True
    for row in rows:
        library = counts[row["model"]]["library"]
        equal = row["rank_params"] == [library]
        ok = ok and equal and set(row["status"]) == {"ok"}
        spread = (
            f"median {row['median']:9.2f} samples/s (min {row['low']:.2f}, max {row['high']:.2f},"
            f" n={row['n']})"
            if row.get("median") is not None
            else "no throughput"
        )
        print(
            f"  {row['model']:<16} {row['parallelism']:<5} n{row['nodes']}  {spread}  "
            f"status {row['status']}  params {row['rank_params']} library {library:,} "
            f"{'equal' if equal else 'DIFFERENT'}"
        )
    for row in scaling:
        if row["nodes"] > 1:
            print(
                f"  {row['model']:<16} {row['parallelism']:<5} n{row['nodes']}: speedup "
                f"{row['speedup']:.3f}, efficiency {row['efficiency']:.3f}"
            )
    figures = sorted((work / "results" / "zoo-models" / "figures" / "cpu").glob("*.pdf"))
    print(f"  figures: {', '.join(f.name for f in figures) or 'none'}")
    report = {
        "study_wall_s": wall,
        "load_before": load_before,
        "load_after": load_after,
        "models": counts,
        "rows": rows,
        "scaling": scaling,
    }
    (work / "zoo_cells.json").write_text(json.dumps(report, indent=1, default=str))
    print(f"results: {work / 'zoo_cells.json'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

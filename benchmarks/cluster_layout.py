"""Bring-up of the local Slurm cluster: separate hosts against the single-address layout, side by
side (as root).

    .venv/bin/python benchmarks/cluster_layout.py [--rounds 5] [--nodes 2] [--single-script PATH]

Each round brings up, cold (cluster-down.sh --purge first), a cluster of each layout in turn
(`--single-address`, `--separate-hosts`; which goes first alternates from round to round), each
in a state folder, ports, network name and subnet of its own, timed from cluster-up.sh's start
to its exit (it returns once every node is idle); then brings the same cluster up again with
the same settings (the second bring-up of a test run: it finds the first and does nothing),
timed too; then stops it. Printed: each bring-up, then the median of each layout and the ratio
separate / single (the target: at most 1.2). `--single-script` brings the single-address
cluster up with another cluster-up.sh (an older commit's, which made that layout alone and
knows no --single-address), so the new layout is timed against the old script itself.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
UP = REPO / "scripts" / "slurm" / "cluster-up.sh"
DOWN = REPO / "scripts" / "slurm" / "cluster-down.sh"
LAYOUTS = {"single": "--single-address", "hosts": "--separate-hosts"}


def cluster_env(layout: str) -> dict[str, str]:
    """A cluster of the benchmark's own per layout: state folder, ports, network and subnet."""
    k = list(LAYOUTS).index(layout)
    ctld = 6900 + 10 * k
    return dict(
        os.environ,
        DLSCALE_SLURM_DIR=f"/var/tmp/dlscale-bench-layout-{layout}",
        DLSCALE_SLURM_CTLD_PORT=str(ctld),
        DLSCALE_SLURM_DBD_PORT=str(ctld + 2),
        DLSCALE_SLURM_DB_PORT=str(3390 + k),
        DLSCALE_SLURM_NODE_PORT_BASE=str(18800 + 100 * k),
        DLSCALE_SLURM_FIRST_JOB_ID=str(900000 + 1000 * k),
        DLSCALE_SLURM_NET=f"dlbench{k}",
        DLSCALE_SLURM_SUBNET=f"10.215.{k}",
    )


def timed(args: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    proc = subprocess.run(args, env=env, capture_output=True, text=True, timeout=600)
    seconds = time.perf_counter() - start
    if proc.returncode:
        sys.exit(f"{' '.join(args)} failed:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    return seconds


def made(env: dict[str, str]) -> str:
    """The layout cluster-up.sh says it made (its state folder's etc/layout; an older script,
    which writes none, made the single-address one)."""
    path = Path(env["DLSCALE_SLURM_DIR"], "etc", "layout")
    if not path.exists():
        return "single"
    return path.read_text().splitlines()[0].removeprefix("layout=")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="bring-ups of each layout")
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument(
        "--single-script",
        type=Path,
        default=None,
        help="a cluster-up.sh that makes the single-address layout with no option (an older one)",
    )
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        sys.exit("cluster-up.sh runs as root: run this as root")
    cold: dict[str, list[float]] = {k: [] for k in LAYOUTS}
    again: dict[str, list[float]] = {k: [] for k in LAYOUTS}
    order = list(LAYOUTS)
    try:
        for r in range(args.rounds):
            for layout in order if r % 2 == 0 else order[::-1]:
                env = cluster_env(layout)
                timed(["bash", str(DOWN), "--purge", "--quiet"], env)
                up = ["bash", str(UP), "--nodes", str(args.nodes), "--no-system-conf"]
                up.append(LAYOUTS[layout])
                if layout == "single" and args.single_script:
                    up = ["bash", str(args.single_script), *up[2:-1]]
                cold[layout].append(timed(up, env))
                if made(env) != layout:
                    sys.exit(f"asked for {layout}, cluster-up.sh made {made(env)}")
                again[layout].append(timed(up, env))
                timed(["bash", str(DOWN), "--quiet"], env)
                print(
                    f"round {r + 1} {layout:6s} cold {cold[layout][-1]:.2f} s, "
                    f"again {again[layout][-1]:.2f} s",
                    flush=True,
                )
    finally:
        for layout in LAYOUTS:
            subprocess.run(
                ["bash", str(DOWN), "--purge", "--quiet"], env=cluster_env(layout), timeout=300
            )
    median = {k: statistics.median(v) for k, v in cold.items()}
    for layout in LAYOUTS:
        shown = " ".join(f"{s:.2f}" for s in cold[layout])
        print(
            f"{layout:6s} cold: median {median[layout]:.2f} s ({shown}); again: median "
            f"{statistics.median(again[layout]):.2f} s"
        )
    print(f"ratio separate hosts / single address: {median['hosts'] / median['single']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

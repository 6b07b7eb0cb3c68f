"""Network faults a real cluster has, on the local cluster's separate hosts, each timed (as root):

    export DLSCALE_SLURM_DIR=/var/tmp/dlscale-slurm-net DLSCALE_SLURM_CTLD_PORT=6887 \\
        DLSCALE_SLURM_DBD_PORT=6889 DLSCALE_SLURM_DB_PORT=3314 DLSCALE_SLURM_NODE_PORT_BASE=17800
    bash scripts/slurm/cluster-up.sh --nodes 2 --no-system-conf
    export SLURM_CONF=$DLSCALE_SLURM_DIR/etc/slurm.conf
    .venv/bin/python benchmarks/network_faults.py [--timeout 20] [--scenarios ...]

Each scenario runs the tiny study (tests/fixtures/tiny.yaml, throughput cells, pytorch
cnn_small on `cpu`) with `snakemake --profile profiles/slurm --keep-going` in a folder of its
own under /var/tmp (which the nodes share), and undoes its fault after:

  down-before   node n2's interface down before the study (2-node cells only): the entry's
                preflight fails naming n2, and no cell is allocated; timed: the start to the
                driver's line, and to the study's end (the driver cancels the held cells).
  cut-mid-cell  node n2 cut off while the 2-node cell runs (rank 1 on n2 sleeps before step 3,
                DLSCALE_FAULT, so rank 0 waits in a collective; the cut comes then), with
                DLSCALE_COLLECTIVE_TIMEOUT_S = --timeout: the cell fails, naming n2, within the
                timeout and the launcher's grace (dlscale.run.launch.STEP_END_GRACE_S) of the
                cut; the 1-node cell completes (the study goes on). Timed: the cut to the
                cell's failure record. n2 is brought back then (up, DOWN, RESUME: what an
                administrator does), and the study ends.
  site-ifname   the entry's env names the collectives' interface: GLOO_SOCKET_IFNAME=eth0 is
                honoured (the ranks record it, the cells pass); GLOO_SOCKET_IFNAME=ib0, which no
                node has, fails the 2-node cell at once naming it (no preflight: the cell's own
                check). Timed: each study.
  two-ifaces    n2 has a second interface on a network n1 cannot reach, and n2's own name
                resolves to it on n2: the ranks take the interface that reaches n1 (recorded:
                eth0, by the route) and the cells pass; then n2 resolves n1 to an address it
                has no route to: the cell fails at once, saying which interface to name.

Printed: one line per scenario (what happened, the seconds), then `all N scenarios as expected`
or the ones that were not. benchmarks/reports/2026-11-29-nodes-as-separate-hosts.md holds a
run's lines.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
from _common import copy_workflow  # noqa: E402
from helpers.cluster_layout import cut_off, decoy_interface, layout  # noqa: E402

SNAKEMAKE = REPO / ".venv" / "bin" / "snakemake"
CELL = "results/tiny/runs/cpu/pytorch/cnn_small/weak/fp32/eager/n{n}/r1"
SCENARIOS = ("down-before", "cut-mid-cell", "site-ifname", "two-ifaces")


def study(name: str, nodes=(1, 2), env: dict | None = None) -> Path:
    """The tiny study's throughput cells in a fresh folder the nodes share."""
    tiny = yaml.safe_load((REPO / "tests" / "fixtures" / "tiny.yaml").read_text())
    tiny["workloads"] = ["throughput"]
    tiny["axes"]["nodes"] = list(nodes)
    tiny["steps"] = 6
    folder = Path(f"/var/tmp/dlscale-bench-net-{name}")
    subprocess.run(["rm", "-rf", str(folder)], check=True)
    folder.mkdir(parents=True)
    work = copy_workflow(folder, tiny)
    if env is not None:
        site = work / "config" / "hardware.yaml"
        entries = yaml.safe_load(site.read_text())
        entries["cpu"]["env"] = env
        site.write_text(yaml.safe_dump(entries))
    return work


def start(work: Path, *args: str, **env: str) -> subprocess.Popen:
    return subprocess.Popen(
        [str(SNAKEMAKE), "--profile", "profiles/slurm", "--keep-going", "--retries", "0", *args],
        cwd=work,
        env=dict(os.environ, PATH=f"{SNAKEMAKE.parent}:{os.environ['PATH']}", **env),
        stdout=open(work / "snakemake.out", "w"),
        stderr=subprocess.STDOUT,
    )


def wait_for(check, timeout: float) -> float | None:
    """Seconds until `check()` holds, or None after `timeout`."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if check():
            return time.monotonic() - t0
        time.sleep(0.2)
    return None


def starts(work: Path, nodes: int) -> list[dict]:
    path = work / CELL.format(n=nodes) / "metrics.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines()]
    return [r["value"] for r in records if r["event"] == "rank_start"]


def failure(work: Path, nodes: int) -> dict | None:
    path = work / CELL.format(n=nodes) / "failure.json"
    return json.loads(path.read_text()) if path.exists() else None


def down_before(nodes, timeout: int) -> tuple[bool, str]:
    work = study("down-before", nodes=(2,))
    t0 = time.monotonic()
    with cut_off(nodes["n2"]):
        proc = start(work)
        proc.wait(timeout=900)
        ended = time.monotonic() - t0
    driver = (work / "results/tiny/logs/driver.log").read_text()
    said = next((line for line in driver.splitlines() if "failed (Slurm job" in line), "")
    result = next(json.loads(p.read_text()) for p in work.glob("results/tiny/preflight/*.json"))
    ok = (
        proc.returncode != 0
        and (result["failed"] or {}).get("name") == "nodes reachable"
        and "node n2" in result["failed"]["detail"]
        and not (work / CELL.format(n=2) / "metrics.jsonl").exists()
    )
    return ok, (
        f"preflight: {(result['failed'] or {}).get('name')}: {result['failed']['detail']}; "
        f"the driver said so at {said[:25]}, the study ended {ended:.1f} s after its start"
    )


def cut_mid_cell(nodes, timeout: int) -> tuple[bool, str]:
    work = study("cut-mid-cell")
    fault = f"n2/r1:1:3:sleep{3 * timeout}"  # rank 1 on n2 idles before step 3; rank 0 waits
    proc = start(work, DLSCALE_COLLECTIVE_TIMEOUT_S=str(timeout), DLSCALE_FAULT=fault)
    rank1 = work / CELL.format(n=2) / ".ranks" / "rank1.log"
    if wait_for(lambda: rank1.exists() and "sleeps" in rank1.read_text(), 600) is None:
        proc.kill()
        return False, "the 2-node cell's rank 1 never reached its fault"
    with cut_off(nodes["n2"]):
        after = wait_for(lambda: failure(work, 2) is not None, 10 * timeout + 60)
    proc.wait(timeout=900)
    rec = failure(work, 2) or {}
    n1_ok = (work / CELL.format(n=1) / "metrics.jsonl").exists()
    ok = after is not None and "node n2" in rec.get("reason", "") and n1_ok
    return ok, (
        f"cut at rank 1's fault; the cell failed {after if after is None else round(after, 1)} s "
        f"later (collective timeout {timeout} s): {rec.get('reason')}; the 1-node cell "
        f"{'completed' if n1_ok else 'did not complete'}"
    )


def site_ifname(nodes, timeout: int) -> tuple[bool, str]:
    work = study("site-ifname-eth0", env={"GLOO_SOCKET_IFNAME": "eth0"})
    t0 = time.monotonic()
    proc = start(work)
    proc.wait(timeout=900)
    good = time.monotonic() - t0
    chosen = {s["network"]["chosen_by"] for s in starts(work, 2)} if proc.returncode == 0 else {}
    work = study("site-ifname-ib0", nodes=(2,), env={"GLOO_SOCKET_IFNAME": "ib0"})
    t0 = time.monotonic()
    proc_bad = start(work, "--config", "preflight=False", "launcher=srun")
    proc_bad.wait(timeout=900)
    bad = time.monotonic() - t0
    log = (work / "results/tiny/logs/train" / CELL.format(n=2).split("runs/")[1]).with_suffix(
        ".log"
    )
    said = log.read_text() if log.exists() else ""
    ok = chosen == {"the site: GLOO_SOCKET_IFNAME=eth0"} and "GLOO_SOCKET_IFNAME=ib0 names" in said
    return ok, (
        f"eth0: cells passed, ranks recorded {sorted(chosen)} ({good:.1f} s); ib0: the cell "
        f"failed naming it ({'yes' if 'GLOO_SOCKET_IFNAME=ib0 names' in said else 'no'}), the "
        f"study ended after {bad:.1f} s"
    )


def two_ifaces(nodes, timeout: int) -> tuple[bool, str]:
    work = study("two-ifaces")
    t0 = time.monotonic()
    with decoy_interface(nodes["n2"]):
        proc = start(work)
        proc.wait(timeout=900)
    seconds = time.monotonic() - t0
    network = {s["node"]: s["network"] for s in starts(work, 2)} if proc.returncode == 0 else {}
    picked = {n: (v["interface"], v["chosen_by"]) for n, v in network.items()}
    work2 = study("two-ifaces-no-route", nodes=(2,))
    hosts = nodes["n2"].folder / "hosts"
    before = hosts.read_text()
    t0 = time.monotonic()
    try:
        others = "".join(
            line for line in before.splitlines(keepends=True) if "n1" not in line.split()[1:]
        )
        with open(hosts, "w") as fh:  # n2 resolves n1 to an address it has no route to, only
            fh.write(f"10.211.0.1\tn1\n{others}")
        proc2 = start(work2, "--config", "preflight=False", "launcher=srun")
        proc2.wait(timeout=900)
    finally:
        with open(hosts, "w") as fh:
            fh.write(before)
    failed = time.monotonic() - t0
    rec = failure(work2, 2) or {}
    tails = " ".join(rec.get("log_tail", {}).values())
    said = "GLOO_SOCKET_IFNAME: <name>" in tails or "does not resolve" in tails
    ok = picked.get("n2") == ("eth0", "the route to n1") and said
    return ok, (
        f"a second interface on n2: the ranks took {picked} ({seconds:.1f} s); no route from n2 "
        f"to n1: the cell failed {'saying which interface to name' if said else 'otherwise'}, "
        f"the study ended after {failed:.1f} s"
    )


RUN = {
    "down-before": down_before,
    "cut-mid-cell": cut_mid_cell,
    "site-ifname": site_ifname,
    "two-ifaces": two_ifaces,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--timeout", type=int, default=20, help="DLSCALE_COLLECTIVE_TIMEOUT_S")
    parser.add_argument("--scenarios", nargs="+", choices=SCENARIOS, default=list(SCENARIOS))
    args = parser.parse_args(argv)
    if os.geteuid() != 0 or not os.environ.get("SLURM_CONF"):
        sys.exit("run as root, with the cluster's SLURM_CONF and DLSCALE_SLURM_DIR (docstring)")
    nodes = layout()
    if not nodes.separate_hosts:
        sys.exit("the cluster is the single-address layout: start it with --separate-hosts")
    bad = []
    for name in args.scenarios:
        with contextlib.suppress(KeyboardInterrupt):
            ok, text = RUN[name](nodes.nodes, args.timeout)
            print(f"{name}: {'as expected' if ok else 'NOT as expected'}: {text}", flush=True)
            if not ok:
                bad.append(name)
    print(
        f"all {len(args.scenarios)} scenarios as expected"
        if not bad
        else f"not as expected: {', '.join(bad)}"
    )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

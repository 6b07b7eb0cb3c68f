"""Packing's real benefit: the same 20-cell study unpacked (one Slurm job per cell)
and packed (config `pack`: cells in allocations, dlscale.workflow.packing), side by side on the
project's local cluster, against a competing workload of a second Slurm user and on an idle
cluster.

    export DLSCALE_SLURM_DIR=/var/tmp/dlscale-slurm-pack DLSCALE_SLURM_CTLD_PORT=6867 \\
        DLSCALE_SLURM_DBD_PORT=6869 DLSCALE_SLURM_DB_PORT=3312 DLSCALE_SLURM_NODE_PORT_BASE=17700
    bash scripts/slurm/cluster-up.sh --nodes 2 --no-system-conf --fairshare
    export SLURM_CONF=$DLSCALE_SLURM_DIR/etc/slurm.conf
    .venv/bin/python benchmarks/packing.py [--rounds 3] [--idle-rounds 3] [--pack 10]
    bash scripts/slurm/cluster-down.sh

The scheduler: with Slurm's default FIFO order (priority/basic) a study's 20 jobs, submitted at
once, are older than every job the competitor submits after them, so they never wait behind it
one by one. On a shared cluster a job's wait comes from multi-user priority, fair share. The
benchmark therefore needs the cluster started with `--fairshare` (priority/multifactor, fair
share the only weight, usage recalculated every minute, Slurm's smallest period, and halved every
5 minutes) and gives the two users equal shares (accounts `dlscale-study` for the study's user,
its default account, and `dlscale-others` for `dlscale-bg`, Fairshare=1 each); before every run
both users' recorded usage is reset to 0 (`sacctmgr ... set RawUsage=0`), and under the
competitor the study starts once slurmctld has charged the competitor's first use to its fair
share (sshare RawUsage > 0, at the next recalculation, within a minute of filling the cluster),
so every run starts from the same priorities: the competitor has used the cluster, the study
not at all (at 0 against 0, Slurm's fair tree ranks the accounts in their own order, which
would decide the first minute by name). `--fifo` runs on a FIFO cluster anyway
(to show what FIFO does).

The competing workload (`--competitor`, started by the benchmark as its own process): the Linux
user `dlscale-bg` (created with useradd when missing; the cluster's nodes are this host) keeps
`--backlog` (4) 1-node jobs of 15 s (`sbatch --nodes=1 --time=1 --wrap 'sleep 15'`) waiting,
resubmitting as they start, polled every second; it stops by itself after 200 jobs or 15 minutes
and cancels its jobs when it stops. The benchmark stops it after each run (and `scancel -u
dlscale-bg` in a `finally`). A run starts once the competitor holds every node with at least 2
jobs waiting.

The study: pytorch cnn_small on `cpu`, 1 node, weak, fp32, workloads [throughput], 20
repetitions (20 one-node cells of one series), 2 warm-up and 20 timed steps, no preflight
(tests/fixtures/tiny.yaml's style), run with `snakemake --profile profiles/slurm` to the cell
tables (`results/<study>/tables/cells.csv`, scaling.csv); the packed run's config file says
`pack: 10`, the only difference.
Each run has its own copy of the workflow (so Slurm's WorkDir names its jobs).

Per run: the wall time from the command's start to the last cell's metrics file; the study's
allocations, counted in slurmctld's own log (`sched: Allocate JobId=` and the backfill's
`Started JobId=` lines of the study's jobs, whose ids sacct gives by WorkDir), and its sbatch
submissions (`_slurm_rpc_submit_batch_job`); the study's queue wait (sacct Submit to Start,
summed); what the scheduler did: the competitor's jobs started between the study's first
submission and its last cell, and the order of both users' starts (slurmctld's log, S = study,
b = competitor); the spread of the repeated cells' throughput (cells.csv
throughput_samples_per_s: median, min, max, (max - min) / median) and scaling.csv's
`placements` (distinct node sets the repetitions ran on). Then medians over the rounds and the
packed / unpacked ratios, against the targets: allocations <= ceil(cells / pack), wall
packed <= 0.5x unpacked under the competitor, <= 1.1x on an idle cluster. Every run's record
goes to <workdir>/runs.jsonl, the logs beside it.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import REPO, bench_checkout, child_env, default_venvs, run_child  # noqa: E402
from _fair_share import (  # noqa: E402
    BG_USER,
    cluster_ready,
    ensure_users,
    queue,
    raw_usage,
    reset_usage,
    sh,
    wait_charged,
    wait_empty,
)
from _pack_plans import planned_order, recorded_order, side_by_side  # noqa: E402

SNAKEMAKE = REPO / ".venv" / "bin" / "snakemake"
DLSCALE = REPO / ".venv" / "bin" / "dlscale"
STUDY = "packbench"
BG_SECONDS = 15  # each competing job's sleep
BG_MAX_JOBS, BG_MAX_S = 200, 900  # the competitor's hard caps (it stops by itself)
TARGET_CONTENDED, TARGET_IDLE = 0.5, 1.0  # packed / unpacked wall (fair share; idle)
TARGET_FIFO = 1.0  # packed / unpacked wall under the competitor on a FIFO cluster


# ------------------------------------------------------------------------ the competitor
def competitor(backlog: int, max_jobs: int, max_s: float, log: Path) -> int:
    """Keep `backlog` 1-node jobs of BG_SECONDS waiting as user BG_USER; stop after max_jobs
    submissions or max_s seconds (or SIGTERM) and cancel what is left."""
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    env = dict(os.environ)
    submit = [
        "runuser", "-u", BG_USER, "--", "sbatch", "--parsable", "--nodes=1", "--ntasks=1",
        "--time=1", "--job-name=dlscale-bg", "--output=/dev/null",
        "--wrap", f"sleep {BG_SECONDS}",
    ]  # fmt: skip
    t0, submitted = time.monotonic(), 0
    with log.open("a") as fh:
        try:
            while not stop and time.monotonic() - t0 < max_s:
                jobs = queue(BG_USER)
                pending = sum(j["state"] == "PENDING" for j in jobs)
                running = sum(j["state"] in ("RUNNING", "CONFIGURING") for j in jobs)
                for _ in range(max(0, backlog - pending)):
                    if submitted >= max_jobs:
                        break
                    out = subprocess.run(
                        submit, capture_output=True, text=True, env=env, cwd="/tmp", timeout=60
                    )
                    submitted += out.returncode == 0
                record = {"t": time.time(), "pending": pending, "running": running}
                fh.write(json.dumps(record | {"submitted": submitted}) + "\n")
                fh.flush()
                if submitted >= max_jobs and not jobs:
                    break
                time.sleep(1)
        finally:
            subprocess.run(["scancel", "-u", BG_USER], capture_output=True, timeout=60)
    return 0


class Competitor:
    """The competitor as a process of its own (it stops by itself at its caps)."""

    def __init__(self, backlog: int, log: Path):
        self.log = log
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--competitor", "--backlog", str(backlog),
             "--competitor-log", str(log)],
            start_new_session=True,
        )  # fmt: skip

    def wait_full(self, nodes: int, timeout: float = 120) -> None:
        """Until the competitor holds every node and has at least 2 jobs waiting."""
        deadline = time.monotonic() + timeout
        while True:
            jobs = queue(BG_USER)
            running = sum(j["state"] == "RUNNING" for j in jobs)
            pending = sum(j["state"] == "PENDING" for j in jobs)
            if running >= nodes and pending >= 2:
                return
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the competitor did not fill the cluster: {jobs}")
            time.sleep(0.5)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        subprocess.run(["scancel", "-u", BG_USER], capture_output=True, timeout=60)

    def min_pending(self, start: float, end: float) -> int | None:
        """The fewest competitor jobs seen waiting between start and end (its own polls)."""
        seen = []
        for line in self.log.read_text().splitlines():
            r = json.loads(line)
            if start <= r["t"] <= end:
                seen.append(r["pending"])
        return min(seen) if seen else None


# ----------------------------------------------------------------------------- the study
def study_config(cells: int, mixed: bool = False) -> dict:
    """`cells` one-node cells (repetitions of one series), or with `mixed` half as many
    repetitions at 1 and at 2 nodes."""
    config = yaml.safe_load((REPO / "tests" / "fixtures" / "tiny.yaml").read_text())
    config.pop("convergence", None)
    config.update(
        study=STUDY,
        repetitions=cells // 2 if mixed else cells,
        workloads=["throughput"],
        warmup_steps=2,
        steps=20,
        preflight=False,
    )
    config["axes"]["nodes"] = [1, 2] if mixed else [1]
    return config


def metrics_files(work: Path) -> list[Path]:
    """Each cell's metrics file (the link to its one measurement, not the measurement too)."""
    runs = work / "results" / STUDY / "runs"
    return sorted(p for p in runs.rglob("metrics.jsonl") if "measurements" not in p.parts)


LOG_TIME = re.compile(r"^\[(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?)\] (.*)$")
ALLOCATE = re.compile(r"(?:sched: Allocate|backfill: _start_job: Started) JobId=(\d+)")
SUBMIT = re.compile(r"_slurm_rpc_submit_batch_job: JobId=(\d+)")


def ctld_events(log: Path, offset: int) -> list[tuple[float, str, str]]:
    """slurmctld's own log from byte `offset`: (time, "start" | "submit", job id)."""
    events = []
    with log.open("rb") as fh:
        fh.seek(offset)
        for raw in fh:
            m = LOG_TIME.match(raw.decode(errors="replace").rstrip("\n"))
            if not m:
                continue
            stamp, text = m.groups()
            t = time.mktime(time.strptime(stamp.split(".")[0], "%Y-%m-%dT%H:%M:%S"))
            t += float("0." + stamp.split(".")[1]) if "." in stamp else 0.0
            for kind, rx in (("start", ALLOCATE), ("submit", SUBMIT)):
                found = rx.search(text)
                if found:
                    events.append((t, kind, found.group(1)))
    return events


def sacct_jobs(since: float) -> list[dict]:
    """Every job sacct knows since `since` (allocations only, -X)."""
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(since - 5))
    fields = "JobIDRaw,User,WorkDir,Submit,Start,End,State,NodeList,JobName"
    out = sh(["sacct", "-X", "-n", "-P", "-a", "-S", stamp, "-o", fields])
    jobs = []
    for line in out.splitlines():
        parts = line.split("|")
        if len(parts) != 9:
            continue
        row = dict(zip(fields.split(","), parts, strict=True))
        for key in ("Submit", "Start", "End"):
            try:
                row[key] = time.mktime(time.strptime(row[key], "%Y-%m-%dT%H:%M:%S"))
            except ValueError:
                row[key] = None
        jobs.append(row)
    return jobs


def spread(values: list[float]) -> dict:
    med = statistics.median(values)
    return {
        "median": med,
        "min": min(values),
        "max": max(values),
        "rel_spread": (max(values) - min(values)) / med if med else float("nan"),
    }


def measure(
    root: Path,
    name: str,
    pack: int | None,
    cells: int,
    config: dict,
    competitor,
    mixed: bool = False,
    pack_steps: str = "concurrent",
) -> dict:
    ctld_log = Path(config["SlurmctldLogFile"])
    work = root / name
    shutil.rmtree(work, ignore_errors=True)
    bench_checkout(REPO, work, default_venvs(REPO))
    study = study_config(cells, mixed) | (
        {} if pack is None else {"pack": pack, "pack_steps": pack_steps}
    )
    (work / "config" / "config.yaml").write_text(yaml.safe_dump(study))
    env = child_env(work, SNAKEMAKE)
    plan = planned_order(work, env, SNAKEMAKE) if pack is not None else None
    reset_usage()
    bg, usage = None, {}
    if competitor is not None:
        bg = Competitor(competitor["backlog"], root / f"{name}.competitor.jsonl")
    try:
        if bg is not None:
            bg.wait_full(competitor["nodes"])
            if config.get("PriorityType") == "priority/multifactor":
                wait_charged()
            usage = raw_usage()
        offset = ctld_log.stat().st_size
        targets = [f"results/{STUDY}/tables/cells.csv", f"results/{STUDY}/tables/scaling.csv"]
        args = [str(SNAKEMAKE), "--profile", "profiles/slurm", *targets]
        start = time.time()
        run = run_child(args, work, child_env(work, SNAKEMAKE), root / f"{name}.log")
        end = time.time()
    finally:
        if bg is not None:
            bg.stop()
    if run.rc != 0:
        raise SystemExit(f"{name}: snakemake failed (exit {run.rc}); log {run.log}:\n{run.tail()}")
    paths = metrics_files(work)
    if len(paths) != cells:
        raise SystemExit(f"{name}: {len(paths)} metrics files, expected {cells}")
    last = max(p.stat().st_mtime for p in paths)
    time.sleep(2)  # slurmctld writes the last lines, slurmdbd records the last jobs
    jobs = sacct_jobs(start)
    ours = {j["JobIDRaw"]: j for j in jobs if j["WorkDir"] == str(work)}
    bg_ids = {j["JobIDRaw"] for j in jobs if j["User"] == BG_USER}
    events = ctld_events(ctld_log, offset)
    starts = [(t, jid) for t, kind, jid in events if kind == "start"]
    study_starts = [(t, jid) for t, jid in starts if jid in ours]
    submits = [jid for _, kind, jid in events if kind == "submit" and jid in ours]
    first_submit = min((j["Submit"] for j in ours.values() if j["Submit"]), default=start)
    window = [(t, jid) for t, jid in starts if first_submit - 1 <= t <= last]
    order = "".join("S" if jid in ours else "b" if jid in bg_ids else "?" for _, jid in window)
    waits = [j["Start"] - j["Submit"] for j in ours.values() if j["Start"] and j["Submit"]]
    table = pd.read_csv(work / "results" / STUDY / "tables" / "cells.csv")
    scaling = pd.read_csv(work / "results" / STUDY / "tables" / "scaling.csv")
    record = {
        "run": name,
        "pack": pack,
        "competitor": competitor is not None,
        "wall_to_last_cell_s": last - start,
        "wall_s": run.wall_s,
        "allocations": len({jid for _, jid in study_starts}),
        "submissions": len(set(submits)),
        "sacct_jobs": len(ours),
        "queue_wait_sum_s": sum(waits),
        "queue_wait_max_s": max(waits, default=0.0),
        "competitor_starts_during_study": order.count("b"),
        "start_order": order,
        "throughput": spread(table["throughput_samples_per_s"].astype(float).tolist()),
        "placements": scaling["placements"].tolist() if "placements" in scaling else None,
        "nodes": sorted({j["NodeList"] for j in ours.values()}),
        "end_s": end - start,
        "usage_at_start": usage,
        "mixed": mixed,
        "pack_steps": pack_steps if pack is not None else None,
    }
    if pack is not None:
        record["planned_order"], record["recorded_order"] = plan, recorded_order(work, STUDY)
        record["plan_matches"] = plan == record["recorded_order"]
        record["side_by_side"] = round(side_by_side(work, STUDY), 3)
    if bg is not None:
        record["competitor_min_pending"] = bg.min_pending(first_submit, last)
    if pack is not None:
        status = subprocess.run(
            [str(DLSCALE), "status", "--all", f"results/{STUDY}"],
            cwd=work,
            env=child_env(work, SNAKEMAKE),
            capture_output=True,
            text=True,
            timeout=120,
        )
        (root / f"{name}.status.txt").write_text(status.stdout + status.stderr)
    return record


def describe(r: dict) -> str:
    tp = r["throughput"]
    text = (
        f"wall to last cell {r['wall_to_last_cell_s']:6.1f} s, {r['allocations']} allocations "
        f"({r['submissions']} sbatch), queue wait sum {r['queue_wait_sum_s']:.0f} s (max "
        f"{r['queue_wait_max_s']:.0f} s), throughput median {tp['median']:.1f} samples/s "
        f"[{tp['min']:.1f}..{tp['max']:.1f}] spread {100 * tp['rel_spread']:.1f} %, placements "
        f"{r['placements']}"
    )
    if "plan_matches" in r:
        text += (
            f", steps side by side {100 * r['side_by_side']:.0f} % of their time, start order "
            f"{'as' if r['plan_matches'] else 'NOT as'} the dry run planned"
        )
    if r["competitor"]:
        text += (
            f", competitor starts during the study {r['competitor_starts_during_study']} "
            f"(fewest waiting {r.get('competitor_min_pending')}), order {r['start_order']}"
        )
    return text


def summary(
    phase: str, runs: dict[str, list[dict]], cells: int, pack: int, fifo: bool = False
) -> list[str]:
    lines = []
    med = {}
    for name, rs in runs.items():
        if not rs:
            continue
        med[name] = {
            "wall": statistics.median(r["wall_to_last_cell_s"] for r in rs),
            "alloc": statistics.median(r["allocations"] for r in rs),
            "wait": statistics.median(r["queue_wait_sum_s"] for r in rs),
            "spread": statistics.median(r["throughput"]["rel_spread"] for r in rs),
            "tp": statistics.median(r["throughput"]["median"] for r in rs),
            "bg": statistics.median(r["competitor_starts_during_study"] for r in rs),
            "walls": [round(r["wall_to_last_cell_s"], 1) for r in rs],
        }
        m = med[name]
        lines.append(
            f"{phase} {name:8s} median over {len(rs)} round(s): wall to last cell "
            f"{m['wall']:.1f} s (rounds {m['walls']}), allocations {m['alloc']:.0f}, "
            f"queue wait sum {m['wait']:.0f} s, throughput median {m['tp']:.1f} samples/s, spread "
            f"{100 * m['spread']:.1f} %, competitor starts during the study {m['bg']:.0f}"
        )
    if "unpacked" in med and "packed" in med:
        ratio = med["packed"]["wall"] / med["unpacked"]["wall"]
        target = TARGET_IDLE
        if phase == "contended":
            target = TARGET_FIFO if fifo else TARGET_CONTENDED
        bound = math.ceil(cells / pack)
        lines.append(
            f"{phase} packed / unpacked wall {ratio:.2f} (target <= {target}: "
            f"{'met' if ratio <= target else 'NOT met'}); packed allocations "
            f"{med['packed']['alloc']:.0f} (target <= ceil({cells}/{pack}) = {bound}: "
            f"{'met' if med['packed']['alloc'] <= bound else 'NOT met'})"
        )
    return lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3, help="rounds under the competitor")
    p.add_argument("--idle-rounds", type=int, default=3, help="rounds on an idle cluster")
    p.add_argument("--cells", type=int, default=20, help="repetitions of the one-node cell")
    p.add_argument("--pack", type=int, default=10, help="cells per pack (config `pack`)")
    p.add_argument("--backlog", type=int, default=4, help="competitor jobs kept waiting")
    p.add_argument("--workdir", type=Path, default=None)
    p.add_argument("--fifo", action="store_true", help="run on a FIFO (priority/basic) cluster")
    p.add_argument(
        "--mixed", action="store_true", help="half the repetitions at 1 node, half at 2 nodes"
    )
    p.add_argument(
        "--pack-steps",
        choices=("concurrent", "serial"),
        default="concurrent",
        help="config pack_steps of the packed runs",
    )
    p.add_argument("--competitor", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--competitor-log", type=Path, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.competitor:
        sys.exit(competitor(a.backlog, BG_MAX_JOBS, BG_MAX_S, a.competitor_log))
    if not 2 <= a.cells <= 100:
        raise SystemExit("--cells: 2 to 100 (repetitions, config.schema.json)")
    if not 2 <= a.pack <= a.cells:
        raise SystemExit(f"--pack: 2 to --cells ({a.cells})")
    if a.backlog < 2:
        raise SystemExit("--backlog: at least 2 (the benchmark: at least 2 always waiting)")
    # SIGTERM ends the benchmark through its `finally`s (the competitor stopped, its jobs
    # cancelled); a background start ignores SIGINT
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    config = cluster_ready(a.fifo)
    ensure_users()
    nodes = len(set(sh(["sinfo", "-h", "-N", "-o", "%N"]).split()))
    root = a.workdir or Path(tempfile.mkdtemp(prefix="dlscale-packing-", dir="/var/tmp"))
    root.mkdir(parents=True, exist_ok=True)
    print(
        f"{a.cells} one-node cells (pytorch cnn_small, cpu, 20 timed steps) unpacked vs packed "
        f"(pack={a.pack}) on {nodes} nodes, {config['PriorityType']}; competitor: {BG_USER}, "
        f"{a.backlog} jobs of {BG_SECONDS} s waiting; work in {root}",
        flush=True,
    )
    variants = {"unpacked": None, "packed": a.pack}
    phases = [("contended", a.rounds, {"backlog": a.backlog, "nodes": nodes})]
    phases.append(("idle", a.idle_rounds, None))
    out = []
    try:
        for phase, rounds, comp in phases:
            runs: dict[str, list[dict]] = {name: [] for name in variants}
            for k in range(rounds):
                order = list(variants) if k % 2 == 0 else list(reversed(variants))
                for name in order:
                    wait_empty()
                    r = measure(
                        root,
                        f"{phase}-{name}-{k + 1}",
                        variants[name],
                        a.cells,
                        config,
                        comp,
                        a.mixed,
                        a.pack_steps,
                    )
                    runs[name].append(r)
                    with (root / "runs.jsonl").open("a") as fh:
                        fh.write(json.dumps(r) + "\n")
                    print(f"  {phase} round {k + 1} {name:8s} {describe(r)}", flush=True)
            out += summary(phase, runs, a.cells, a.pack, a.fifo)
            packed = runs.get("packed") or []
            if packed:
                matched = sum(r["plan_matches"] for r in packed)
                out.append(f"{phase} packed runs whose steps started as the dry run planned: "
                           f"{matched} of {len(packed)}")  # fmt: skip
    finally:
        subprocess.run(["scancel", "-u", BG_USER], capture_output=True, timeout=60)
    print("\n".join(out))


if __name__ == "__main__":
    main()

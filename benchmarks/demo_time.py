"""Where the demo's time goes, in a fresh clone: `git clone` of a checkout, then
`bash scripts/demo.sh` as a user runs it (set-up, then the demo study on the embedded default),
then `bash scripts/demo.sh` again with nothing changed (the no-op rerun).

    python3 benchmarks/demo_time.py                      # one fresh clone of this checkout's HEAD
    python3 benchmarks/demo_time.py --rounds 2 \\
        --variant before=/path/to/checkout@<commit> --variant after=/path/to/checkout
    python3 benchmarks/demo_time.py --setup-only --rounds 3 --variant ... # the set-up alone
    python3 benchmarks/demo_time.py --parse LOG_DIR      # the breakdown of a kept run again

Standard library only (it runs before any venv exists). Each variant is LABEL=REPO[@REF]: a
clone of REPO (its committed HEAD, or REF); variants alternate within each round, so a shared
machine's load falls on all of them alike (compare ratios within one run; the load average
is printed with each run).

Caches (`--caches`): `fresh-machine` (the default) gives each variant a cache folder of its own
(XDG_CACHE_HOME: pip's, uv's, dlscale's uv, matplotlib's and Snakemake's caches), empty at the
start and kept across that variant's rounds: `--rounds 2` is a fresh machine's first and second
clone (the target's "median of 2 fresh clones"). `cold`: empty caches for every run. `as-is`:
this machine's own caches, as they are. Each run says which, and whether its cache folder held
anything when it started.

The breakdown:
  set-up     each command of scripts/setup.sh that took >= 0.2 s (bash's xtrace with a clock,
             through BASH_ENV: nothing in the checkout is changed), summed by kind (the
             interpreter and the registry, the venv, the installer, the packages, the editable
             dlscale, checks) and the set-up's total (start to snakemake's exec);
  workflow   snakemake's start (its exec to the first job), each job from its start line to its
             "Finished jobid" line (each output line is stamped as it arrives), summed per rule
             kind (throughput cells, convergence cells, collect, figures, the report's steps);
             the cells' window and the downstream window (last cell to the end); per cell, the
             job's time beyond the cell's own wall time (wall_seconds of its metrics: the shell,
             the launcher's start and its merge), and the ranks' phases (rank_end `phases`:
             interpreter and imports, framework import, setup, idle probe, ...);
  LaTeX      the report_pdf job and the number of pdflatex runs latexmk made;
  no-op      the second `bash scripts/demo.sh` (target <= 2 s).
Each run's folder keeps its output with arrival times (demo.log), the set-up's trace and the
no-op's output; `--keep` keeps the clone too.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# sourced by every bash the run starts (BASH_ENV); traces scripts/demo.sh and scripts/setup.sh
# only (snakemake's job shells source it and do nothing)
TRACE_RC = """case $0 in
  *scripts/demo.sh|*scripts/setup.sh)
    exec {__demo_time_fd}>>"$DEMO_TIME_TRACE"
    BASH_XTRACEFD=$__demo_time_fd
    PS4='+ ${EPOCHREALTIME} '
    set -x ;;
esac
"""
SETUP_MIN_S = 0.2
# set-up commands by kind: the first pattern that matches a traced command names it
SETUP_KINDS = [
    ("editable dlscale", r"install .*(-e \.|--editable)"),
    ("installer (uv)", r"(pip install .*--target .*uv|\buv==)"),
    ("pip upgrade", r"pip install .*--upgrade .*pip"),
    ("packages", r"(pip install|installer install|uv pip install)"),
    ("venv", r"-m venv|uv venv"),
    ("byte-compile site-packages", r"installer compile"),
    ("byte-compile dlscale", r"compileall"),
    ("checks", r"capability|installer check|importlib\.metadata|_base_executable|pip config"),
    ("interpreter and registry", r"(dlscale\.registry|import os, sys|pyenv-|sys\.version_info)"),
]
CELL_RULE = re.compile(r"^(train|converge)_")
LINE = re.compile(r"^(\d+\.\d+) (.*)$")
DEMO = ["bash", "scripts/demo.sh"]


# ------------------------------------------------------------------------------------ running
class LoadSampler(threading.Thread):
    """The 1-minute load average every `every` seconds while a run lasts."""

    def __init__(self, every: float = 5.0):
        super().__init__(daemon=True)
        self.every, self.samples, self._done = every, [os.getloadavg()[0]], threading.Event()

    def run(self) -> None:
        while not self._done.wait(self.every):
            self.samples.append(os.getloadavg()[0])

    def stop(self) -> list[float]:
        self._done.set()
        self.join()
        self.samples.append(os.getloadavg()[0])
        return self.samples


def run_stamped(cmd: list[str], cwd: Path, env: dict, log: Path) -> tuple[int, float, float]:
    """Run `cmd`, writing each output line to `log` with its arrival time (seconds since the
    start). Returns (exit code, wall seconds, CPU seconds of it and the processes it waited
    for: user + system, less sensitive than the wall to what else the machine runs)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    with open(log, "w") as out:
        proc = subprocess.Popen(
            cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        for line in proc.stdout:
            out.write(f"{time.monotonic() - start:.3f} {line}")
        code = proc.wait()
    wall = time.monotonic() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    return code, wall, cpu


CACHE_VARIABLES = ("DLSCALE_CACHE_DIR", "UV_CACHE_DIR", "PIP_CACHE_DIR", "MPLCONFIGDIR")


def cache_env(mode: str, workdir: Path, label: str, round_: int) -> tuple[dict, bool | None]:
    """(environment changes, whether the run's cache folder held anything) for `mode`."""
    if mode == "as-is":
        return {}, None
    folder = workdir / "caches" / (label if mode == "fresh-machine" else f"{label}-{round_}")
    warm = folder.is_dir() and any(folder.iterdir())
    folder.mkdir(parents=True, exist_ok=True)
    return {"XDG_CACHE_HOME": str(folder), **dict.fromkeys(CACHE_VARIABLES)}, warm


def one_run(
    label: str,
    source: str,
    folder: Path,
    caches: tuple[str, dict, bool | None],
    keep: bool,
    setup_only: bool = False,
) -> dict:
    repo, _, ref = source.partition("@")
    clone = Path(tempfile.mkdtemp(prefix=f"demo-{label}-", dir="/tmp"))
    folder.mkdir(parents=True, exist_ok=True)
    try:
        subprocess.run(["git", "clone", "-q", repo, str(clone)], check=True)
        if ref:
            subprocess.run(["git", "-C", str(clone), "checkout", "-q", ref], check=True)
        commit = subprocess.run(
            ["git", "-C", str(clone), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
        ).stdout.strip()
        rc_file = folder / "trace.rc"
        rc_file.write_text(TRACE_RC)
        mode, changes, warm = caches
        env = {**os.environ, "BASH_ENV": str(rc_file), "DEMO_TIME_TRACE": str(folder / "trace")}
        env.update(changes)
        env = {k: v for k, v in env.items() if v is not None}
        sampler = LoadSampler()
        sampler.start()
        t0 = time.time()
        # as demo.sh calls it (root: with the Debian packages' check), or demo.sh itself
        system = ["--system-packages"] if os.geteuid() == 0 else []
        command = ["bash", "scripts/setup.sh", *system, "none"] if setup_only else DEMO
        code, wall, cpu = run_stamped(command, clone, env, folder / "demo.log")
        loads = sampler.stop()
        noop_env = {k: v for k, v in env.items() if k not in ("BASH_ENV", "DEMO_TIME_TRACE")}
        noop_code, noop, _ = run_stamped(command, clone, noop_env, folder / "noop.log")
        # the cells' records, for the per-cell breakdown
        cells = []
        for path in sorted((clone / "results").glob("**/metrics.jsonl")):
            if "measurements" not in path.parts:
                cells.append(cell_summary(path, clone))
        (folder / "cells.json").write_text(json.dumps(cells))
        pdf_logs = sorted(clone.glob("results/*/logs/report_pdf.log"))
        runs = [len(re.findall(r"^Run number \d+ of rule", p.read_text(), re.M)) for p in pdf_logs]
        # the packages the cells ran with: each list is named by its sha256 (the same
        # packages, the same name, whichever installer built the venv)
        lists = sorted(p.name for p in clone.glob("results/*/environments/*.txt"))
        meta = {
            "label": label,
            "source": source,
            "commit": commit,
            "exit": code,
            "wall_s": wall,
            "cpu_s": cpu,
            "setup_only": setup_only,
            "noop_exit": noop_code,
            "noop_s": noop,
            "load": loads,
            "started": t0,
            "pdflatex_runs": runs,
            "package_lists": lists,
            "caches": mode,
            "caches_warm": warm,
        }
        (folder / "run.json").write_text(json.dumps(meta))
        return meta
    finally:
        if not keep:
            shutil.rmtree(clone, ignore_errors=True)


def cell_summary(path: Path, root: Path) -> dict:
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    summary = next((r["value"] for r in records if r.get("event") == "summary"), {})
    phases = [
        r["value"].get("phases") or {}
        for r in records
        if r.get("event") == "rank_end" and r.get("rank") == 0
    ]
    return {
        "path": str(path.relative_to(root)),
        "wall_seconds": summary.get("wall_seconds"),
        "phases": phases[0] if phases else {},
    }


# ------------------------------------------------------------------------------------ parsing
def stamped_lines(text: str) -> list[tuple[float, str]]:
    out = []
    for line in text.splitlines():
        m = LINE.match(line)
        if m:
            out.append((float(m.group(1)), m.group(2)))
    return out


def snakemake_jobs(lines: list[tuple[float, str]]) -> list[dict]:
    """Jobs from snakemake's output: a job starts at its `rule NAME:` / `localrule NAME:` line
    (its jobid follows) and ends at `Finished jobid: N (Rule: NAME)`."""
    jobs, pending = {}, None
    for t, text in lines:
        m = re.match(r"^(?:local)?rule (\S+):$", text)
        if m:
            pending = (t, m.group(1))
            continue
        m = re.match(r"^\s+jobid: (\d+)$", text)
        if m and pending:
            jobs[int(m.group(1))] = {"rule": pending[1], "start": pending[0], "end": None}
            pending = None
            continue
        m = re.match(r"^Finished jobid: (\d+) \(Rule: (\S+)\)", text)
        if m and int(m.group(1)) in jobs:
            jobs[int(m.group(1))]["end"] = t
    return [j for j in jobs.values() if j["end"] is not None]


def rule_kind(rule: str) -> str:
    if rule.startswith("train_"):
        return "throughput cells"
    if rule.startswith("converge_"):
        return "convergence cells"
    if rule in ("figure", "convergence_figure"):
        return "figures"
    if rule.startswith("report_"):
        return rule
    return "other (collect, model, plan, verdicts, data)"


def trace_commands(trace: str) -> list[tuple[float, float, str]]:
    """(start, seconds, command) of each traced command: until the next traced line (the
    last one: 0)."""
    events = []
    for line in trace.splitlines():
        m = re.match(r"^(\++) (\d+\.\d+) (.*)$", line)
        if m:
            events.append((float(m.group(2)), m.group(3)))
    ends = [t for t, _ in events[1:]] + [events[-1][0] if events else 0.0]
    return [(t, end - t, cmd) for (t, cmd), end in zip(events, ends)]


def setup_kind(cmd: str) -> str:
    for kind, pattern in SETUP_KINDS:
        if re.search(pattern, cmd):
            return kind
    return "other"


def breakdown(folder: Path) -> dict:
    """The breakdown of one kept run (its folder from one_run)."""
    meta = json.loads((folder / "run.json").read_text())
    lines = stamped_lines((folder / "demo.log").read_text())
    commands = trace_commands((folder / "trace").read_text()) if (folder / "trace").exists() else []
    t0 = commands[0][0] if commands else None
    exec_at = next(
        (t - t0 for t, _, cmd in commands if re.search(r"exec \S*snakemake\b", cmd)), None
    )
    if meta.get("setup_only"):
        exec_at = meta["wall_s"]
    setup = {}
    slow = []
    for t, seconds, cmd in commands:
        if exec_at is not None and t - t0 >= exec_at:
            break
        if seconds >= SETUP_MIN_S:
            kind = setup_kind(cmd)
            setup[kind] = setup.get(kind, 0.0) + seconds
            slow.append((round(seconds, 2), kind, cmd[:120]))
    jobs = snakemake_jobs(lines)
    kinds: dict[str, float] = {}
    for job in jobs:
        kind = rule_kind(job["rule"])
        kinds[kind] = kinds.get(kind, 0.0) + job["end"] - job["start"]
    cell_jobs = [j for j in jobs if CELL_RULE.match(j["rule"])]
    out = {
        **meta,
        "setup_s": exec_at,
        "workflow_s": meta["wall_s"] - exec_at if exec_at is not None else None,
        "setup_kinds": setup,
        "setup_slow": slow,
        "job_kinds": kinds,
        "jobs": len(jobs),
    }
    if jobs and exec_at is not None:
        out["snakemake_start_s"] = min(j["start"] for j in jobs) - exec_at
        out["tail_s"] = meta["wall_s"] - max(j["end"] for j in jobs)
    if cell_jobs:
        last_cell = max(j["end"] for j in cell_jobs)
        out["cells_window_s"] = last_cell - min(j["start"] for j in cell_jobs)
        out["downstream_s"] = max(j["end"] for j in jobs) - last_cell
    pdf = [j for j in jobs if j["rule"] == "report_pdf"]
    out["latex_s"] = pdf[0]["end"] - pdf[0]["start"] if pdf else None
    cells_file = folder / "cells.json"
    cells = json.loads(cells_file.read_text()) if cells_file.exists() else []
    out["cells"] = len(cells)
    out["cell_phases"] = phase_medians(cells)
    out["cell_beyond_wall_s"] = beyond_wall(cell_jobs, cells, lines)
    return out


def phase_medians(cells: list[dict]) -> dict:
    names = sorted({k for c in cells for k in c["phases"]})
    return {
        n: statistics.median([c["phases"][n] for c in cells if n in c["phases"]]) for n in names
    }


def beyond_wall(cell_jobs: list[dict], cells: list[dict], lines) -> float | None:
    """The median of each cell job's time minus its cell's wall_seconds (jobs matched to cells
    by the metrics path in the job's `output:` line)."""
    outputs = {}
    pending = None
    for t, text in lines:
        if re.match(r"^(?:local)?rule (?:train|converge)_\S+:$", text):
            pending = t
        m = re.match(r"^\s+output: (\S+/metrics\.jsonl)", text)
        if m and pending is not None:
            outputs[pending] = m.group(1)
            pending = None
    wall = {c["path"]: c["wall_seconds"] for c in cells}
    extra = [
        j["end"] - j["start"] - wall[outputs[j["start"]]]
        for j in cell_jobs
        if outputs.get(j["start"]) in wall and wall[outputs[j["start"]]] is not None
    ]
    return statistics.median(extra) if extra else None


# ----------------------------------------------------------------------------------- printing
def fmt(value, unit="s") -> str:
    return "-" if value is None else f"{value:.1f} {unit}"


def print_run(b: dict) -> None:
    load = b["load"]
    print(
        f"\n== {b['label']} ({b['commit']}, {b['source']}): exit {b['exit']}, total "
        f"{fmt(b['wall_s'])} (CPU {fmt(b.get('cpu_s'))}), set-up {fmt(b['setup_s'])}, "
        f"workflow {fmt(b['workflow_s'])}, "
        f"no-op rerun {b['noop_s']:.2f} s (exit {b['noop_exit']}); load average "
        f"{statistics.median(load):.1f} median ({min(load):.1f}-{max(load):.1f})"
        + f"; caches {b.get('caches')}"
        + {True: " (warm)", False: " (empty)"}.get(b.get("caches_warm"), "")
    )
    print("  set-up by kind: " + ", ".join(f"{k} {v:.1f} s" for k, v in b["setup_kinds"].items()))
    for seconds, kind, cmd in b["setup_slow"]:
        print(f"    {seconds:6.2f} s  {kind:24s} {cmd}")
    print(
        f"  workflow: snakemake start {fmt(b.get('snakemake_start_s'))}, cells' window "
        f"{fmt(b.get('cells_window_s'))} ({b['cells']} cells), downstream "
        f"{fmt(b.get('downstream_s'))}, tail {fmt(b.get('tail_s'))}; {b['jobs']} jobs"
    )
    print("  job time by kind: " + ", ".join(f"{k} {v:.1f} s" for k, v in b["job_kinds"].items()))
    print(
        f"  per cell: job beyond the cell's wall time {fmt(b['cell_beyond_wall_s'])} (median); "
        "rank 0 phases (median): " + ", ".join(f"{k} {v:.2f}" for k, v in b["cell_phases"].items())
    )
    print(
        f"  LaTeX (report_pdf): {fmt(b['latex_s'])}, pdflatex runs {b.get('pdflatex_runs')}; "
        f"the cells' package lists: {', '.join(b.get('package_lists') or []) or '-'}"
    )


def print_summary(runs: list[dict]) -> None:
    labels = list(dict.fromkeys(r["label"] for r in runs))
    keys = [
        ("total", "wall_s"),
        ("total CPU", "cpu_s"),
        ("set-up", "setup_s"),
        ("workflow", "workflow_s"),
        ("cells' window", "cells_window_s"),
        ("downstream", "downstream_s"),
        ("no-op rerun", "noop_s"),
    ]
    print("\n== medians (per run), ratio to the first variant")
    base = labels[0]
    for name, key in keys:
        cols = []
        for label in labels:
            values = [r[key] for r in runs if r["label"] == label and r.get(key) is not None]
            if not values:
                cols.append(f"{label} -")
                continue
            med = statistics.median(values)
            base_values = [r[key] for r in runs if r["label"] == base and r.get(key)]
            ratio = f" ({med / statistics.median(base_values):.2f}x)" if base_values else ""
            each = ", ".join(f"{v:.1f}" for v in values)
            cols.append(f"{label} {med:.1f} s [{each}]{ratio if label != base else ''}")
        print(f"  {name:14s} " + " | ".join(cols))
    for label in labels:
        loads = [statistics.median(r["load"]) for r in runs if r["label"] == label]
        print(f"  load average during {label}: " + ", ".join(f"{x:.1f}" for x in loads))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="LABEL=REPO[@REF]",
        help="a checkout to clone (default: this checkout's HEAD, labelled 'head')",
    )
    parser.add_argument("--rounds", type=int, default=1, help="runs per variant, alternating")
    parser.add_argument("--workdir", type=Path, help="where the runs' logs go (default: a new one)")
    parser.add_argument(
        "--caches",
        choices=["fresh-machine", "cold", "as-is"],
        default="fresh-machine",
        help="each variant's own caches, warmed by its rounds (default); empty for every run; "
        "this machine's",
    )
    parser.add_argument("--keep", action="store_true", help="keep the clones")
    parser.add_argument(
        "--setup-only",
        action="store_true",
        help="time `bash scripts/setup.sh none` (the demo's set-up) instead of the whole demo",
    )
    parser.add_argument("--parse", type=Path, metavar="DIR", help="print the breakdown of DIR")
    args = parser.parse_args(argv)
    if args.parse:
        folders = sorted(p.parent for p in args.parse.glob("**/run.json"))
        runs = sorted((breakdown(f) for f in folders), key=lambda b: b["started"])
        for b in runs:
            print_run(b)
        if len(runs) > 1:
            print_summary(runs)
        return 0
    variants = [v.partition("=")[::2] for v in args.variant] or [("head", str(REPO))]
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="dlscale-demo-time-", dir="/var/tmp"))
    print(f"logs in {workdir}", flush=True)
    runs = []
    for round_ in range(1, args.rounds + 1):
        for label, source in variants:
            folder = workdir / f"{round_:02d}-{label}"
            changes, warm = cache_env(args.caches, workdir, label, round_)
            caches = (args.caches, changes, warm)
            one_run(label, source, folder, caches, args.keep, args.setup_only)
            b = breakdown(folder)
            runs.append(b)
            print_run(b)
            sys.stdout.flush()
    if len(runs) > 1:
        print_summary(runs)
    if not args.keep:
        shutil.rmtree(workdir / "caches", ignore_errors=True)
    return 0 if all(r["exit"] == 0 and r["noop_exit"] == 0 for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())

"""The results database's targets, measured: regression verdicts on synthetic noise, a history
query over many rows, the time to write a cell's row, and (with --workflow) real studies: the
database's cost to a study, two studies writing at once and a driver killed mid-study.

    PYTHONPATH=scripts .venv/bin/python benchmarks/history_database.py \
        [--trials 200] [--rows 100000] [--study results/demo] [--busy-rounds 4] [--workdir DIR] \
        [--workflow [--rounds 3] [--database URL | --postgres]]

- verdicts: `--trials` seeded trials of synthetic series with 2 % run-to-run noise (coefficient
  of variation) through dlscale.analysis.regression_stats.slowdown_verdict: a 10 % slowdown at
  6 repetitions per side is FAIL and no slowdown PASS, each in >= 95 % of the trials; at 2
  per side the answer is UNCERTAIN (targets).
- query: a SQLite database of `--rows` synthetic measurement rows (500 series of weekly runs, 5
  repetitions each), then the history of one configuration (dlscale.decisions.history: load +
  judge, as `dlscale history --hardware .. --framework .. --model .. --nodes ..` asks it) and a
  study's own history (the workflow's `history` rule: every series of the newest week); median
  of 3 each (target <= 1 s on SQLite), and the whole table's judged listing for scale.
- write: each cell of a study folder (`--study`, else 20 synthetic cells) recorded alone into a
  fresh database, as the driver records a landed cell (read, validate, one transaction): the
  median and the largest (target <= 50 ms).
- busy driver: each cell's row written as it lands while the driver's own thread is busy (a
  pure-Python loop, as Snakemake's bookkeeping when a job ends), by a recorder on a thread of
  the driver's process (as before) and by the recorder's own process (as the workflow starts
  it), `--busy-rounds` alternating rounds of each: the write times the recorder reports
  (target <= 50 ms).
- driver: the CPU seconds the database costs: the recorder's process (a new database, each of
  the study's cells written as it lands), the driver's own share of it, then the history job.
- --workflow (minutes): the demo study (config/config.yaml, 20 cells) on the local profile
  with the database and without (`--config database=off`), both started at once in fresh copies
  (side by side: both see the machine's other load), `--rounds` times: wall and CPU seconds of
  each driver with everything it started (target: the medians within 2 % or 1 s); then the
  tiny study as two studies at once into one database, and a third study whose driver is
  killed with SIGKILL as soon as its first row is written, run again: every study's rows
  counted against its folders (0 lost, 0 duplicated), SQLite's integrity_check. `--postgres`
  starts a PostgreSQL server of its own (scripts/postgres/up.sh) for that part; `--database
  URL` uses one; `--only-workflow` skips the parts above.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

import numpy as np
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
sys.path.insert(0, str(REPO / "tests"))  # helpers.results_db: synthetic rows and cells

from dlscale.analysis.regression_stats import FAIL, PASS, UNCERTAIN, slowdown_verdict  # noqa: E402
from dlscale.decisions import history  # noqa: E402
from dlscale.registry import frameworks  # noqa: E402
from dlscale.store import database as store  # noqa: E402
from dlscale.store import results_schema as schema  # noqa: E402

from helpers import results_db  # noqa: E402
from helpers.checkout import copy_workflow  # noqa: E402

NOISE = 0.02


# ---- verdicts ---------------------------------------------------------------------------------
def verdict_rates(trials: int, seed: int = 0) -> dict[str, dict[str, float]]:
    rng = np.random.default_rng(seed)
    cases = {"n=6, 10 % slower": (6, 0.10), "n=6, unchanged": (6, 0.0)}
    cases |= {"n=2, 10 % slower": (2, 0.10), "n=2, unchanged": (2, 0.0)}
    out = {}
    for name, (n, slowdown) in cases.items():
        found = []
        for _ in range(trials):
            base = 1000 * rng.normal(1, NOISE, n)
            new = 1000 * (1 - slowdown) * rng.normal(1, NOISE, n)
            found.append(slowdown_verdict(new, base).verdict)
        out[name] = {v: found.count(v) / trials for v in (FAIL, UNCERTAIN, PASS)}
    return out


# ---- query ------------------------------------------------------------------------------------
SERIES = [
    {"hardware": hw, "framework": fw, "model": model, "nodes": nodes}
    for hw in ("h100", "a100", "v100", "mi250", "cpu")
    for fw in (*frameworks.names()[:3], "jax")  # three registered frameworks and a label
    for model in ("llama3_8b", "resnet50", "gpt2_124m", "vit_b16", "bert_large")
    for nodes in (1, 2, 4, 8, 16)
]  # 500 series
REPS = 5


def build_database(path: Path, rows: int) -> tuple[store.Database, int]:
    runs = max(2, rows // (len(SERIES) * REPS))
    series = SERIES[: max(1, min(len(SERIES), rows // (runs * REPS)))]
    db = store.connect(f"sqlite:///{path}")
    made = results_db.synthetic_rows(
        series, runs, REPS, slowdown_at=runs - 1, start=datetime(2024, 1, 1)
    )
    with db.transaction() as conn:
        for start in range(0, len(made), 5000):
            schema.insert_new(conn, schema.measurements, made[start : start + 5000])
    return db, runs


def timed(fn, repeats: int = 3) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def query_timings(db: store.Database, runs: int) -> list[str]:
    lines = []
    one = {"hardware": "h100", "framework": "pytorch", "model": "llama3_8b", "nodes": 8}

    def configuration():
        return history.history_table(history.load(db, one))

    seconds, table = timed(configuration)
    newest = table.groupby("series").tail(1)
    lines.append(
        f"query one configuration: median {seconds:.3f} s over 3 (h100/pytorch/llama3_8b/n8: "
        f"{len(table)} runs, newest {', '.join(newest['verdict'])}); target <= 1 s"
    )
    study = f"week{runs - 1:03d}"
    seconds, hist = timed(lambda: history.study_history(db, study))
    lines.append(
        f"query a study's own history: median {seconds:.3f} s over 3 ({study}: "
        f"{len(hist.verdicts)} series judged: {hist.verdicts['verdict'].value_counts().to_dict()})"
    )
    seconds, table = timed(lambda: history.history_table(history.load(db)), repeats=1)
    lines.append(
        f"whole table judged (every run of every series): {seconds:.2f} s "
        f"({len(table)} runs of {table['series'].nunique()} series)"
    )
    return lines


# ---- write ------------------------------------------------------------------------------------
def write_timings(study: Path | None, workdir: Path) -> str:
    if study is None:
        study = results_db.write_study(workdir / "synthetic", "synthetic", nodes=(1, 2), reps=10)
    items = store.measurements_on_disk(study)
    db = store.connect(f"sqlite:///{workdir / 'write.sqlite'}")
    from dlscale.store import metrics

    metrics.prepare_validation()  # as the recorder does before the first landed cell
    times = []
    for item in items:
        t0 = time.perf_counter()
        store.record_measurements(db, store.study_name(study), [item])
        times.append((time.perf_counter() - t0) * 1e3)
    db.close()
    return (
        f"write one cell's row: median {statistics.median(times):.1f} ms, max {max(times):.1f} ms "
        f"over {len(times)} cells of {study} (read + validate + one transaction, SQLite WAL); "
        "target <= 50 ms"
    )


def land(source: Path, work: Path, between) -> int:
    """Each cell of the study folder `source` lands in `work` as the launcher lands it (its
    measurement folder, then the link); `between()` after each. The number of cells."""
    import shutil as sh

    cells = sorted(p for p in source.rglob("metrics.jsonl") if "measurements" not in p.parts)
    for src in cells:
        dst = work / src.relative_to(source)
        sh.copytree(src.parent / "measurements", dst.parent / "measurements")
        os.link(next((dst.parent / "measurements").glob("*/metrics.jsonl")), dst)
        between()
    return len(cells)


def planned(source: Path, work: Path) -> list[str]:
    cells = sorted(p for p in source.rglob("metrics.jsonl") if "measurements" not in p.parts)
    return [str(work / p.relative_to(source)) for p in cells]


def summary_ms(study_dir: Path) -> tuple[float, float]:
    """(median, largest) ms per landed cell, from the recorder's summary in the driver log."""
    import re

    found = re.findall(
        r"per landed cell ([\d.]+) ms median, ([\d.]+) ms at most",
        (study_dir / "logs" / "driver.log").read_text(),
    )
    return float(found[-1][0]), float(found[-1][1])


def until(url: str, done, between=lambda: time.sleep(0.05), timeout_s: float = 60) -> None:
    """Wait until `done(n)`, n the database's measurement rows (None: no schema yet)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        db = store.connect(url, migrate=False)
        try:
            n = store.counts(db)["measurements"] if store.current_revision(db) else None
        except store.DatabaseUnavailable:
            n = None
        finally:
            db.close()
        if done(n):
            return
        between()
    raise SystemExit(f"{url}: not done in {timeout_s:g} s")


def busy(seconds: float) -> None:
    """The driver's own thread busy for `seconds`: pure Python, as Snakemake's bookkeeping of
    an ended job (it keeps the GIL but at each switch interval)."""
    end, x = time.perf_counter() + seconds, 0
    while time.perf_counter() < end:
        x += sum(i * i for i in range(200))


def busy_driver(study: Path | None, workdir: Path, rounds: int, land_every: float) -> list[str]:
    """Each landed cell's row written while the driver's own thread is busy, by a recorder on
    a thread of the driver's process (as before) and by the recorder's own process
    (dlscale.workflow.recorder.start, as the workflow starts it), alternating rounds, each into
    a new database: the write times as the recorder says them (its summary)."""
    from dlscale.workflow import recorder as rec

    source = study or results_db.write_study(workdir / "busy-src", "busy", nodes=(1, 2), reps=10)
    found = {"thread": [], "process": []}
    for r in range(rounds):
        for variant in ("thread", "process") if r % 2 == 0 else ("process", "thread"):
            work = workdir / f"busy-{variant}-{r}" / "results" / source.name
            url = f"sqlite:///{work.parent / store.DATABASE_FILE}"
            cells = planned(source, work)
            if variant == "thread":
                recorder = rec.Recorder(url, work, cells, poll_s=0.2).start()
            else:
                rec.start(url, work, cells, poll_s=0.2)
            until(url, lambda n: n is not None)  # its catch-up of an empty study
            cells_landed = land(source, work, lambda: busy(land_every))
            until(url, lambda n: n == cells_landed, between=lambda: busy(0.05))
            if variant == "thread":
                recorder.stop()
            else:
                rec.stop()
            found[variant].append(summary_ms(work))
    lines = []
    for variant, label in (("thread", "a thread of the driver"), ("process", "its own process")):
        medians, largest = zip(*found[variant])
        lines.append(
            f"busy driver, recorder on {label}: per landed cell median "
            f"{statistics.median(medians):.1f} ms, largest {max(largest):.1f} ms (per round: "
            f"{', '.join(f'{m:.1f}/{x:.1f}' for m, x in found[variant])} ms median/largest); "
            "target <= 50 ms"
        )
    return lines


def driver_cost(study: Path | None, workdir: Path, land_every: float = 0.25) -> str:
    """What the database costs the driver, in CPU seconds: the recorder's process (started as
    the workflow starts it: a new database, each of the study's cells written as it lands, the
    last pass), with the driver's own share of it (this process), then the history job (record
    what is missing, judge, write the tables)."""
    import resource

    from dlscale.decisions.history_report import history_job
    from dlscale.workflow import recorder as rec

    source = study or results_db.write_study(workdir / "cost-src", "cost", nodes=(1, 2), reps=10)
    work = workdir / "cost" / "results" / source.name
    url = f"sqlite:///{workdir / 'cost' / 'results' / store.DATABASE_FILE}"

    def children() -> float:
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        return usage.ru_utime + usage.ru_stime

    cpu0, child0, wall0 = time.process_time(), children(), time.perf_counter()
    rec.start(url, work, planned(source, work), poll_s=0.2)
    own = time.process_time() - cpu0
    until(url, lambda n: n is not None)
    cells = land(source, work, lambda: time.sleep(land_every))
    until(url, lambda n: n == cells)
    cpu1 = time.process_time()
    rec.stop()
    own += time.process_time() - cpu1
    recorded, watched = children() - child0, time.perf_counter() - wall0
    outputs = {
        k: str(work / v)
        for k, v in {
            "table": "history/history.csv",
            "verdicts": "history/verdicts.csv",
            "tex": "report/history.tex",
            "figure": "history/history.pdf",
        }.items()
    }
    cpu2 = time.process_time()
    history_job(url, str(work), outputs, str(work / "logs" / "history.log"))
    judged = time.process_time() - cpu2
    return (
        f"CPU for the database over {cells} landed cells: the recorder's process {recorded:.2f} s "
        f"(its start, a new database, {cells} rows, {watched:.1f} s of watching), the driver's "
        f"share {own:.3f} s; history job {judged:.2f} s"
    )


# ---- the workflow -----------------------------------------------------------------------------
def checkout(dest: Path, config: dict) -> Path:
    """A new folder `dest` holding the workflow with `config` (helpers.checkout.copy_workflow)."""
    dest.mkdir(parents=True)
    return copy_workflow(dest, config)


def snakemake(work: Path, *args: str, log: Path) -> subprocess.Popen:
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    out = open(log, "w")
    return subprocess.Popen(
        [str(Path(sys.executable).parent / "snakemake"), "--profile", "profiles/local", *args],
        cwd=work,
        env=env,
        stdout=out,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def finished(proc: subprocess.Popen, what: str, log: Path) -> float:
    """Wait for `proc`; the CPU seconds (user + system) of it and the processes it waited for
    (the ranks, the jobs): the less noisy figure on a shared machine."""
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = rc = os.waitstatus_to_exitcode(status)
    if rc != 0:
        raise SystemExit(f"{what} failed ({rc}):\n{log.read_text()[-3000:]}")
    return usage.ru_utime + usage.ru_stime


def overhead(root: Path, rounds: int) -> list[str]:
    demo = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    walls = {"with": [], "without": []}
    cpus = {"with": [], "without": []}
    rows_ms = []  # per round: the with-database driver's (median, largest) ms per landed cell
    for r in range(rounds):
        order = ("without", "with") if r % 2 == 0 else ("with", "without")
        runs = {}
        for variant in order:  # started together: both see the machine's other load
            work = checkout(root / f"demo-{variant}-{r}", demo)
            extra = ["--config", "database=off"] if variant == "without" else []
            runs[variant] = (work / "run.log", time.perf_counter())
            runs[variant] += (snakemake(work, *extra, log=runs[variant][0]),)
        for variant, (log, t0, proc) in runs.items():
            cpu = finished(proc, f"demo {variant} {r}", log)
            walls[variant].append(time.perf_counter() - t0)
            cpus[variant].append(cpu)
        rows_ms.append(summary_ms(root / f"demo-with-{r}" / "results" / demo["study"]))
        for variant in order:
            print(
                f"  round {r + 1} {variant:7} database: wall {walls[variant][-1]:.1f} s, "
                f"CPU {cpus[variant][-1]:.1f} s (load average {os.getloadavg()[0]:.1f})",
                flush=True,
            )
        print(f"  round {r + 1} the driver's log: per landed cell {rows_ms[-1][0]:.1f} ms "
              f"median, {rows_ms[-1][1]:.1f} ms at most", flush=True)  # fmt: skip
    lines = [
        f"demo study with the database, the drivers' logs: per landed cell median "
        f"{statistics.median(m for m, _ in rows_ms):.1f} ms, largest per round "
        f"{', '.join(f'{x:.1f}' for _, x in rows_ms)} ms; target <= 50 ms"
    ]
    for what, values in (("wall", walls), ("CPU", cpus)):
        w, wo = statistics.median(values["with"]), statistics.median(values["without"])
        lines.append(
            f"demo study (20 cells), {what}, median of {rounds} each, side by side: with the "
            f"database {w:.1f} s, without {wo:.1f} s: {w - wo:+.1f} s "
            f"({(w / wo - 1) * 100:+.1f} %); target within 2 % or 1 s"
        )
    return lines


def rows_against_folders(db: store.Database, folders: list[Path]) -> list[str]:
    import sqlalchemy as sa

    t = schema.measurements
    lines = []
    with db.read() as conn:
        duplicated = conn.execute(
            sa.select(sa.func.count()).select_from(
                sa.select(t.c.study, t.c.cell, t.c.measurement)
                .group_by(t.c.study, t.c.cell, t.c.measurement)
                .having(sa.func.count() > 1)
                .subquery()
            )
        ).scalar_one()
        for folder in folders:
            on_disk = len(store.measurements_on_disk(folder))
            rows = conn.execute(
                sa.select(sa.func.count()).where(t.c.study == folder.name)
            ).scalar_one()
            lines.append(f"  {folder.name}: {on_disk} measurement(s) on disk, {rows} row(s)")
    lines.append(
        f"  duplicated rows: {duplicated}; integrity: {store.integrity_problems(db) or 'ok'}"
    )
    return lines


def concurrency(root: Path, url: str) -> list[str]:
    tiny = yaml.safe_load((REPO / "tests" / "fixtures" / "tiny.yaml").read_text())
    works = {
        name: checkout(root / name, {**tiny, "study": name, "database": url})
        for name in ("tiny-a", "tiny-b", "tiny-c")
    }
    logs = {name: work / "run.log" for name, work in works.items()}
    t0 = time.perf_counter()
    both = [snakemake(works[n], log=logs[n]) for n in ("tiny-a", "tiny-b")]
    victim = snakemake(works["tiny-c"], log=logs["tiny-c"])
    db = store.connect(url)
    killed_after = None
    import sqlalchemy as sa

    while victim.poll() is None and killed_after is None:
        with db.read() as conn:
            rows = conn.execute(
                sa.select(sa.func.count()).where(schema.measurements.c.study == "tiny-c")
            ).scalar_one()
        if rows:
            os.killpg(victim.pid, signal.SIGKILL)  # the driver and everything it started
            victim.wait()
            killed_after = time.perf_counter() - t0
        time.sleep(0.05)
    for proc, name in zip(both, ("tiny-a", "tiny-b")):
        finished(proc, name, logs[name])
    lines = [
        f"two studies at once (tiny-a, tiny-b) and tiny-c's driver killed with SIGKILL "
        f"{killed_after or 0:.1f} s in, after its first row ({store.describe(url)}):"
    ]
    lines += rows_against_folders(db, [works[n] / "results" / n for n in works])
    rerun = works["tiny-c"] / "rerun.log"
    finished(snakemake(works["tiny-c"], log=rerun), "tiny-c again", rerun)
    lines.append("after tiny-c's next run:")
    lines += rows_against_folders(db, [works[n] / "results" / n for n in works])
    db.close()
    return lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trials", type=int, default=200)
    p.add_argument("--rows", type=int, default=100_000)
    p.add_argument("--study", type=Path, help="a study folder whose cells' writes are timed")
    p.add_argument("--workdir", type=Path)
    p.add_argument("--land-every", type=float, default=0.25, help="driver: s between cells")
    p.add_argument("--busy-rounds", type=int, default=4, help="busy driver: rounds of each")
    p.add_argument("--workflow", action="store_true", help="the real studies (minutes)")
    p.add_argument("--only-workflow", action="store_true", help="skip the synthetic parts")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--database", help="the concurrency part's database URL")
    p.add_argument("--postgres", action="store_true", help="start a server of its own for it")
    a = p.parse_args()
    root = (
        a.workdir or Path(tempfile.mkdtemp(prefix="dlscale-history-", dir="/var/tmp"))
    ).resolve()
    root.mkdir(parents=True, exist_ok=True)
    load = os.getloadavg()
    print(f"{os.cpu_count()} CPUs, load average {load[0]:.2f}; work in {root}")

    if a.only_workflow:
        a.workflow = True
    for name, rates in ({} if a.only_workflow else verdict_rates(a.trials)).items():
        shown = ", ".join(f"{v} {r * 100:.1f} %" for v, r in rates.items())
        print(f"verdicts {name} ({a.trials} trials, 2 % noise): {shown}")
    if not a.only_workflow:
        t0 = time.perf_counter()
        db, runs = build_database(root / "query.sqlite", a.rows)
        print(f"query database: {store.counts(db)['measurements']} rows in "
              f"{time.perf_counter() - t0:.1f} s")  # fmt: skip
        for line in query_timings(db, runs):
            print(line)
        db.close()
        print(write_timings(a.study, root))
        for line in busy_driver(a.study, root, a.busy_rounds, a.land_every):
            print(line, flush=True)
        print(driver_cost(a.study, root, a.land_every))
    if not a.workflow:
        return
    for line in overhead(root, a.rounds):
        print(line)
    url = a.database or f"sqlite:///{root / 'shared.sqlite'}"
    server = None
    if a.postgres:
        server = results_db.postgres_server()
        url = server.__enter__()
    try:
        for line in concurrency(root / "concurrency", url):
            print(line)
    finally:
        if server is not None:
            server.__exit__(None, None, None)


if __name__ == "__main__":
    main()

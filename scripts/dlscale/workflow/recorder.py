"""The driver records the study in the results database (dlscale.store.database) as it goes.

The driver (Snakemake's process on the login side, local or Slurm route alike) starts a
`Recorder` at the workflow's onstart (`start`, not in the partial build a failed run starts,
whose own driver already records) and stops it at onsuccess or onerror (`stop`). Job steps
never write to the database: nothing inside a cell's job imports this module.

- **A process of its own.** The recorder runs in a child of the driver (`python -m
  dlscale.workflow.recorder`, on the login side too), not on a thread of the driver's process:
  the driver's own thread is busiest just as a cell lands (Snakemake's bookkeeping of the
  ended job), and a write that shared its GIL waited for it at each file read and SQLite call
  (up to Python's 5 ms switch interval each: 40-125 ms a row under a busy driver on a loaded
  machine, 1-3 ms alone). The driver hands it the URL, the study folder and the planned cells
  on its stdin; closing that (`stop`, or the driver's own end, even by SIGKILL) makes it do its
  last pass and exit: 0 when the database holds the whole study folder, UNFINISHED when rows
  wait for the next run. One that ends otherwise (a signal) is marked pending by the driver.
- **Catch-up first.** Whatever of the study folder the database lacks (measurements of an
  earlier run whose driver was killed, or ran while the database was locked or unreachable; its
  preflight results) is written before anything else, on the recorder's thread, while the
  first cells run.
- **Each cell as it lands.** The thread watches the planned cells' metrics files (their inode
  and mtime: the launcher links a new measurement in one rename, after its file is complete) and
  writes the new measurement's row at once, in one short transaction; new preflight results
  too. How long each row took is kept (`write_ms`) and said at the end.
- **Never in the way.** A locked or unreachable database makes the thread wait (RETRY_S) and
  try again; the study goes on. At the end (`stop`) one last pass writes what is missing; what
  still cannot be written is left for the next run, and `logs/database-pending.json`
  (dlscale.store.database.PENDING_FILE) says so: the `history` rule takes it as an input
  where it exists, so the next run, even one with nothing else to do, records the missing rows
  first (rules/history.smk).
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

from dlscale.store import database as store
from dlscale.store import metrics
from dlscale.store.preflight_results import PREFLIGHT_DIR
from dlscale.workflow.resume_journal import say

POLL_S = 1.0  # how often the watched metrics files are looked at (grows with their number)
RETRY_S = 15.0  # after the database was unavailable, the next try
STOP_TIMEOUT_S = 30.0  # the last pass's time at most
UNFINISHED = 3  # the recorder's exit status when rows wait for the next run (marked pending)


class Recorder:
    """Writes a study's measurements into the database as they land (module docstring)."""

    def __init__(
        self,
        url: str,
        study_dir: str | Path,
        cells: list[str],
        poll_s: float = POLL_S,
        timeout_s: float = store.TIMEOUT_S,
    ):
        self.url = url
        self.timeout_s = timeout_s  # a locked or unreachable database's wait per try
        self.study_dir = Path(study_dir)
        self.study = store.study_name(self.study_dir)
        self.cells = [Path(c) for c in cells]
        self.poll_s = max(poll_s, len(self.cells) / 5000)
        self.write_ms: list[float] = []  # per landed cell, this run
        self.inserted = 0
        self.problem: str | None = None  # the last reason the database could not be written
        self._seen = {c: self._stamp(c) for c in self.cells}
        self._changed: set[Path] = set()  # landed, not yet written
        self._preflights: set[str] = set()
        self._known: set[tuple[str, str]] = set()
        self._stop = threading.Event()
        self._db: store.Database | None = None
        self._thread = threading.Thread(target=self._run, name="dlscale-recorder", daemon=True)

    @staticmethod
    def _stamp(path: Path):
        try:
            st = path.stat()
        except OSError:
            return None
        return st.st_ino, st.st_mtime_ns

    def start(self) -> Recorder:
        self._thread.start()
        return self

    # -- the thread -------------------------------------------------------------------------
    def _run(self) -> None:
        caught_up = False
        while not self._stop.is_set():
            try:
                if not caught_up:
                    self._catch_up()
                    caught_up = True
                self._poll()
                self._write_landed()
                wait = self.poll_s
            except store.DatabaseUnavailable as exc:
                self._unavailable(str(exc))
                wait = RETRY_S
            except Exception as exc:  # never the study's end: say it, try again later
                self._unavailable(f"{type(exc).__name__}: {exc}")
                wait = RETRY_S
            self._stop.wait(wait)

    def _database(self) -> store.Database:
        if self._db is None:
            self._db = store.connect(self.url, timeout_s=self.timeout_s)
            for notice in self._db.notices:
                say(self.study_dir, notice)
        return self._db

    def _unavailable(self, reason: str) -> None:
        if reason != self.problem:
            say(
                self.study_dir,
                f"results database unavailable ({reason}); the study goes on, its rows are "
                f"written when it answers (at the latest on the next run)",
            )
        self.problem = reason
        if self._db is not None:  # a fresh connection next time (a server restarted)
            self._db.close()
            self._db = None

    def _catch_up(self) -> None:
        metrics.prepare_validation()  # before the first landed cell, whose write is timed
        db = self._database()
        done = store.record_study(db, self.study_dir)
        self.inserted += done.inserted
        self._known = store.known_measurements(db, self.study)
        self._preflights = self._preflight_files()
        if done.inserted:
            say(
                self.study_dir,
                f"results database: {done.inserted} row(s) of earlier runs written "
                f"({store.describe(self.url)})",
            )
        self.problem = None

    def _preflight_files(self) -> set[str]:
        folder = self.study_dir / PREFLIGHT_DIR
        return {p.name for p in folder.glob("*.json")} if folder.is_dir() else set()

    def _poll(self) -> None:
        for cell in self.cells:
            stamp = self._stamp(cell)
            if stamp is not None and stamp != self._seen[cell]:
                self._seen[cell] = stamp
                self._changed.add(cell)

    def _write_landed(self) -> None:
        for cell in sorted(self._changed):
            started = time.perf_counter()
            items = [
                m
                for m in store.measurements_on_disk_of(cell.parent, self.study_dir)
                if (m.cell, m.measurement) not in self._known
            ]
            done = store.record_measurements(self._database(), self.study, items)
            self._known |= {(m.cell, m.measurement) for m in items}
            self._changed.discard(cell)
            self.inserted += done.inserted
            self.write_ms.append((time.perf_counter() - started) * 1e3)
            self.problem = None
        files = self._preflight_files()
        if files - self._preflights:
            self.inserted += store.record_preflights(self._database(), self.study_dir)
            self._preflights = files

    # -- the end --------------------------------------------------------------------------
    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> bool:
        """Stop the thread, then write what is still missing (bounded by `timeout_s`); True
        when the database holds the whole study folder, else the pending marker says why."""
        self._stop.set()
        self._thread.join(timeout=timeout_s)
        ok = False
        try:
            db = self._database()
            done = store.record_study(db, self.study_dir)
            self.inserted += done.inserted
            self.problem = None
            ok = True
        except store.DatabaseUnavailable as exc:
            self.problem = str(exc)
        except Exception as exc:
            self.problem = f"{type(exc).__name__}: {exc}"
        finally:
            if self._db is not None:
                self._db.close()
                self._db = None
        if ok:
            if store.is_pending(self.study_dir):
                store.mark_pending(self.study_dir, self.url, None)
        else:
            store.mark_pending(self.study_dir, self.url, self.problem)
        say(self.study_dir, self.summary(ok))
        return ok

    def summary(self, ok: bool) -> str:
        timing = ""
        if self.write_ms:
            timing = (
                f"; per landed cell {statistics.median(self.write_ms):.1f} ms median, "
                f"{max(self.write_ms):.1f} ms at most"
            )
        where = store.describe(self.url)
        if ok:
            return f"results database {where}: {self.inserted} row(s) written{timing}"
        return (
            f"results database {where} unavailable at the end ({self.problem}): the rows it "
            f"lacks are written on the next run of this study (or: python -m dlscale history "
            f"import {self.study_dir}){timing}"
        )


# ---- the recorder's process ----------------------------------------------------------------
class RecorderProcess:
    """The driver's handle on the recorder's process (module docstring)."""

    def __init__(self, url: str, study_dir: str | Path, cells: list[str], poll_s: float = POLL_S):
        self.url = url
        self.study_dir = Path(study_dir)
        package_root = str(Path(__file__).resolve().parents[2])  # the driver's own dlscale
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))
        self.process = subprocess.Popen(
            [sys.executable, "-m", "dlscale.workflow.recorder"],
            stdin=subprocess.PIPE,
            env=env,
            text=True,
        )
        request = json.dumps(
            {"url": url, "study_dir": str(study_dir), "cells": cells, "poll_s": poll_s}
        )
        # on a thread: a long list fills the pipe before the child reads it (its imports first)
        self._sending = threading.Thread(target=self._send, args=(request,), daemon=True)
        self._sending.start()

    def _send(self, request: str) -> None:
        try:
            self.process.stdin.write(request + "\n")
            self.process.stdin.flush()
        except OSError:  # the child is gone: stop says so
            pass

    def stop(self, timeout_s: float = 2 * STOP_TIMEOUT_S) -> bool:
        """Close the recorder's stdin (its last pass) and wait for it; True when it wrote the
        whole study folder. One that does not end in `timeout_s` is killed, and the rows it may
        have missed are left for the next run (the pending marker)."""
        self._sending.join(timeout=timeout_s)
        try:
            self.process.stdin.close()
        except OSError:
            pass
        try:
            code = self.process.wait(timeout=timeout_s)
            if code in (0, UNFINISHED):  # UNFINISHED: its last pass marked what waits
                return code == 0
            reason = f"the recorder ended with exit status {code}"
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            reason = f"the recorder did not finish its last pass in {timeout_s:g} s"
        store.mark_pending(self.study_dir, self.url, reason)
        say(self.study_dir, f"results database {store.describe(self.url)}: {reason}")
        return False


_RECORDER: RecorderProcess | None = None


def start(
    url: str | None, study_dir: str | Path, cells: list[str], poll_s: float = POLL_S
) -> RecorderProcess | None:
    """onstart, in the driver: start the recorder's process (none where the database is off)."""
    global _RECORDER
    if url is None:
        return None
    _RECORDER = RecorderProcess(url, study_dir, [str(c) for c in cells], poll_s)
    return _RECORDER


def stop() -> bool | None:
    """onsuccess / onerror, in the driver: the last pass (None when nothing was recording)."""
    global _RECORDER
    recorder, _RECORDER = _RECORDER, None
    return None if recorder is None else recorder.stop()


def main() -> int:
    """The recorder's process: the driver's request on stdin, then record until stdin ends."""
    # Ctrl-C and a closed terminal are the driver's: it calls stop, or its end closes stdin
    for sig in (signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    line = sys.stdin.readline()
    if not line:  # the driver ended before it asked
        return UNFINISHED
    request = json.loads(line)
    recorder = Recorder(
        request["url"], request["study_dir"], request["cells"], request["poll_s"]
    ).start()
    while sys.stdin.read(65536):  # until the driver closes it (stop) or ends
        pass
    return 0 if recorder.stop() else UNFINISHED


if __name__ == "__main__":
    sys.exit(main())

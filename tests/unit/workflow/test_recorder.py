"""The driver's recorder (dlscale.workflow.recorder) writes each landed cell's row from a process
of its own: a driver whose own thread keeps Python's GIL (Snakemake's bookkeeping as a job
ends) does not hold the write up. The recorder's rows, its summary and its last pass on both
back-ends are tested with the database (tests/unit/store/test_results_database.py)."""

from __future__ import annotations

import time
from datetime import datetime, timezone

import sqlalchemy as sa

from dlscale.store import database as store
from dlscale.store import results_schema as schema
from dlscale.workflow import recorder

from helpers import results_db

POLL_S = 0.2  # the recorder's look at the cells' files


def _hold_gil(seconds: float) -> None:
    """Keep the GIL for about `seconds` without a break: one call of a builtin over a range
    checks no switch request, so no other thread of this process runs meanwhile."""
    t0 = time.perf_counter()
    sum(range(1_000_000))
    per_million = max(time.perf_counter() - t0, 1e-4)
    sum(range(int(seconds / per_million * 1_000_000)))


def _utc(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, tz=timezone.utc).replace(tzinfo=None)


def test_a_cell_lands_and_its_row_is_written_while_the_driver_keeps_the_gil(tmp_path):
    study_dir = tmp_path / "results" / "busy"
    cells = [results_db.cell_of("busy", n) for n in (1, 2)]
    url = f"sqlite:///{tmp_path / 'results' / store.DATABASE_FILE}"
    paths = [str(tmp_path / c.path) for c in cells]
    assert recorder.start(url, study_dir, paths, poll_s=POLL_S) is not None
    t = schema.measurements
    try:
        results_db.measure(tmp_path, cells[0])  # the recorder is up once this row is in
        deadline = time.monotonic() + 60
        recorded = []
        while not recorded and time.monotonic() < deadline:
            time.sleep(0.1)
            try:
                db = store.connect(url, migrate=False)
                with db.read() as conn:
                    recorded = conn.execute(sa.select(t.c.cell)).all()
                db.close()
            except store.DatabaseUnavailable:  # no schema yet
                pass
        assert recorded, "the recorder wrote no row in 60 s"

        results_db.measure(tmp_path, cells[1])
        held_from = time.time()
        _hold_gil(10 * POLL_S)  # the driver busy: no thread of it runs meanwhile
        held_until = time.time()
    finally:
        assert recorder.stop() is True
    second = (tmp_path / cells[1].path).parent.relative_to(study_dir).as_posix()
    db = store.connect(url)
    with db.read() as conn:
        written = conn.execute(
            sa.select(t.c.recorded_at).where(t.c.cell == second)
        ).scalar_one_or_none()
    db.close()
    # written while the driver held the GIL, by the recorder's own process; a thread of the
    # driver could only have begun the row as the hold ended (the GIL's first waiter), so at
    # least a second before its end is the process's
    assert written is not None, "the second cell's row is missing"
    assert _utc(held_from) <= written <= _utc(held_until - 1.0), (held_from, written, held_until)
    assert recorder.stop() is None  # stopped once


def test_a_recorder_that_dies_leaves_its_rows_to_the_next_run(tmp_path):
    """The recorder's process killed (a signal, not the driver's stop): the driver's stop says
    so and marks the study's rows as waiting, so the next run records them first."""
    study_dir = tmp_path / "results" / "killed"
    url = f"sqlite:///{tmp_path / 'results' / store.DATABASE_FILE}"
    handle = recorder.start(url, study_dir, [], poll_s=POLL_S)
    handle.process.kill()
    handle.process.wait()
    assert recorder.stop() is False
    assert store.is_pending(study_dir)
    assert "the recorder ended with exit status -9" in (study_dir / "logs/driver.log").read_text()

"""The results database on both back-ends, the same tests each: SQLite (a file, WAL) and a real
PostgreSQL server from Debian's packages, started once for this module by the project's own
scripts/postgres/up.sh (socket only, named after the test run) and stopped by down.sh.

What is checked: Alembic brings a new database to the head and the tables are the schema;
importing study folders twice adds nothing; two writers at once lose and duplicate nothing; a
writer killed with SIGKILL inside its transaction leaves the database whole and the next
writer puts the rows in; a locked database holds no study and the next run writes the rows it
missed; an unreachable one is named at once; SQLite on a network file system takes its
rollback journal with a lock, or is refused with the fix; the driver's recorder writes each
cell as it lands; a history query over 5,000 rows answers within a second."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import sqlalchemy as sa

from dlscale.decisions import history, history_command
from dlscale.store import database as store
from dlscale.store import filesystems
from dlscale.store import results_schema as schema
from dlscale.store.measurements import adopt_unarchived
from dlscale.workflow.recorder import Recorder

from helpers import results_db, run_names

SCRIPTS = Path(__file__).resolve().parents[3] / "scripts"


@pytest.fixture(scope="module")
def postgres():
    """The test run's PostgreSQL server (one for the module, both back-ends' tests beside it).
    Where Debian's server is not installed the PostgreSQL half skips, never under CI."""
    if not list(Path("/usr/lib/postgresql").glob("*/bin/initdb")):
        if os.environ.get("CI"):
            pytest.fail("PostgreSQL's server is not installed: scripts/setup.sh --system-packages")
        yield None
        return
    with results_db.postgres_server() as url:
        yield url


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request, tmp_path, postgres):
    """A fresh database: a SQLite file, or a schema of its own on the run's server."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'results' / store.DATABASE_FILE}"
        return
    if postgres is None:
        pytest.skip("PostgreSQL's server is not installed (scripts/setup.sh --system-packages)")
    schema = f"t{uuid.uuid4().hex[:12]}"
    admin = sa.create_engine(postgres.replace("postgresql+psycopg", "postgresql+psycopg", 1))
    with admin.begin() as conn:
        conn.execute(sa.schema.CreateSchema(schema))
    yield f"{postgres}&options=-csearch_path%3D{schema}"
    with admin.begin() as conn:
        conn.execute(sa.schema.DropSchema(schema, cascade=True))
    admin.dispose()


def rows(db, study=None) -> int:
    t = schema.measurements
    query = sa.select(sa.func.count()).select_from(t)
    if study:
        query = query.where(t.c.study == study)
    with db.read() as conn:
        return conn.execute(query).scalar_one()


def duplicated(db) -> int:
    t = schema.measurements
    grouped = (
        sa.select(t.c.study, t.c.cell, t.c.measurement)
        .group_by(t.c.study, t.c.cell, t.c.measurement)
        .having(sa.func.count() > 1)
        .subquery()
    )
    with db.read() as conn:
        return conn.execute(sa.select(sa.func.count()).select_from(grouped)).scalar_one()


def python(code: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(SCRIPTS)}
    return subprocess.Popen(
        [sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip


def test_a_new_database_is_migrated_to_alembics_head_and_holds_the_schema(url):
    from alembic.autogenerate import compare_metadata
    from alembic.config import Config
    from alembic.migration import MigrationContext
    from alembic.script import ScriptDirectory

    db = store.connect(url)
    config = Config()
    config.set_main_option("script_location", str(store.MIGRATIONS))
    assert (
        store.current_revision(db)
        == store.HEAD
        == ScriptDirectory.from_config(config).get_current_head()
    )
    with db.engine.connect() as conn:
        assert compare_metadata(MigrationContext.configure(conn), schema.metadata) == []
        tables = set(sa.inspect(conn).get_table_names())
    assert tables == {"alembic_version", "measurements", "preflights", "verdicts"}
    db.close()
    store.connect(url).close()  # a second opening migrates nothing and fails nothing


def test_importing_study_folders_twice_adds_no_row(url, tmp_path, capsys):
    a = results_db.write_study(tmp_path, "a", reps=2)
    b = results_db.write_study(tmp_path, "b", nodes=(1,), reps=1)
    plain = tmp_path / results_db.cell_of("b", 4).path  # a file from before measurement folders
    plain.parent.mkdir(parents=True)
    plain.write_text(Path(next(a.rglob("metrics.jsonl"))).read_text())
    (a / "preflight").mkdir()
    (a / "preflight" / "cpu-pytorch-k.json").write_text(
        json.dumps({"passed": True, "hardware": "cpu", "finished_at": 1.0e9, "checks": []})
    )
    (a / "tables").mkdir()
    (a / "tables" / "verdicts.csv").write_text("hardware,cell,metric,verdict\ncpu,x,t,PASS\n")
    argv = [str(a), str(b), "--database", url]
    assert history_command.main(["import", *argv]) == 0
    db = store.connect(url)
    first = store.counts(db)
    assert first == {"measurements": 4 + 1 + 1, "preflights": 1, "verdicts": 1}
    assert history_command.main(["import", *argv]) == 0
    adopt_unarchived([plain])  # the plain file gets its folder: the same measurement
    assert history_command.main(["import", *argv]) == 0
    assert store.counts(db) == first and duplicated(db) == 0
    assert "0 new row(s), 2 measurement(s) already recorded" in capsys.readouterr().out
    db.close()


def test_two_writers_at_once_lose_and_duplicate_nothing(url, tmp_path):
    """Two processes record at once: each its own study, and both the same third one."""
    for study in ("a", "b", "both"):
        results_db.write_study(tmp_path, study, nodes=(1, 2, 4), reps=4)
    store.connect(url).close()  # the schema first: the writers race on rows, not on DDL
    code = (
        "import sys; from dlscale.store import database as s; db = s.connect(sys.argv[1]); "
        "[s.record_study(db, f) for f in sys.argv[2:]]; print('done')"
    )
    writers = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                code,
                url,
                str(tmp_path / "results" / x),
                str(tmp_path / "results" / "both"),
            ],  # fmt: skip
            env={**os.environ, "PYTHONPATH": str(SCRIPTS)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for x in ("a", "b")
    ]
    for w in writers:
        out, err = w.communicate(timeout=120)
        assert w.returncode == 0 and "done" in out, err[-2000:]
    db = store.connect(url)
    assert [rows(db, s) for s in ("a", "b", "both")] == [12, 12, 12]
    assert duplicated(db) == 0
    assert store.integrity_problems(db) == []
    db.close()


def test_a_writer_killed_inside_its_transaction_leaves_the_database_whole(url, tmp_path):
    study = results_db.write_study(tmp_path, "k", nodes=(1, 2), reps=3)
    store.connect(url).close()
    writer = python(
        "import sys, time; from dlscale.store import database as s, results_schema as t\n"
        f"db = s.connect({url!r}); items = s.measurements_on_disk({str(study)!r})\n"
        "rows, _ = s.rows_of(items, 'k')\n"
        "with db.transaction() as conn:\n"
        "    t.insert_new(conn, t.measurements, rows[:4])\n"
        "    print('inside', flush=True); time.sleep(120)\n"
    )
    assert writer.stdout.readline().strip() == "inside"
    writer.send_signal(signal.SIGKILL)  # kill -9 mid-write: 4 rows sent, none committed
    writer.wait(timeout=30)
    db = store.connect(url, timeout_s=20)  # PostgreSQL ends the dead session's transaction
    assert rows(db, "k") == 0 and store.integrity_problems(db) == []
    done = store.record_study(db, study)  # the next run
    assert done.inserted == 6 and rows(db, "k") == 6 and duplicated(db) == 0
    assert store.integrity_problems(db) == []
    db.close()


def _hold_lock(url: str):
    """Another session holding the database's write lock (SQLite: an exclusive transaction;
    PostgreSQL: the measurements table locked), with its release."""
    if url.startswith("sqlite"):
        conn = sqlite3.connect(store.sqlite_path(url), isolation_level=None)
        conn.execute("BEGIN EXCLUSIVE")
        return lambda: (conn.execute("ROLLBACK"), conn.close())
    engine = sa.create_engine(url)
    conn = engine.connect()
    trans = conn.begin()
    conn.execute(sa.text("LOCK TABLE measurements IN ACCESS EXCLUSIVE MODE"))
    return lambda: (trans.rollback(), conn.close(), engine.dispose())


def test_a_locked_database_holds_no_study_and_its_rows_go_in_on_the_next_run(url, tmp_path):
    study_dir = tmp_path / "results" / "locked"
    cells = [results_db.cell_of("locked", n) for n in (1, 2)]
    store.connect(url).close()
    release = _hold_lock(url)
    try:
        recorder = Recorder(url, study_dir, [str(tmp_path / c.path) for c in cells], 0.1, 1.0)
        recorder.start()
        for cell in cells:
            results_db.measure(tmp_path, cell)
        started = time.monotonic()
        assert recorder.stop(timeout_s=5) is False  # the study goes on
        assert time.monotonic() - started < 20
        assert store.is_pending(study_dir)
        assert "unavailable" in (study_dir / "logs" / "driver.log").read_text()
    finally:
        release()
    nxt = Recorder(url, study_dir, [], 0.1, 5.0).start()  # the next run of the study
    assert nxt.stop() is True
    db = store.connect(url)
    assert rows(db, "locked") == 2 and not store.is_pending(study_dir)
    db.close()


def test_an_unreachable_database_is_named_at_once(tmp_path):
    (tmp_path / "file").write_text("")
    started = time.monotonic()
    with pytest.raises(store.DatabaseUnavailable, match="file"):
        store.connect(f"sqlite:///{tmp_path / 'file' / 'dlscale.sqlite'}")
    missing = f"postgresql+psycopg://u:secret@/db?host={tmp_path}&port=1"
    with pytest.raises(store.DatabaseUnavailable) as exc:
        store.connect(missing, timeout_s=2)
    assert "secret" not in str(exc.value) and "***" in str(exc.value)
    with pytest.raises(store.DatabaseUnavailable, match="SQLite .* or PostgreSQL"):
        store.connect("mysql://u@h/db")
    assert time.monotonic() - started < 10


MOUNTINFO = """\
22 1 0:21 / / rw,relatime shared:1 - ext4 /dev/vda1 rw
40 22 0:35 / /mnt/shared rw,relatime shared:2 - nfs4 server:/export rw,vers=4.2
41 40 0:36 / /mnt/shared/local rw shared:3 - tmpfs tmpfs rw
"""


def test_sqlite_on_a_network_file_system_takes_the_rollback_journal_and_a_lock(
    tmp_path, monkeypatch
):
    info = tmp_path / "mountinfo"
    info.write_text(MOUNTINFO)
    assert filesystems.filesystem_type("/mnt/shared/results", str(info)) == "nfs4"
    assert filesystems.filesystem_type("/mnt/shared/local/x", str(info)) == "tmpfs"
    assert filesystems.filesystem_type("/srv/data", str(info)) == "ext4"

    monkeypatch.setattr(store, "network_filesystem", lambda path: "nfs4")
    url = f"sqlite:///{tmp_path / 'results' / store.DATABASE_FILE}"
    db = store.connect(url)
    assert db.journal == "delete" and db.lock_path.exists()
    assert "PostgreSQL" in db.notices[0]
    with db.read() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "delete"
    assert store.record_study(db, results_db.write_study(tmp_path, "nfs", nodes=(1,), reps=2))
    assert rows(db, "nfs") == 2
    db.close()

    def no_lock(*args):
        raise OSError(37, "No locks available")

    monkeypatch.setattr(store.fcntl, "lockf", no_lock)
    with pytest.raises(store.DatabaseUnavailable, match=r"postgresql\+psycopg://"):
        store.connect(url)


def test_the_driver_writes_each_cell_as_it_lands(url, tmp_path):
    study_dir = tmp_path / "results" / "live"
    cells = [results_db.cell_of("live", n) for n in (1, 2, 4)]
    recorder = Recorder(url, study_dir, [str(tmp_path / c.path) for c in cells], poll_s=0.1)
    recorder.start()
    db = store.connect(url)
    try:
        for landed, cell in enumerate(cells, 1):
            results_db.measure(tmp_path, cell)
            deadline = time.monotonic() + 20
            while rows(db, "live") < landed and time.monotonic() < deadline:
                time.sleep(0.05)
            assert rows(db, "live") == landed  # before the next cell lands
        assert recorder.stop() is True
        assert len(recorder.write_ms) == 3 and max(recorder.write_ms) < 5000
        assert (
            "3 row(s) written; per landed cell" in (study_dir / "logs" / "driver.log").read_text()
        )
        assert rows(db, "live") == 3 and duplicated(db) == 0
    finally:
        db.close()


def test_a_history_query_over_5000_rows_answers_within_a_second(url):
    series = [
        {"hardware": f"h{i}", "model": m, "nodes": n}
        for i in range(5)
        for m in ("a", "b", "c", "d", "e")
        for n in (1, 2, 4, 8)
    ]  # 100 series x 10 weekly runs x 5 repetitions
    made = results_db.synthetic_rows(series, runs=10, reps=5, slowdown_at=9)
    db = store.connect(url)
    with db.transaction() as conn:
        schema.insert_new(conn, schema.measurements, made)
    assert rows(db) == 5000
    started = time.perf_counter()
    table = history.history_table(history.load(db, {"hardware": "h0", "model": "a", "nodes": 8}))
    seconds = time.perf_counter() - started
    assert seconds < 1.0 and list(table["verdict"])[-1] == "FAIL"
    db.close()


def test_the_postgres_server_is_the_runs_own(postgres):
    """Socket only, data and socket folders named after the run (run_names.run_path)."""
    if postgres is None:
        pytest.skip("PostgreSQL's server is not installed")
    folder = results_db.postgres_dir()
    assert f"host={folder}/socket" in postgres
    conf = (folder / "data" / "postgresql.conf").read_text()
    assert "listen_addresses = ''" in conf
    assert shutil.which("runuser") or os.geteuid() != 0
    owner = (folder / "data").owner()
    assert owner != "root"  # initdb refuses root: the server runs as a plain user
    (listed,) = run_names.database_servers(run_names.run_name())  # what leftovers() would say
    assert f"data {folder / 'data'}, socket {folder / 'socket'}/.s.PGSQL." in listed


def test_the_database_url_enters_no_cells_or_studys_hash(root):
    """The URL (and how the history is judged) is a scheduling setting: a study with a
    PostgreSQL URL plans the same cells, with the same hashes, as with the default."""
    from dlscale.study.matrix import load_workflow_study

    plain = load_workflow_study({}, root)
    other = load_workflow_study(
        {
            "database": "postgresql+psycopg://team@db.example.org/dlscale",
            "history": {"threshold": 0.1, "check": "both"},
        },  # fmt: skip
        root,
    )
    assert other.config["database"].startswith("postgresql") and plain.config["database"] is None
    assert [c.to_json() for c in other.cells] == [c.to_json() for c in plain.cells]
    assert other.config_hash == plain.config_hash
    off = load_workflow_study({"database": "off"}, root)
    assert off.config_hash == plain.config_hash
    assert store.resolve_url(off.config["database"]) is None


def test_the_newcomer_pages_say_where_the_database_is_and_how_to_turn_it_off(root):
    """The quickstart and the outputs page name the database's file, its off switch and the
    history command as the code has them, and the history files the outputs page lists are
    the ones the workflow writes (dlscale.workflow.paths)."""
    from dlscale.workflow.paths import output_paths

    quickstart = (root / "docs/pages/quickstart.md").read_text()
    outputs = (root / "docs/pages/outputs.md").read_text()
    for page in (quickstart, outputs):
        assert f"`results/{store.DATABASE_FILE}`" in page
        assert "`dlscale history" in page and "(database.md)" in page
        assert "off" in page and store.URL_VARIABLE in page
    assert "`--config database=off`" in quickstart and store.resolve_url("off") is None
    (section,) = re.findall(
        r"## The results database and a study's history\n(.*?)\n## ", outputs, re.S
    )
    listed = set(re.findall(r"`(results/<study>/[\w./]+)`", section))
    written = {p for k, p in output_paths("results/<study>", "s").items() if "history" in k}
    assert listed == written, (listed, written)
    assert "[The results database](database.md)" in section


def test_the_history_rule_names_the_default_database_wherever_the_checkout_lies(tmp_path):
    """The `history` rule's params name the database: the default file by its path under the
    working directory (two copies of a checkout: one name), any other as it may be printed."""
    names = []
    for checkout in (tmp_path / "a", tmp_path / "elsewhere" / "b"):
        checkout.mkdir(parents=True)
        url = store.resolve_url(None, checkout / "results")
        names.append(store.param_form(url, checkout))
    assert names == ["sqlite:///results/dlscale.sqlite"] * 2
    outside = f"sqlite:///{tmp_path / 'team.sqlite'}"
    assert store.param_form(outside, tmp_path / "a") == outside
    server = "postgresql+psycopg://team:secret@db.example.org/dlscale"
    assert store.param_form(server) == "postgresql+psycopg://team:***@db.example.org/dlscale"
    assert store.param_form(None) == "off"

"""The results database: every measured cell of every study, its preflight results and its
verdicts, kept beyond any one study's folder, so that a configuration's history can be asked
("since when is it slower?": dlscale.decisions.history).

**Where.** One URL (SQLAlchemy 2.0's form) names it:

- default: one SQLite file, `results/dlscale.sqlite` (DATABASE_FILE), in WAL mode: readers
  never wait for a writer and two studies write at once on a local disk (each write is one
  short transaction that takes SQLite's write lock at its start: BEGIN IMMEDIATE, waiting up
  to the busy timeout for another). The file and its sidecars (`-wal`, `-shm`, `-journal`,
  `.lock`) are names no study may take (dlscale.study.results_layout.RESERVED_UNDER_RESULTS).
- WAL needs shared memory between the writers, which a network file system does not give:
  where the file lies on one (NFS, Lustre, GPFS, CIFS, ...: dlscale.store.filesystems, from
  /proc/self/mountinfo), SQLite's rollback journal is used instead, and every transaction also
  holds an exclusive POSIX lock on `<file>.lock` (the file system's lock service: NFSv4's
  own, NFSv3's lockd). Where that lock cannot be taken (no lock service), the database is
  refused with the fix: a PostgreSQL server (`DatabaseUnavailable`).
- `postgresql+psycopg://user@host/dbname` (psycopg 3) selects a shared PostgreSQL server, for
  a team; config `database`, or DLSCALE_DATABASE_URL (URL_VARIABLE) when the config names
  none. `off` (or false) records nothing. The URL is a scheduling setting: it enters no
  cell's or study's hash (dlscale.study.hashes).

**What.** Three tables (dlscale.store.results_schema, rows: dlscale.store.result_rows), versioned
by Alembic migrations in `db_migrations/`, applied on first use (`ensure_schema`):

- `measurements`: one row per measurement of a cell (a cell's `measurements/<id>/` folder, or
  its plain metrics file from before those folders): the study, the cell's folder and the
  measurement's name, the cell's key, its identity hashes (`series`: the identity but for the
  repetition; `configuration`: the same but for the software stack, so a changed environment
  or module still finds its history; `cell_hash`: the cell's own config hash), its metrics
  (throughput, step time, time-to-accuracy, ...), its provenance (commit, software versions,
  driver, node names, container) and when it was measured and recorded. Unique per study,
  cell and file content (`metrics_sha256`): a measurement goes in once, however often it is
  recorded or imported.
- `preflights`: one row per preflight result file (dlscale.store.preflight_results).
- `verdicts`: the rows of a study's verdict tables (against the fixed references,
  tables/verdicts.csv, and against the history, history/verdicts.csv), once per table content.

**Who writes.** The driver on the login side (dlscale.workflow.recorder), once a cell's metrics
have landed; job steps never write. `record_study` (also `dlscale history import`) records
whatever of a study folder the database lacks: the next run puts in what a lost, locked or
unreachable database missed.

SQLAlchemy Core only: the schema, the queries and the inserts are SQLAlchemy's for both
back-ends (an insert that skips known rows is its `on_conflict_do_nothing`); the only statements
written out are SQLite's own settings (its PRAGMAs and BEGIN IMMEDIATE).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import sqlalchemy as sa

from dlscale.store.filesystems import network_filesystem
from dlscale.store.metrics import MetricsError, read_metrics
from dlscale.store.result_rows import measurement_row, preflight_row, verdict_rows
from dlscale.store.results_schema import insert_new, measurements, preflights, verdicts
from dlscale.study.cell import MEASUREMENTS_DIR, METRICS_FILE, WORKLOAD_DIRS
from dlscale.study.results_layout import RESULTS_DATABASE

# The default database's file under results/; it and its sidecars (SQLite's -wal, -shm,
# -journal and the lock file, LOCK_SUFFIX) are names no study may take (results_layout).
DATABASE_FILE = RESULTS_DATABASE
LOCK_SUFFIX = ".lock"
URL_VARIABLE = "DLSCALE_DATABASE_URL"
OFF = "off"
# How long one write waits for another writer's lock (SQLite's busy timeout, the lock file's
# wait) and for a server (PostgreSQL's connect timeout), in seconds: past it the write is left
# for the next run and the study goes on.
TIMEOUT_S = 10.0
# The schema revision this dlscale writes (db_migrations/versions/): a database at another
# revision is upgraded by Alembic first (tests check this is the scripts' head).
HEAD = "0001"
MIGRATIONS = Path(__file__).with_name("db_migrations")
DOCS = "docs/pages/database.md"


class DatabaseUnavailable(RuntimeError):
    """The database cannot be written now (locked, unreachable, refused): the study goes on,
    and what was not written goes in on the next run."""


# ---- the URL -----------------------------------------------------------------------------------
def resolve_url(setting=None, results: str | Path = "results") -> str | None:
    """The database URL for config `database` (`setting`): a URL as given; None (unset):
    DLSCALE_DATABASE_URL, else the SQLite file under `results`; `off` or false: None (no
    database)."""
    if setting is None:
        setting = os.environ.get(URL_VARIABLE) or None
    if setting is False or (isinstance(setting, str) and setting.strip().lower() == OFF):
        return None
    if setting is None or setting is True:
        return f"sqlite:///{Path(results).resolve() / DATABASE_FILE}"
    return str(setting)


def param_form(url: str | None, workdir: str | Path = ".") -> str:
    """The database as the workflow's `history` rule records it in its params (another database
    redoes the history): `off` for none; a SQLite file under `workdir` (the default,
    results/dlscale.sqlite) by its path relative to it, so a copy of the checkout elsewhere, or
    the checkout moved, is the same database to it; any other URL as it may be printed (its
    password hidden)."""
    if url is None:
        return OFF
    path = sqlite_path(url)
    if path is not None:
        try:
            inside = path.resolve().relative_to(Path(workdir).resolve())
        except ValueError:  # a file elsewhere: its own path names it
            return describe(url)
        return f"sqlite:///{inside.as_posix()}"
    return describe(url)


def describe(url: str) -> str:
    """The URL as it may be printed: any password hidden."""
    try:
        return sa.engine.make_url(url).render_as_string(hide_password=True)
    except sa.exc.ArgumentError:
        return "<not a database URL>"


def sqlite_path(url: str) -> Path | None:
    parsed = sa.engine.make_url(url)
    if parsed.get_backend_name() != "sqlite" or not parsed.database:
        return None
    return Path(parsed.database)


# ---- the connection -------------------------------------------------------------------------
@dataclass
class Database:
    """An open results database: its engine and how its writes are guarded."""

    url: str
    engine: sa.Engine
    lock_path: Path | None = None  # SQLite on a network file system: the lock file
    journal: str = ""  # SQLite's journal mode (wal, delete), "" for a server
    timeout_s: float = TIMEOUT_S
    notices: list[str] = field(default_factory=list)

    @property
    def kind(self) -> str:
        return self.engine.dialect.name

    @contextlib.contextmanager
    def transaction(self) -> Iterator[sa.Connection]:
        """One write transaction (SQLite: BEGIN IMMEDIATE, under the lock file where there is
        one); DatabaseUnavailable when the database is locked past the timeout or unreachable."""
        with self._file_lock(), _unavailable(self.url):
            with self.engine.begin() as conn:
                yield conn

    def read(self) -> contextlib.AbstractContextManager[sa.Connection]:
        """A connection for reading (no write lock taken)."""
        return _reading(self)

    @contextlib.contextmanager
    def _file_lock(self):
        if self.lock_path is None:
            yield
            return
        with open(self.lock_path, "a+") as fh:
            deadline = time.monotonic() + self.timeout_s
            while True:
                try:
                    fcntl.lockf(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except OSError as exc:
                    if exc.errno not in (errno.EAGAIN, errno.EACCES):
                        raise DatabaseUnavailable(_no_lock(self.lock_path, exc)) from None
                    if time.monotonic() > deadline:
                        raise DatabaseUnavailable(
                            f"{self.lock_path}: held by another writer for {self.timeout_s:g} s"
                        ) from None
                    time.sleep(0.05)
            try:
                yield
            finally:
                fcntl.lockf(fh, fcntl.LOCK_UN)

    def close(self) -> None:
        self.engine.dispose()


@contextlib.contextmanager
def _reading(db: Database):
    with _unavailable(db.url), db.engine.connect() as conn:
        conn.info["read_only"] = True  # the pooled connection's: unset before it goes back
        try:
            yield conn
        finally:
            conn.info.pop("read_only", None)


def _no_lock(path: Path, exc: OSError) -> str:
    return (
        f"{path}: its file system gives no working lock ({exc.strerror}), and SQLite on a "
        "network file system without one can lose or corrupt rows. Use a PostgreSQL server "
        "instead: --config database=postgresql+psycopg://USER@HOST/DBNAME (or "
        f"{URL_VARIABLE}); {DOCS}"
    )


@contextlib.contextmanager
def _unavailable(url: str):
    """sqlalchemy's and the OS's errors of a locked, missing or unreachable database as
    DatabaseUnavailable, naming the database."""
    try:
        yield
    except DatabaseUnavailable:
        raise
    except (sa.exc.OperationalError, sa.exc.InterfaceError, sa.exc.DatabaseError) as exc:
        reason = str(getattr(exc, "orig", exc)).strip().splitlines()[0]
        raise DatabaseUnavailable(f"{describe(url)}: {reason}") from None
    except OSError as exc:
        raise DatabaseUnavailable(f"{describe(url)}: {exc}") from None


def connect(url: str, *, timeout_s: float = TIMEOUT_S, migrate: bool = True) -> Database:
    """Open the database at `url`, its schema brought to HEAD (`migrate`). DatabaseUnavailable
    when it cannot be opened now."""
    try:
        parsed = sa.engine.make_url(url)
    except sa.exc.ArgumentError:
        raise DatabaseUnavailable(
            f"{url!r} is not a database URL (e.g. postgresql+psycopg://USER@HOST/DBNAME); {DOCS}"
        ) from None
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        db = _sqlite(url, timeout_s)
    elif backend == "postgresql":
        if parsed.get_driver_name() not in ("psycopg", "psycopg2"):
            parsed = parsed.set(drivername="postgresql+psycopg")
        # a lock held by another session is waited for timeout_s at most, as SQLite's busy
        # timeout (PostgreSQL waits forever by default): a locked database never holds a study
        waits = f"-c lock_timeout={int(timeout_s * 1000)}"
        options = " ".join(filter(None, [parsed.query.get("options"), waits]))
        engine = sa.create_engine(
            parsed.update_query_dict({"options": options}),
            connect_args={"connect_timeout": max(1, int(timeout_s))},
            pool_pre_ping=True,
        )
        db = Database(url, engine, timeout_s=timeout_s)
    else:
        raise DatabaseUnavailable(
            f"{describe(url)}: dlscale keeps results in SQLite (sqlite:///FILE) or PostgreSQL "
            f"(postgresql+psycopg://...), not {backend}; {DOCS}"
        )
    if migrate:
        try:
            ensure_schema(db)
        except BaseException:
            db.close()
            raise
    return db


def _sqlite(url: str, timeout_s: float) -> Database:
    path = sqlite_path(url)
    if path is None:
        raise DatabaseUnavailable(f"{describe(url)}: a SQLite URL names a file: sqlite:///FILE")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DatabaseUnavailable(f"{path.parent}: {exc.strerror}") from None
    network = network_filesystem(path.parent)
    journal = "delete" if network else "wal"
    # isolation_level None: transactions are begun below (`begin`), never by pysqlite itself
    engine = sa.create_engine(
        url,
        connect_args={"timeout": timeout_s, "check_same_thread": False, "isolation_level": None},
    )

    def pragmas(dbapi_connection, _record):
        cursor = dbapi_connection.cursor()
        cursor.execute(f"PRAGMA busy_timeout = {int(timeout_s * 1000)}")
        cursor.execute(f"PRAGMA journal_mode = {journal}")
        # WAL: a commit is durable at the next checkpoint, never corrupt (SQLite's advice)
        cursor.execute(f"PRAGMA synchronous = {'NORMAL' if journal == 'wal' else 'FULL'}")
        cursor.close()

    def begin(conn):
        # a writer takes the write lock at once, so two writers queue on the busy timeout
        # instead of failing to upgrade a read lock
        conn.exec_driver_sql("BEGIN" if conn.info.get("read_only") else "BEGIN IMMEDIATE")

    sa.event.listen(engine, "connect", pragmas)
    sa.event.listen(engine, "begin", begin)

    db = Database(url, engine, journal=journal, timeout_s=timeout_s)
    if network:
        db.lock_path = path.with_name(path.name + LOCK_SUFFIX)
        db.notices.append(
            f"{path} lies on a network file system ({network}): SQLite's rollback journal is "
            f"used with a lock on {db.lock_path.name}, not WAL; for a team, a PostgreSQL "
            f"server is the better home ({DOCS})"
        )
        with db._file_lock():  # refuses now where the file system gives no lock
            pass
    return db


def current_revision(db: Database) -> str | None:
    """The schema's Alembic revision (None: no schema yet)."""
    version = sa.table("alembic_version", sa.column("version_num"))
    with db.read() as conn:
        if not sa.inspect(conn).has_table("alembic_version"):
            return None
        return conn.execute(sa.select(version.c.version_num)).scalar()


def ensure_schema(db: Database) -> None:
    """Bring the schema to HEAD with Alembic (`db_migrations/`), once per database: the
    migration runs in one transaction that holds the write lock (SQLite) or an advisory lock
    (PostgreSQL), so two drivers opening a new database at once create it once."""
    if current_revision(db) == HEAD:
        return
    from alembic import command
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    with db.transaction() as conn:
        if db.kind == "postgresql":
            conn.execute(sa.select(sa.func.pg_advisory_xact_lock(MIGRATION_LOCK)))
        config.attributes["connection"] = conn
        command.upgrade(config, "head")


MIGRATION_LOCK = 0x646C7363616C65  # "dlscale": PostgreSQL's advisory lock during a migration


def known_measurements(db: Database, study: str) -> set[tuple[str, str]]:
    """(cell, measurement) of the study's measurements the database holds."""
    with db.read() as conn:
        rows = conn.execute(
            sa.select(measurements.c.cell, measurements.c.measurement).where(
                measurements.c.study == study
            )
        )
        return {(r.cell, r.measurement) for r in rows}


# ---- a study folder ---------------------------------------------------------------------------
@dataclass(frozen=True)
class OnDisk:
    """One measurement in a study folder."""

    cell: str  # the cell's folder, relative to the study folder
    measurement: str  # its measurements/ folder's name; "" for a plain metrics file
    path: Path


def measurements_on_disk_of(cell_dir: str | Path, study_dir: str | Path) -> list[OnDisk]:
    """One cell's kept measurements, oldest first; its plain metrics file (from before
    measurement folders) where it has none."""
    cell_dir, study_dir = Path(cell_dir), Path(study_dir)
    cell = cell_dir.relative_to(study_dir).as_posix()
    kept = sorted((cell_dir / MEASUREMENTS_DIR).glob(f"*/{METRICS_FILE}"))
    if kept:
        return [OnDisk(cell, p.parent.name, p) for p in kept]
    current = cell_dir / METRICS_FILE
    return [OnDisk(cell, "", current)] if current.is_file() else []


def measurements_on_disk(study_dir: str | Path) -> list[OnDisk]:
    """Every kept measurement of a study folder's cells (each workload's folder), also of a
    cell whose current metrics file is gone (a failed re-measurement removed the link; its
    earlier measurements stay)."""
    study_dir = Path(study_dir)
    cells = set()
    for workload_dir in WORKLOAD_DIRS.values():
        top = study_dir / workload_dir
        if top.is_dir():
            for found in top.rglob(METRICS_FILE):
                kept = found.parent.parent.name == MEASUREMENTS_DIR  # a measurement's own
                cells.add(found.parent.parent.parent if kept else found.parent)
    return [m for cell in sorted(cells) for m in measurements_on_disk_of(cell, study_dir)]


@dataclass
class Recorded:
    """What one recording pass did."""

    inserted: int = 0
    known: int = 0  # already in the database
    invalid: list[str] = field(default_factory=list)  # files that are no valid measurement

    def __iadd__(self, other: Recorded) -> Recorded:
        self.inserted += other.inserted
        self.known += other.known
        self.invalid += other.invalid
        return self


def study_name(study_dir: str | Path) -> str:
    return Path(study_dir).resolve().name


def rows_of(items: Iterable[OnDisk], study: str) -> tuple[list[dict], list[str]]:
    """The measurement rows of `items` (read and validated), and the invalid files."""
    rows, invalid = [], []
    for item in items:
        try:
            data = item.path.read_bytes()  # read once: hashed, then parsed
            records = read_metrics(item.path, steps=False, text=data.decode())
            sha = hashlib.sha256(data).hexdigest()
            rows.append(
                measurement_row(
                    records,
                    records[0].get("study") or study,
                    item.cell,
                    item.measurement or f"plain-{sha[:12]}",
                    sha,
                )  # fmt: skip
            )
        except (OSError, MetricsError, KeyError, TypeError, ValueError, StopIteration) as exc:
            invalid.append(f"{item.path}: {exc}")
    return rows, invalid


def record_measurements(db: Database, study: str, items: list[OnDisk]) -> Recorded:
    """Write the rows of `items` the database lacks, in one transaction."""
    rows, invalid = rows_of(items, study)
    with db.transaction() as conn:
        inserted = insert_new(conn, measurements, rows)
    return Recorded(inserted, len(rows) - inserted, invalid)


def record_study(db: Database, study_dir: str | Path, *, verdict_tables=()) -> Recorded:
    """Record whatever of a study folder the database lacks: its measurements (those whose
    cell and measurement name it does not know are read; a file it holds under another name,
    an adopted plain file, is skipped by its content), its preflight results and the verdict
    tables given as (source, path). Importing twice changes nothing."""
    study_dir = Path(study_dir)
    study = study_name(study_dir)
    on_disk = measurements_on_disk(study_dir)
    known = known_measurements(db, study)
    todo = [m for m in on_disk if (m.cell, m.measurement) not in known]
    done = Recorded(known=len(on_disk) - len(todo))
    for start in range(0, len(todo), 500):  # bounded transactions
        done += record_measurements(db, study, todo[start : start + 500])
    done.inserted += record_preflights(db, study_dir)
    for source, table in verdict_tables:
        done.inserted += record_verdicts(db, study, source, table)
    return done


def record_preflights(db: Database, study_dir: str | Path) -> int:
    """The study's preflight results (results/<study>/preflight/*.json) the database lacks."""
    from dlscale.store.preflight_results import PREFLIGHT_DIR, read_result

    folder = Path(study_dir) / PREFLIGHT_DIR
    rows = []
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        result = read_result(path)
        if not result or "finished_at" not in result:
            continue
        rows.append(preflight_row(result, study_name(study_dir), path.name))
    if not rows:
        return 0
    with db.transaction() as conn:
        return insert_new(conn, preflights, rows)


def record_verdicts(db: Database, study: str, source: str, table: str | Path) -> int:
    """A verdict table's rows (tables/verdicts.csv: source `references`; history/verdicts.csv:
    `history`), once per table content."""
    path = Path(table)
    if not path.is_file():
        return 0
    rows = verdict_rows(path, study, source)
    if not rows:
        return 0
    with db.transaction() as conn:
        return insert_new(conn, verdicts, rows)


# ---- rows that wait for the next run ------------------------------------------------------------
# In the study's results folder: whether rows of the study are waiting for the database (its
# last writer could not reach it). The workflow's `history` rule takes it as an input where it
# exists, so the next run records them even when it has nothing else to do (rules/history.smk).
PENDING_FILE = "logs/database-pending.json"


def pending_path(study_dir: str | Path) -> Path:
    return Path(study_dir) / PENDING_FILE


def mark_pending(study_dir: str | Path, url: str, reason: str | None) -> None:
    """Say in PENDING_FILE whether rows are waiting for the database (reason) or not (None).
    Written after the outputs of the job that writes it, so a marker that says "waiting" is
    newer than the history rule's outputs and makes the next run record again."""
    path = pending_path(study_dir)
    if reason is None and not path.exists():
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(
        json.dumps(
            {
                "pending": reason is not None,
                "database": describe(url),
                "reason": reason,
                "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            },
            indent=1,
        )
        + "\n"
    )
    os.replace(tmp, path)


def is_pending(study_dir: str | Path) -> bool:
    try:
        return bool(json.loads(pending_path(study_dir).read_text()).get("pending"))
    except (OSError, ValueError, AttributeError):
        return False


def counts(db: Database) -> dict[str, int]:
    """Rows per table."""
    with db.read() as conn:
        return {
            t.name: conn.execute(sa.select(sa.func.count()).select_from(t)).scalar_one()
            for t in (measurements, preflights, verdicts)
        }


def integrity_problems(db: Database) -> list[str]:
    """SQLite's own integrity check and foreign-key check ([] when sound); a server checks
    itself ([] )."""
    if db.kind != "sqlite":
        return []
    with db.read() as conn:
        rows = conn.exec_driver_sql("PRAGMA integrity_check").scalars().all()
    return [] if rows == ["ok"] else list(rows)

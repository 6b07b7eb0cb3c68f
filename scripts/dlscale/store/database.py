"""The results database: every measured cell of every study, its preflight results and its
verdicts, kept beyond any one study's folder, so that a configuration's history can be asked
("since when is it slower?": dlscale.decisions.history).

**Where.** One URL (SQLAlchemy 2.0's form) names it:

- default: one SQLite file, `results/dlscale.sqlite` (DATABASE_FILE), in WAL mode: readers
  never wait for a writer and two studies write at once on a local disk (each write is one
  short transaction that takes SQLite's write lock at its start: BEGIN IMMEDIATE, waiting up
  to the busy timeout for another). The file and its sidecars (`-wal`, `-shm`, `-journal`,
  `.lock`) are names no study may take (dlscale.study.cell.RESERVED_UNDER_RESULTS).
- WAL needs shared memory between the writers, which a network file system does not give:
  where the file lies on one (NFS, Lustre, GPFS, CIFS, ...: `network_filesystem`, from
  /proc/self/mountinfo), SQLite's rollback journal is used instead, and every transaction also
  holds an exclusive POSIX lock on `<file>.lock` (the file system's lock service: NFSv4's
  own, NFSv3's lockd). Where that lock cannot be taken (no lock service), the database is
  refused with the fix: a PostgreSQL server (`DatabaseUnavailable`).
- `postgresql+psycopg://user@host/dbname` (psycopg 3) selects a shared PostgreSQL server, for
  a team; config `database`, or DLSCALE_DATABASE_URL (URL_VARIABLE) when the config names
  none. `off` (or false) records nothing. The URL is a scheduling setting: it enters no
  cell's or study's hash (dlscale.study.hashes).

**What.** Three tables (`metadata`; the schema is versioned by Alembic migrations in
`db_migrations/`, applied on first use: `ensure_schema`):

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
from datetime import datetime, timezone
from pathlib import Path

import sqlalchemy as sa

from dlscale.store.metrics import MetricsError, read_metrics
from dlscale.study.cell import (
    AXES,
    DERIVED,
    MEASUREMENTS_DIR,
    METRICS_FILE,
    NOT_IDENTITY,
    RESULTS_DATABASE,
    WORKLOAD_DIRS,
)
from dlscale.study.protocol import CONVERGENCE, RANK_START, SUMMARY

# The default database's file under results/; it and its sidecars (SQLite's -wal, -shm,
# -journal and the lock file, LOCK_SUFFIX) are names no study may take
# (dlscale.study.cell.RESERVED_UNDER_RESULTS).
DATABASE_FILE = RESULTS_DATABASE
LOCK_SUFFIX = ".lock"
URL_VARIABLE = "DLSCALE_DATABASE_URL"
OFF = "off"
# How long one write waits for another writer's lock (SQLite's busy timeout, the lock file's
# wait) and for a server (PostgreSQL's connect timeout), in seconds: past it the write is left
# for the next run and the study goes on.
TIMEOUT_S = 10.0
# File system types on which SQLite's WAL is unsafe (its shared memory is not shared between
# hosts) and its own locks are unreliable.
NETWORK_FILESYSTEMS = frozenset(
    {
        "nfs",
        "nfs4",
        "cifs",
        "smb3",
        "smbfs",
        "lustre",
        "gpfs",
        "beegfs",
        "ceph",
        "fuse.ceph",
        "glusterfs",
        "fuse.glusterfs",
        "fuse.sshfs",
        "9p",
        "afs",
        "ocfs2",
        "gfs2",
        "panfs",
        "wekafs",
    }
)
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


# ---- the file system under a SQLite file ------------------------------------------------------
def filesystem_type(path: str | Path, mountinfo: str = "/proc/self/mountinfo") -> str:
    """The type of the file system `path` lies on (the longest mount point above it)."""
    target = os.path.realpath(path)
    best, kind = "", "unknown"
    try:
        lines = Path(mountinfo).read_text().splitlines()
    except OSError:
        return kind
    for line in lines:
        left, _, right = line.partition(" - ")
        fields = left.split()
        if len(fields) < 5 or not right:
            continue
        mount = fields[4].replace("\\040", " ")
        inside = target == mount or target.startswith(mount.rstrip("/") + "/")
        if inside and len(mount) >= len(best):
            best, kind = mount, right.split()[0]
    return kind


def network_filesystem(path: str | Path) -> str | None:
    """The network file system type under `path`, or None on a local one."""
    kind = filesystem_type(path)
    return kind if kind in NETWORK_FILESYSTEMS or kind.startswith("nfs") else None


# ---- the schema ---------------------------------------------------------------------------------
metadata = sa.MetaData()

AXIS_COLUMNS = tuple(a for a in AXES if a != "nodes")
INT_COLUMNS = ("nodes", "ranks_per_node", "rep", "world_size", "per_rank_batch", "global_batch")
# The metrics a row carries as columns, from the summary record (and the convergence record).
METRIC_COLUMNS = (
    "throughput_samples_per_s",
    "rank_throughput_min",
    "rank_throughput_max",
    "step_seconds_median",
    "comm_fraction",
    "joules_per_sample",
    "peak_rss_mb_max",
    "time_to_accuracy_s",
)

measurements = sa.Table(
    "measurements",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("study", sa.String(200), nullable=False),
    sa.Column("cell", sa.String(400), nullable=False),  # the cell's folder in its study
    sa.Column("measurement", sa.String(200), nullable=False),  # measurements/<this>/
    sa.Column("metrics_sha256", sa.String(64), nullable=False),
    sa.Column("workload", sa.String(20), nullable=False),
    *(sa.Column(c, sa.String(100), nullable=False) for c in AXIS_COLUMNS),
    *(sa.Column(c, sa.Integer, nullable=False) for c in INT_COLUMNS),
    sa.Column("series", sa.String(16), nullable=False),
    sa.Column("configuration", sa.String(16), nullable=False),
    sa.Column("cell_hash", sa.String(16), nullable=False),
    sa.Column("environment", sa.String(200), nullable=False),
    sa.Column("launcher", sa.String(40), nullable=False),
    sa.Column("measured_at", sa.DateTime, nullable=False),  # UTC
    *(sa.Column(c, sa.Float) for c in METRIC_COLUMNS),
    sa.Column("reached", sa.Boolean),
    sa.Column("competing", sa.Boolean),
    sa.Column("git_commit", sa.String(64)),
    sa.Column("dlscale_version", sa.String(40)),
    sa.Column("slurm_job_id", sa.String(40)),
    sa.Column("hosts", sa.Text),
    sa.Column("device_model", sa.String(200)),
    sa.Column("software", sa.Text, nullable=False),  # JSON: name -> version (software_stack)
    sa.Column("stack", sa.String(16), nullable=False),  # hash of `software` but its nodes
    sa.Column("cell_json", sa.Text, nullable=False),  # run_start's cell
    sa.Column("summary_json", sa.Text, nullable=False),  # the summary (and convergence) record
    sa.Column("recorded_at", sa.DateTime, nullable=False),  # UTC
    sa.UniqueConstraint("study", "cell", "metrics_sha256", name="uq_measurements_content"),
    sa.Index("ix_measurements_point", *AXIS_COLUMNS, "nodes"),
    sa.Index("ix_measurements_series", "series"),
    sa.Index("ix_measurements_configuration", "configuration"),
    sa.Index("ix_measurements_study", "study", "cell", "measurement"),
)

preflights = sa.Table(
    "preflights",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("study", sa.String(200), nullable=False),
    sa.Column("result_file", sa.String(400), nullable=False),
    sa.Column("hardware", sa.String(100), nullable=False),
    sa.Column("environment", sa.String(200)),
    sa.Column("environment_id", sa.String(200)),
    sa.Column("passed", sa.Boolean, nullable=False),
    sa.Column("failed_check", sa.String(200)),
    sa.Column("finished_at", sa.DateTime, nullable=False),  # UTC
    sa.Column("slurm_job", sa.String(40)),
    sa.Column("host", sa.String(200)),
    sa.Column("nodes", sa.Integer),
    sa.Column("ranks", sa.Integer),
    sa.Column("busbw_gbps", sa.Float),
    sa.Column("result_json", sa.Text, nullable=False),
    sa.Column("recorded_at", sa.DateTime, nullable=False),
    sa.UniqueConstraint("study", "result_file", "finished_at", name="uq_preflights_result"),
)

verdicts = sa.Table(
    "verdicts",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("study", sa.String(200), nullable=False),
    sa.Column("source", sa.String(20), nullable=False),  # references | history
    sa.Column("table_sha256", sa.String(64), nullable=False),  # the verdict table's content
    sa.Column("hardware", sa.String(100), nullable=False),
    sa.Column("cell", sa.String(400), nullable=False),
    sa.Column("metric", sa.String(100), nullable=False),
    sa.Column("verdict", sa.String(20), nullable=False),
    sa.Column("measured", sa.Float),
    sa.Column("reference", sa.Float),
    sa.Column("low", sa.Float),
    sa.Column("high", sa.Float),
    sa.Column("n", sa.Integer),
    sa.Column("detail", sa.Text),
    sa.Column("recorded_at", sa.DateTime, nullable=False),
    sa.UniqueConstraint(
        "study", "source", "table_sha256", "hardware", "cell", "metric", name="uq_verdicts_row"
    ),
)
UNIQUE = {
    "measurements": ("study", "cell", "metrics_sha256"),
    "preflights": ("study", "result_file", "finished_at"),
    "verdicts": ("study", "source", "table_sha256", "hardware", "cell", "metric"),
}


def utc(seconds: float | None = None) -> datetime:
    """A naive UTC datetime (the database's times are UTC)."""
    when = time.time() if seconds is None else seconds
    return datetime.fromtimestamp(when, tz=timezone.utc).replace(tzinfo=None)


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


# ---- writing ------------------------------------------------------------------------------
def insert_new(conn: sa.Connection, table: sa.Table, rows: list[dict]) -> int:
    """Insert the rows the table does not hold yet (its unique key: UNIQUE), in one
    statement; returns how many went in."""
    if not rows:
        return 0
    if conn.dialect.name == "postgresql":
        from sqlalchemy.dialects.postgresql import insert
    else:
        from sqlalchemy.dialects.sqlite import insert
    stmt = insert(table).on_conflict_do_nothing(index_elements=list(UNIQUE[table.name]))
    return len(conn.execute(stmt.returning(table.c.id), rows).all())


def known_measurements(db: Database, study: str) -> set[tuple[str, str]]:
    """(cell, measurement) of the study's measurements the database holds."""
    with db.read() as conn:
        rows = conn.execute(
            sa.select(measurements.c.cell, measurements.c.measurement).where(
                measurements.c.study == study
            )
        )
        return {(r.cell, r.measurement) for r in rows}


# ---- a measurement as a row -------------------------------------------------------------------
def _sha16(value) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:16]


# Fields of a cell's identity that are its software stack: `configuration` leaves them out,
# and the hardware entry's hash with them (it covers the entry's modules and variables).
SOFTWARE_FIELDS = ("environment", "modules", "env", "hardware_hash")
# What a cell's JSON holds that is no part of its identity (dlscale.study.cell.NOT_IDENTITY)
# and the fields derived from the others.
NOT_SERIES = (*NOT_IDENTITY, *DERIVED, "rep")


def identity_hashes(cell: dict) -> tuple[str, str]:
    """(series, configuration) of a cell's JSON: its identity without the repetition, and
    that without its software stack (SOFTWARE_FIELDS)."""
    identity = {k: v for k, v in cell.items() if k not in NOT_SERIES}
    setup = {k: v for k, v in identity.items() if k not in SOFTWARE_FIELDS}
    return _sha16(identity), _sha16(setup)


def software_stack(records: list[dict]) -> dict[str, str]:
    """What a measurement ran on, name -> version or value: dlscale's commit and version,
    Python and the libraries, the framework environment, modules and variables, the container,
    the hardware entry's hash, the framework build's CUDA, cuDNN and NCCL, the GPU driver,
    the OS, kernel, C library and Slurm of the first node, the device and the nodes. Only what
    was recorded (a file from before a probe lacks it)."""
    start = records[0]["value"]
    cell, prov = start["cell"], start["provenance"]
    system = (
        next((r["value"].get("system") for r in records if r["event"] == RANK_START), None) or {}
    )
    out: dict[str, str] = {
        "dlscale commit": prov.get("git_commit"),
        "dlscale": prov.get("dlscale_version"),
        "python": prov.get("python"),
        **{name: version for name, version in sorted((prov.get("libraries") or {}).items())},
        "environment": cell.get("environment"),
        "hardware entry": cell.get("hardware_hash"),
        "modules": " ".join(cell.get("modules") or []) or None,
        "env": " ".join(f"{k}={v}" for k, v in sorted((cell.get("env") or {}).items())) or None,
        "device": prov.get("device_model"),
        "nodes": " ".join(sorted(prov.get("hosts") or [])) or None,
    }
    box = cell.get("container") or {}
    if box:
        out["container"] = f"{box.get('image')}@{box.get('digest', 'no digest')}"
    build = system.get("framework_build") or {}
    if build.get("available"):
        out["framework build"] = build.get("version")
        for key, name in (("cuda_runtime", "CUDA"), ("cudnn", "cuDNN"), ("nccl", "NCCL")):
            out[name] = build.get(key)
    gpu = system.get("gpu") or {}
    if gpu.get("available"):
        out["GPU driver"] = " ".join(gpu.get("drivers") or []) or None
    osys = system.get("os") or {}
    if osys.get("available"):
        out.update(OS=osys.get("name"), kernel=osys.get("kernel"), libc=osys.get("libc"))
    slurm = system.get("slurm") or {}
    if slurm.get("available"):
        out["Slurm"] = slurm.get("version")
    return {k: str(v) for k, v in out.items() if v not in (None, "")}


# What of a software stack is left out of its hash (`stack`): the nodes name where a run ran,
# not what it ran; dlscale's own commit moves with every change to the checkout (a study
# measured while the harness was edited would be split into runs), while what the harness
# measures is in the cell's identity. Both stay in `software`, so what changed names them.
NOT_STACK = ("nodes", "dlscale commit")


def stack_hash(software: dict[str, str]) -> str:
    """The software stack's hash (`stack`): one run's measurements of a series share it."""
    return _sha16({k: v for k, v in software.items() if k not in NOT_STACK})


def measurement_row(records: list[dict], study: str, cell: str, measurement: str, sha: str):
    """The `measurements` row of one valid metrics file's records."""
    start = records[0]["value"]
    cellv, prov = start["cell"], start["provenance"]
    summary = next(r["value"] for r in reversed(records) if r["event"] == SUMMARY)
    outcome = next((r["value"] for r in records if r["event"] == CONVERGENCE), None)
    series, configuration = identity_hashes(cellv)
    software = software_stack(records)
    row = {
        "study": study,
        "cell": cell,
        "measurement": measurement,
        "metrics_sha256": sha,
        "workload": cellv.get("workload", "throughput"),
        **{c: str(cellv.get(c, "ddp" if c == "parallelism" else "")) for c in AXIS_COLUMNS},
        **{c: int(cellv.get(c, 1 if c != "rep" else 0)) for c in INT_COLUMNS if c != "world_size"},
        "world_size": int(cellv.get("world_size") or cellv["nodes"] * cellv["ranks_per_node"]),
        "series": series,
        "configuration": configuration,
        "cell_hash": str(cellv.get("config_hash") or start.get("config_hash") or ""),
        "environment": str(cellv.get("environment", "")),
        "launcher": str(cellv.get("launcher", prov.get("launcher", ""))),
        "measured_at": utc(records[0]["time"]),
        **{c: _number(summary.get(c)) for c in METRIC_COLUMNS if c != "time_to_accuracy_s"},
        "time_to_accuracy_s": _number((outcome or {}).get("time_to_accuracy_s")),
        "reached": None if outcome is None else bool(outcome.get("reached")),
        "competing": bool(summary.get("competing")),
        "git_commit": prov.get("git_commit"),
        "dlscale_version": prov.get("dlscale_version"),
        "slurm_job_id": None if prov.get("slurm_job_id") is None else str(prov["slurm_job_id"]),
        "hosts": " ".join(prov.get("hosts") or []),
        "device_model": prov.get("device_model"),
        "software": json.dumps(software, sort_keys=True),
        "stack": stack_hash(software),
        "cell_json": json.dumps(cellv, sort_keys=True),
        "summary_json": json.dumps(
            {"summary": summary, **({"convergence": outcome} if outcome else {})},
            sort_keys=True,
            default=str,
        ),
        "recorded_at": utc(),
    }
    return row


def _number(value) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


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
        failed = result.get("failed") or {}
        allreduce = result.get("allreduce") or {}
        rows.append(
            {
                "study": study_name(study_dir),
                "result_file": path.name,
                "hardware": str(result.get("hardware", "")),
                "environment": result.get("environment"),
                "environment_id": result.get("environment_id"),
                "passed": bool(result.get("passed")),
                "failed_check": failed.get("name"),
                "finished_at": utc(float(result["finished_at"])),
                "slurm_job": None if result.get("slurm_job") is None else str(result["slurm_job"]),
                "host": result.get("host"),
                "nodes": result.get("nodes"),
                "ranks": result.get("ranks"),
                "busbw_gbps": _number(allreduce.get("busbw_gbps")),
                "result_json": json.dumps(result, sort_keys=True, default=str),
                "recorded_at": utc(),
            }
        )
    if not rows:
        return 0
    with db.transaction() as conn:
        return insert_new(conn, preflights, rows)


def _csv_rows(path: Path) -> list[dict]:
    import csv

    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def _float(value) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if number == number else None  # NaN: none


def record_verdicts(db: Database, study: str, source: str, table: str | Path) -> int:
    """A verdict table's rows (tables/verdicts.csv: source `references`; history/verdicts.csv:
    `history`), once per table content."""
    path = Path(table)
    if not path.is_file():
        return 0
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    rows = []
    for r in _csv_rows(path):
        rows.append(
            {
                "study": study,
                "source": source,
                "table_sha256": digest,
                "hardware": r.get("hardware", ""),
                "cell": r.get("cell") or r.get("series") or "",
                "metric": r.get("metric") or "throughput_samples_per_s",
                "verdict": r.get("verdict", ""),
                "measured": _float(r.get("measured")),
                "reference": _float(r.get("reference")),
                "low": _float(r.get("interval_low") or r.get("slowdown_low")),
                "high": _float(r.get("interval_high") or r.get("slowdown_high")),
                "n": int(_float(r.get("n")) or 0) or None,
                "detail": r.get("reason") or r.get("interval_vs_bounds") or r.get("margin"),
                "recorded_at": utc(),
            }
        )
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

"""The results database's schema (dlscale.store.database): its three tables, `measurements`,
`preflights` and `verdicts`, with the unique key by which a row goes in once (`UNIQUE`,
`insert_new`), and its times (naive UTC, `utc`). The migrations in db_migrations/ build this
schema; `alembic revision --autogenerate` compares them with `metadata`."""

from __future__ import annotations

import time
from datetime import datetime, timezone

import sqlalchemy as sa

from dlscale.study.cell import AXES

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

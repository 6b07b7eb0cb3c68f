"""The results database: measurements, preflight results and verdicts.

Revision ID: 0001
Revises:
Create Date: 2026-11-29
"""

import sqlalchemy as sa
from alembic import op

# what Alembic reads of a revision script
__all__ = ["revision", "down_revision", "branch_labels", "depends_on", "upgrade", "downgrade"]

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

AXES = ("hardware", "framework", "model", "policy", "precision", "mode", "parallelism")
INTS = ("nodes", "ranks_per_node", "rep", "world_size", "per_rank_batch", "global_batch")
METRICS = (
    "throughput_samples_per_s",
    "rank_throughput_min",
    "rank_throughput_max",
    "step_seconds_median",
    "comm_fraction",
    "joules_per_sample",
    "peak_rss_mb_max",
    "time_to_accuracy_s",
)


def upgrade() -> None:
    op.create_table(
        "measurements",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("study", sa.String(200), nullable=False),
        sa.Column("cell", sa.String(400), nullable=False),
        sa.Column("measurement", sa.String(200), nullable=False),
        sa.Column("metrics_sha256", sa.String(64), nullable=False),
        sa.Column("workload", sa.String(20), nullable=False),
        *(sa.Column(c, sa.String(100), nullable=False) for c in AXES),
        *(sa.Column(c, sa.Integer, nullable=False) for c in INTS),
        sa.Column("series", sa.String(16), nullable=False),
        sa.Column("configuration", sa.String(16), nullable=False),
        sa.Column("cell_hash", sa.String(16), nullable=False),
        sa.Column("environment", sa.String(200), nullable=False),
        sa.Column("launcher", sa.String(40), nullable=False),
        sa.Column("measured_at", sa.DateTime, nullable=False),
        *(sa.Column(c, sa.Float) for c in METRICS),
        sa.Column("reached", sa.Boolean),
        sa.Column("competing", sa.Boolean),
        sa.Column("git_commit", sa.String(64)),
        sa.Column("dlscale_version", sa.String(40)),
        sa.Column("slurm_job_id", sa.String(40)),
        sa.Column("hosts", sa.Text),
        sa.Column("device_model", sa.String(200)),
        sa.Column("software", sa.Text, nullable=False),
        sa.Column("stack", sa.String(16), nullable=False),
        sa.Column("cell_json", sa.Text, nullable=False),
        sa.Column("summary_json", sa.Text, nullable=False),
        sa.Column("recorded_at", sa.DateTime, nullable=False),
        sa.UniqueConstraint("study", "cell", "metrics_sha256", name="uq_measurements_content"),
    )
    op.create_index("ix_measurements_point", "measurements", [*AXES, "nodes"])
    op.create_index("ix_measurements_series", "measurements", ["series"])
    op.create_index("ix_measurements_configuration", "measurements", ["configuration"])
    op.create_index("ix_measurements_study", "measurements", ["study", "cell", "measurement"])
    op.create_table(
        "preflights",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("study", sa.String(200), nullable=False),
        sa.Column("result_file", sa.String(400), nullable=False),
        sa.Column("hardware", sa.String(100), nullable=False),
        sa.Column("environment", sa.String(200)),
        sa.Column("environment_id", sa.String(200)),
        sa.Column("passed", sa.Boolean, nullable=False),
        sa.Column("failed_check", sa.String(200)),
        sa.Column("finished_at", sa.DateTime, nullable=False),
        sa.Column("slurm_job", sa.String(40)),
        sa.Column("host", sa.String(200)),
        sa.Column("nodes", sa.Integer),
        sa.Column("ranks", sa.Integer),
        sa.Column("busbw_gbps", sa.Float),
        sa.Column("result_json", sa.Text, nullable=False),
        sa.Column("recorded_at", sa.DateTime, nullable=False),
        sa.UniqueConstraint("study", "result_file", "finished_at", name="uq_preflights_result"),
    )
    op.create_table(
        "verdicts",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("study", sa.String(200), nullable=False),
        sa.Column("source", sa.String(20), nullable=False),
        sa.Column("table_sha256", sa.String(64), nullable=False),
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
            "study",
            "source",
            "table_sha256",
            "hardware",
            "cell",
            "metric",
            name="uq_verdicts_row",
        ),
    )


def downgrade() -> None:
    op.drop_table("verdicts")
    op.drop_table("preflights")
    op.drop_index("ix_measurements_study", "measurements")
    op.drop_index("ix_measurements_configuration", "measurements")
    op.drop_index("ix_measurements_series", "measurements")
    op.drop_index("ix_measurements_point", "measurements")
    op.drop_table("measurements")

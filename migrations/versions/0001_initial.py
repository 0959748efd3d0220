"""initial store: models, artifacts, ramps, exit configs and profiles, requests, workers

Revision ID: 0001_initial
Revises:
Create Date: 2025-01-01 00:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0001_initial"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Frozen copies of the column types (a revision must not change when models.py does).
JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
NAME = sa.String(200)


def _id() -> sa.Column:
    return sa.Column("id", sa.Integer(), nullable=False)


def upgrade() -> None:
    op.create_table(
        "models",
        _id(),
        sa.Column("name", NAME, nullable=False),
        sa.Column("version", sa.String(64), nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("manifest", JSON, nullable=False),
        sa.Column("path", sa.Text(), nullable=False),
        sa.Column("classes", JSON, nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("updated_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_models"),
        sa.UniqueConstraint("name", name="uq_models_name"),
    )
    op.create_table(
        "artifacts",
        _id(),
        sa.Column("model_id", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("idx", sa.Integer(), nullable=False),
        sa.Column("file", sa.Text(), nullable=False),
        sa.Column("sha256", sa.String(64), nullable=True),
        sa.Column("bytes", sa.BigInteger(), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_artifacts"),
        sa.ForeignKeyConstraint(
            ["model_id"], ["models.id"], name="fk_artifacts_model_id_models", ondelete="CASCADE"
        ),
        sa.UniqueConstraint("model_id", "kind", "idx", name="uq_artifacts_model_id_kind_idx"),
    )
    op.create_table(
        "ramps",
        _id(),
        sa.Column("model_id", sa.Integer(), nullable=False),
        sa.Column("idx", sa.Integer(), nullable=False),
        sa.Column("site", sa.Integer(), nullable=False),
        sa.Column("arch", sa.String(64), nullable=True),
        sa.Column("params", sa.BigInteger(), nullable=True),
        sa.Column("agreement", sa.Float(), nullable=True),
        sa.Column("cost_ms", sa.Float(), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_ramps"),
        sa.ForeignKeyConstraint(
            ["model_id"], ["models.id"], name="fk_ramps_model_id_models", ondelete="CASCADE"
        ),
        sa.UniqueConstraint("model_id", "idx", name="uq_ramps_model_id_idx"),
    )
    op.create_table(
        "exit_configs",
        _id(),
        sa.Column("model", NAME, nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("thresholds", JSON, nullable=False),
        sa.Column("active", JSON, nullable=False),
        sa.Column("mode", sa.String(16), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_exit_configs"),
        sa.UniqueConstraint("model", "version", name="uq_exit_configs_model_version"),
    )
    op.create_index("ix_exit_configs_model_created_at", "exit_configs", ["model", "created_at"])
    op.create_table(
        "exit_profiles",
        sa.Column("id", BIG_ID, nullable=False),
        sa.Column("model", NAME, nullable=False),
        sa.Column("config_version", sa.Integer(), nullable=True),
        sa.Column("window_start", sa.DateTime(), nullable=False),
        sa.Column("window_end", sa.DateTime(), nullable=False),
        sa.Column("ramp", sa.Integer(), nullable=False),
        sa.Column("samples", sa.Integer(), nullable=False),
        sa.Column("exit_rate", sa.Float(), nullable=False),
        sa.Column("agreement", sa.Float(), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_exit_profiles"),
    )
    op.create_index("ix_exit_profiles_model_window_end", "exit_profiles", ["model", "window_end"])
    op.create_table(
        "requests",
        sa.Column("id", BIG_ID, nullable=False),
        sa.Column("request_id", sa.String(64), nullable=False),
        sa.Column("model", NAME, nullable=False),
        sa.Column("received_at", sa.DateTime(), nullable=False),
        sa.Column("latency_ms", sa.Float(), nullable=True),
        sa.Column("status", sa.String(32), nullable=False),
        sa.Column("exit", sa.Integer(), nullable=True),
        sa.Column("early", sa.Boolean(), nullable=True),
        sa.Column("label", sa.Integer(), nullable=True),
        sa.Column("config_version", sa.Integer(), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_requests"),
    )
    op.create_index("ix_requests_model_received_at", "requests", ["model", "received_at"])
    op.create_table(
        "workers",
        sa.Column("worker_id", sa.String(128), nullable=False),
        sa.Column("model", NAME, nullable=False),
        sa.Column("stage", sa.Integer(), nullable=False),
        sa.Column("first_block", sa.Integer(), nullable=False),
        sa.Column("last_block", sa.Integer(), nullable=False),
        sa.Column("host", sa.String(255), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(32), nullable=False),
        sa.Column("started_at", sa.DateTime(), nullable=False),
        sa.Column("last_seen", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("worker_id", name="pk_workers"),
    )
    op.create_table(
        "ingested_batches",
        sa.Column("key", sa.String(255), nullable=False),
        sa.Column("at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("key", name="pk_ingested_batches"),
    )


def downgrade() -> None:
    for table in (
        "ingested_batches",
        "workers",
        "requests",
        "exit_profiles",
        "exit_configs",
        "ramps",
        "artifacts",
        "models",
    ):
        op.drop_table(table)  # drops the table's indexes with it

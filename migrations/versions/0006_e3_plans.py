"""E3: batch profiles (observed and forecast survival per ramp and window), versioned
deployment plans, and the device class and straggler mark of each worker

Revision ID: 0006_e3_plans
Revises: 0005_request_ids_unique
Create Date: 2026-11-26 00:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0006_e3_plans"
down_revision: str | Sequence[str] | None = "0005_request_ids_unique"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

NAME = sa.String(200)  # frozen copies of the column types
BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


def upgrade() -> None:
    op.create_table(
        "batch_profiles",
        sa.Column("id", BIG_ID, nullable=False),
        sa.Column("model", NAME, nullable=False),
        sa.Column("window_start", sa.DateTime(), nullable=False),
        sa.Column("window_end", sa.DateTime(), nullable=False),
        sa.Column("ramp", sa.Integer(), nullable=False),
        sa.Column("config_version", sa.Integer(), nullable=True),
        sa.Column("samples", sa.Integer(), nullable=True),
        sa.Column("observed", sa.Float(), nullable=True),
        sa.Column("forecast", sa.Float(), nullable=True),
        sa.Column("forecast_naive", sa.Float(), nullable=True),
        sa.Column("error", sa.Float(), nullable=True),
        sa.Column("drifted", sa.Boolean(), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_batch_profiles"),
        sa.UniqueConstraint("model", "window_start", "ramp",
                            name="uq_batch_profiles_model_window_start_ramp"),
    )
    op.create_index("ix_batch_profiles_model_window_end", "batch_profiles",
                    ["model", "window_end"])
    op.create_table(
        "deployment_plans",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("model", NAME, nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("feasible", sa.Boolean(), nullable=False),
        sa.Column("goodput_rps", sa.Float(), nullable=False),
        sa.Column("latency_ms", sa.Float(), nullable=False),
        sa.Column("cost", sa.Float(), nullable=False),
        sa.Column("plan", JSON, nullable=False),
        sa.Column("inputs", JSON, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_deployment_plans"),
        sa.UniqueConstraint("model", "version", name="uq_deployment_plans_model_version"),
    )
    op.create_index("ix_deployment_plans_model_created_at", "deployment_plans",
                    ["model", "created_at"])
    with op.batch_alter_table("workers") as batch:
        batch.add_column(sa.Column("device", sa.String(128), nullable=True))
        batch.add_column(sa.Column("straggler_since", sa.DateTime(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("workers") as batch:
        batch.drop_column("straggler_since")
        batch.drop_column("device")
    op.drop_table("deployment_plans")
    op.drop_table("batch_profiles")

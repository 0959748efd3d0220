"""SuperServe: subnet profiles (a model's variants with accuracy and latency per batch
size per device class; the pareto rows are what the router's variant policies use)

Revision ID: 0007_subnet_profiles
Revises: 0006_e3_plans
Create Date: 2026-11-27 00:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0007_subnet_profiles"
down_revision: str | Sequence[str] | None = "0006_e3_plans"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

NAME = sa.String(200)  # frozen copies of the column types
JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


def upgrade() -> None:
    op.create_table(
        "subnet_profiles",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("model", NAME, nullable=False),
        sa.Column("device", sa.String(128), nullable=False),
        sa.Column("variant", sa.String(200), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("accuracy", sa.Float(), nullable=False),
        sa.Column("labelled_accuracy", sa.Float(), nullable=True),
        sa.Column("latency_ms", JSON, nullable=False),
        sa.Column("pareto", sa.Boolean(), nullable=False),
        sa.Column("source", sa.String(64), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_subnet_profiles"),
        sa.UniqueConstraint("model", "device", "variant",
                            name="uq_subnet_profiles_model_device_variant"),
    )


def downgrade() -> None:
    op.drop_table("subnet_profiles")

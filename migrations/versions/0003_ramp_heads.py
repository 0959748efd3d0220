"""ramp heads: versions of refitted ramp heads, with their training window and validation

Revision ID: 0003_ramp_heads
Revises: 0002_tuning
Create Date: 2026-11-25 00:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003_ramp_heads"
down_revision: str | Sequence[str] | None = "0002_tuning"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

NAME = sa.String(200)  # frozen copy of the column type


def upgrade() -> None:
    op.create_table(
        "ramp_heads",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("model", NAME, nullable=False),
        sa.Column("ramp", sa.Integer(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("file", sa.Text(), nullable=False),
        sa.Column("sha256", sa.String(64), nullable=False),
        sa.Column("trained_on", sa.Integer(), nullable=False),
        sa.Column("judged_on", sa.Integer(), nullable=False),
        sa.Column("serving_agreement", sa.Float(), nullable=False),
        sa.Column("agreement", sa.Float(), nullable=False),
        sa.Column("serving_calibration", sa.Float(), nullable=False),
        sa.Column("calibration", sa.Float(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_ramp_heads"),
        sa.UniqueConstraint("model", "ramp", "version", name="uq_ramp_heads_model_ramp_version"),
    )
    op.create_index("ix_ramp_heads_model_created_at", "ramp_heads", ["model", "created_at"])


def downgrade() -> None:
    op.drop_table("ramp_heads")

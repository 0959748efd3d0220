"""tuning: ramp tensors and batch costs, latency profiles, ramp utilities, tuner state

Revision ID: 0002_tuning
Revises: 0001_initial
Create Date: 2025-01-02 00:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import context, op
from sqlalchemy.dialects import postgresql

revision: str = "0002_tuning"
down_revision: str | Sequence[str] | None = "0001_initial"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Frozen copies of the column types (a revision must not change when models.py does).
JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
NAME = sa.String(200)


def upgrade() -> None:
    # Batch mode: plain ALTER on PostgreSQL and (for added columns) on SQLite too.
    with op.batch_alter_table("ramps") as batch:
        batch.add_column(sa.Column("tensor", sa.Text(), nullable=True))
        batch.add_column(sa.Column("cost_by_batch", JSON, nullable=True))
    if not context.is_offline_mode():
        _backfill_ramps()
    op.create_table(
        "latency_profiles",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("model", NAME, nullable=False),
        sa.Column("device", sa.String(128), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("idx", sa.Integer(), nullable=False),
        sa.Column("batch_size", sa.Integer(), nullable=False),
        sa.Column("ms", sa.Float(), nullable=False),
        sa.Column("runs", sa.Integer(), nullable=False),
        sa.Column("measured_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_latency_profiles"),
        sa.UniqueConstraint(
            "model",
            "device",
            "kind",
            "idx",
            "batch_size",
            name="uq_latency_profiles_model_device_kind_idx_batch_size",
        ),
    )
    op.create_index("ix_latency_profiles_model_device", "latency_profiles", ["model", "device"])
    op.create_table(
        "ramp_utilities",
        sa.Column("id", BIG_ID, nullable=False),
        sa.Column("model", NAME, nullable=False),
        sa.Column("round", sa.Integer(), nullable=False),
        sa.Column("config_version", sa.Integer(), nullable=True),
        sa.Column("ramp", sa.Integer(), nullable=False),
        sa.Column("exits", sa.Integer(), nullable=False),
        sa.Column("saved_ms", sa.Float(), nullable=False),
        sa.Column("added_ms", sa.Float(), nullable=False),
        sa.Column("utility_ms", sa.Float(), nullable=False),
        sa.Column("action", sa.String(32), nullable=False),
        sa.Column("at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_ramp_utilities"),
    )
    op.create_index("ix_ramp_utilities_model_at", "ramp_utilities", ["model", "at"])
    op.create_table(
        "tuner_state",
        sa.Column("model", NAME, nullable=False),
        sa.Column("state", JSON, nullable=False),
        sa.Column("config_version", sa.Integer(), nullable=False),
        sa.Column("updated_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("model", name="pk_tuner_state"),
    )


def _backfill_ramps() -> None:
    """Models registered before this revision are not re-registered (same manifest: no
    change), so copy the new columns from the manifests the store already holds."""
    conn = op.get_bind()
    models = sa.table("models", sa.column("id", sa.Integer()), sa.column("manifest", JSON))
    ramps = sa.table(
        "ramps",
        sa.column("model_id", sa.Integer()),
        sa.column("idx", sa.Integer()),
        sa.column("tensor", sa.Text()),
        sa.column("cost_by_batch", JSON),
    )
    for model_id, manifest in conn.execute(sa.select(models.c.id, models.c.manifest)).all():
        for r in (manifest or {}).get("ramps", []):
            costs = r.get("cost_by_batch") or None
            if not r.get("site") and not costs:
                continue
            conn.execute(
                ramps.update()
                .where(ramps.c.model_id == model_id, ramps.c.idx == int(r["index"]))
                .values(
                    tensor=r.get("site") or None,
                    cost_by_batch=costs and {str(int(b)): float(ms) for b, ms in costs.items()},
                )
            )


def downgrade() -> None:
    for table in ("tuner_state", "ramp_utilities", "latency_profiles"):
        op.drop_table(table)  # drops the table's indexes with it
    # SQLite: batch mode rebuilds `ramps` without the columns (named constraints survive).
    with op.batch_alter_table("ramps") as batch:
        batch.drop_column("cost_by_batch")
        batch.drop_column("tensor")

"""generations: one row per generation stream an LLM worker ended with an answer (candidate,
loaded depth, assessment, tokens, timings, log-probability, exits, breaches), what the
profiler turns into Performance History Table rows

Revision ID: 0011_generations
Revises: 0010_helios
Create Date: 2026-11-29 00:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0011_generations"
down_revision: str | Sequence[str] | None = "0010_helios"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

NAME = sa.String(200)  # frozen copies of the column types
BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
HAS_ID = sa.text("request_id <> ''")  # as in 0005: rows without an id are not deduplicated


def upgrade() -> None:
    op.create_table(
        "generations",
        sa.Column("id", BIG_ID, nullable=False),
        sa.Column("request_id", sa.String(64), nullable=False),
        sa.Column("model", NAME, nullable=False),
        sa.Column("worker", sa.String(128), nullable=False),
        sa.Column("received_at", sa.DateTime(), nullable=False),
        sa.Column("candidate", NAME, nullable=False),
        sa.Column("depth", sa.Integer(), nullable=False),
        sa.Column("assessment", sa.Integer(), nullable=True),
        sa.Column("prompt_tokens", sa.Integer(), nullable=False),
        sa.Column("tokens", sa.Integer(), nullable=False),
        sa.Column("ttft_ms", sa.Float(), nullable=False),
        sa.Column("tpot_ms", sa.Float(), nullable=False),
        sa.Column("duration_ms", sa.Float(), nullable=False),
        sa.Column("logprob", sa.Float(), nullable=False),
        sa.Column("exits", JSON, nullable=False),
        sa.Column("breaches", sa.Integer(), nullable=False),
        sa.Column("memory_bytes", sa.BigInteger(), nullable=False),
        sa.Column("checked", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("agreed", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("first_deviation", sa.Integer(), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_generations"),
    )
    op.create_index("ix_generations_model_received_at", "generations", ["model", "received_at"])
    op.create_index("ix_generations_model_assessment", "generations", ["model", "assessment"])
    op.create_index("uq_generations_model_request_id", "generations", ["model", "request_id"],
                    unique=True, sqlite_where=HAS_ID, postgresql_where=HAS_ID)


def downgrade() -> None:
    op.drop_table("generations")

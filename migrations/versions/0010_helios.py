"""HELIOS: the model repository (candidate LLMs with offline profiles), the Performance
History Table (per served model, assessment, candidate and loaded depth) and the decisions
that say which candidate and depth served a model from when on, and why

Revision ID: 0010_helios
Revises: 0009_cap_agreement
Create Date: 2026-11-28 00:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0010_helios"
down_revision: str | Sequence[str] | None = "0009_cap_agreement"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

NAME = sa.String(200)  # frozen copies of the column types
BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


def upgrade() -> None:
    op.create_table(
        "model_repository",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", NAME, nullable=False),
        sa.Column("family", NAME, nullable=False),
        sa.Column("n_layers", sa.Integer(), nullable=False),
        sa.Column("exit_layers", JSON, nullable=False),
        sa.Column("layer_bytes", sa.BigInteger(), nullable=False),
        sa.Column("fixed_bytes", sa.BigInteger(), nullable=False),
        sa.Column("kv_bytes_per_token_layer", sa.BigInteger(), nullable=False),
        sa.Column("tokens_per_s", sa.Float(), nullable=False),
        sa.Column("perplexity", sa.Float(), nullable=False),
        sa.Column("exit_distribution", JSON, nullable=True),
        sa.Column("benchmarks", JSON, nullable=True),
        sa.Column("path", sa.Text(), nullable=True),
        sa.Column("updated_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_model_repository"),
        sa.UniqueConstraint("name", name="uq_model_repository_name"),
    )
    op.create_table(
        "pht",
        sa.Column("id", BIG_ID, nullable=False),
        sa.Column("model", NAME, nullable=False),
        sa.Column("at", sa.DateTime(), nullable=False),
        sa.Column("assessment", sa.Integer(), nullable=False),
        sa.Column("candidate", NAME, nullable=False),
        sa.Column("loaded_depth", sa.Integer(), nullable=False),
        sa.Column("tokens_per_s", sa.Float(), nullable=False),
        sa.Column("ttft_ms", sa.Float(), nullable=False),
        sa.Column("tpot_ms", sa.Float(), nullable=False),
        sa.Column("perplexity", sa.Float(), nullable=False),
        sa.Column("exit_distribution", JSON, nullable=False),
        sa.Column("memory_bytes", sa.BigInteger(), nullable=False),
        sa.Column("tokens", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_pht"),
        sa.UniqueConstraint("model", "assessment", "candidate", "loaded_depth",
                            name="uq_pht_model_assessment_candidate_loaded_depth"),
    )
    op.create_index("ix_pht_model_at", "pht", ["model", "at"])
    op.create_table(
        "helios_decisions",
        sa.Column("id", BIG_ID, nullable=False),
        sa.Column("model", NAME, nullable=False),
        sa.Column("at", sa.DateTime(), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("candidate", NAME, nullable=False),
        sa.Column("depth", sa.Integer(), nullable=False),
        sa.Column("assessment", sa.Integer(), nullable=True),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("batch", sa.Integer(), nullable=True),
        sa.Column("load_bytes", sa.BigInteger(), nullable=True),
        sa.Column("load_ms", sa.Float(), nullable=True),
        sa.Column("cost_ms", sa.Float(), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_helios_decisions"),
    )
    op.create_index("ix_helios_decisions_model_at", "helios_decisions", ["model", "at"])


def downgrade() -> None:
    op.drop_table("helios_decisions")
    op.drop_table("pht")
    op.drop_table("model_repository")

"""generations.decode_ms: the time a stream spent in its own candidate's decoding calls, so
the PHT's tokens/s of a candidate under evaluation leaves out the served model's steps and
the judge passes that share its rounds (null: a worker that does not measure it)

Revision ID: 0015_generation_decode_ms
Revises: 0014_generation_judging
Create Date: 2026-12-05 00:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0015_generation_decode_ms"
down_revision: str | Sequence[str] | None = "0014_generation_judging"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("generations") as batch:
        batch.add_column(sa.Column("decode_ms", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("generations") as batch:
        batch.drop_column("decode_ms")

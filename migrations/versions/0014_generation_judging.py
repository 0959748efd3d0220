"""generations.judging: a stream the served model is still scoring (a HELIOS evaluation).
Its row is stored at once and its judged_logprob filled in later, so a worker that dies in
between loses no stream; until then it stays out of the PHT

Revision ID: 0014_generation_judging
Revises: 0013_ramp_head_prepared
Create Date: 2026-11-28 00:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014_generation_judging"
down_revision: str | Sequence[str] | None = "0013_ramp_head_prepared"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("generations") as batch:
        batch.add_column(sa.Column("judging", sa.Boolean(), nullable=False,
                                   server_default=sa.false()))


def downgrade() -> None:
    with op.batch_alter_table("generations") as batch:
        batch.drop_column("judging")

"""generations.judged_logprob: the served model's log-probability of the tokens another
candidate answered with (HELIOS's evaluation judge), so candidates' perplexities compare

Revision ID: 0012_judged_logprob
Revises: 0011_generations
Create Date: 2026-11-27 00:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012_judged_logprob"
down_revision: str | Sequence[str] | None = "0011_generations"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("generations") as batch:
        batch.add_column(sa.Column("judged_logprob", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("generations") as batch:
        batch.drop_column("judged_logprob")

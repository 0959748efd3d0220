"""ramp_heads.prepared: the version (content hash) of the preparation a head was refitted
for, so a re-prepared model never serves or pins heads fitted to its earlier ramps

Revision ID: 0013_ramp_head_prepared
Revises: 0012_judged_logprob
Create Date: 2026-11-28 00:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013_ramp_head_prepared"
down_revision: str | Sequence[str] | None = "0012_judged_logprob"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("ramp_heads") as batch:  # NULL: refitted before it was recorded
        batch.add_column(sa.Column("prepared", sa.String(64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("ramp_heads") as batch:
        batch.drop_column("prepared")

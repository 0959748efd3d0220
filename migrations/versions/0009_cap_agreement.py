"""SuperServe: per window and ramp, the agreement of capping every sample's depth there
(depth caps, exit depth as a variant)

Revision ID: 0009_cap_agreement
Revises: 0008_request_variants
Create Date: 2026-11-27 04:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009_cap_agreement"
down_revision: str | Sequence[str] | None = "0008_request_variants"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("exit_profiles") as batch:
        batch.add_column(sa.Column("cap_agreement", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("exit_profiles") as batch:
        batch.drop_column("cap_agreement")

"""SuperServe: the variant (subnet or depth cap) each request was served with

Revision ID: 0008_request_variants
Revises: 0007_subnet_profiles
Create Date: 2026-11-27 00:30:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008_request_variants"
down_revision: str | Sequence[str] | None = "0007_subnet_profiles"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("requests") as batch:
        batch.add_column(sa.Column("variant", sa.String(200), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("requests") as batch:
        batch.drop_column("variant")

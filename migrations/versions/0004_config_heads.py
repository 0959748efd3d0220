"""exit config heads: which head file each ramp serves under a config (online refits)

Revision ID: 0004_config_heads
Revises: 0003_ramp_heads
Create Date: 2026-11-25 00:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0004_config_heads"
down_revision: str | Sequence[str] | None = "0003_ramp_heads"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")  # frozen copy of the column type


def upgrade() -> None:
    # ramp index (JSON keys are strings) -> head file; NULL: every ramp on its prepared head
    with op.batch_alter_table("exit_configs") as batch:
        batch.add_column(sa.Column("heads", JSON, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("exit_configs") as batch:
        batch.drop_column("heads")

"""one request row per request id: a client's resend (same id) that is served twice, or a
telemetry message stored again, cannot add a second row

Revision ID: 0005_request_ids_unique
Revises: 0004_config_heads
Create Date: 2026-11-26 00:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005_request_ids_unique"
down_revision: str | Sequence[str] | None = "0004_config_heads"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

NAME = "uq_requests_model_request_id"
HAS_ID = sa.text("request_id <> ''")  # rows of requests too malformed to carry an id


def upgrade() -> None:
    # keep the first row of any id stored twice before the index existed
    op.execute("DELETE FROM requests WHERE request_id <> '' AND id NOT IN "
               "(SELECT MIN(id) FROM requests WHERE request_id <> '' "
               "GROUP BY model, request_id)")
    op.create_index(NAME, "requests", ["model", "request_id"], unique=True,
                    sqlite_where=HAS_ID, postgresql_where=HAS_ID)


def downgrade() -> None:
    op.drop_index(NAME, table_name="requests")

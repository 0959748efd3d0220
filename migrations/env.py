"""Alembic environment of the offramp store.

Normally driven by `services.store.migrate`, which builds the Config in code and hands
over an open connection in `config.attributes["connection"]`. Plain `alembic` also
works: the URL comes from `sqlalchemy.url` or `OFFRAMP_DATABASE_URL`.
"""

from __future__ import annotations

import os

from alembic import context
from sqlalchemy import Connection, text

from services.store.db import IMMEDIATE, make_engine
from services.store.tables import Base

# Any constant works; it only has to be the same for every process migrating a database.
PG_MIGRATION_LOCK = 0x0FF7A3B

config = context.config
target_metadata = Base.metadata


def _url() -> str:
    url = config.get_main_option("sqlalchemy.url") or os.environ.get("OFFRAMP_DATABASE_URL")
    if not url:
        raise RuntimeError("no database URL: set sqlalchemy.url or OFFRAMP_DATABASE_URL")
    return url


def _run(connection: Connection) -> None:
    sqlite = connection.dialect.name == "sqlite"
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=sqlite,  # SQLite cannot ALTER much: batch mode copies tables
        transactional_ddl=True if sqlite else None,  # real BEGINs make SQLite DDL atomic
        compare_type=True,
    )
    with context.begin_transaction():
        if connection.dialect.name == "postgresql":
            # Services may all run `upgrade` at start: serialise them, so the second one
            # sees the version the first committed instead of re-creating tables.
            connection.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": PG_MIGRATION_LOCK})
        context.run_migrations()


def run_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    engine = make_engine(_url())
    try:
        # BEGIN IMMEDIATE on SQLite: one migrating process at a time, the rest wait.
        with engine.execution_options(**{IMMEDIATE: True}).begin() as conn:
            _run(conn)
    finally:
        engine.dispose()


def run_offline() -> None:
    context.configure(url=_url(), target_metadata=target_metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    run_offline()
else:
    run_online()

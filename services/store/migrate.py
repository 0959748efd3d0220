"""Schema migrations in code (`offramp db upgrade|downgrade|current`); no alembic.ini needed."""

from __future__ import annotations

import threading
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection

import migrations
from services.store.db import IMMEDIATE, make_engine

# Alembic installs its `context` proxy as a module global: one command at a time per
# process. Other processes are kept apart by the database (see migrations/env.py).
_ALEMBIC_LOCK = threading.Lock()


def _config(url: str, connection: Connection | None = None) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(Path(migrations.__file__).parent))
    cfg.set_main_option("path_separator", "os")
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))  # configparser escaping
    cfg.attributes["connection"] = connection
    return cfg


def _run(url: str, action: str, revision: str) -> None:
    engine = make_engine(url)
    try:
        # One transaction for the whole run (a failed step leaves nothing half done);
        # BEGIN IMMEDIATE on SQLite so concurrent migrators queue instead of failing.
        with _ALEMBIC_LOCK, engine.execution_options(**{IMMEDIATE: True}).begin() as conn:
            getattr(command, action)(_config(url, conn), revision)
    finally:
        engine.dispose()


def upgrade(url: str, revision: str = "head") -> None:
    """Migrate the database at `url` up to `revision` (creates a missing SQLite folder)."""
    _run(url, "upgrade", revision)


def downgrade(url: str, revision: str = "-1") -> None:
    """Migrate down to `revision` ("-1": one step, "base": drop everything)."""
    _run(url, "downgrade", revision)


def current(url: str) -> str | None:
    """The revision the database is at, or None when it was never migrated."""
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            return MigrationContext.configure(conn).get_current_revision()
    finally:
        engine.dispose()


def head() -> str:
    """The newest revision shipped with this code."""
    rev = ScriptDirectory.from_config(_config("sqlite://")).get_current_head()
    assert rev is not None
    return rev

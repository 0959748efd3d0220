"""Engine construction and time helpers shared by the repository and the migrations."""

from __future__ import annotations

import random
import sqlite3
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import Engine, create_engine, event, make_url
from sqlalchemy.exc import IntegrityError

T = TypeVar("T")

# Several processes (every service of `offramp up`) write one SQLite file: wait for
# the write lock instead of failing with "database is locked".
SQLITE_BUSY_TIMEOUT_MS = 30_000

# Connection execution option asking for `BEGIN IMMEDIATE` on SQLite. A deferred
# transaction that reads and then writes can fail with SQLITE_BUSY at once (no busy
# wait) when another process committed in between; taking the write lock up front
# makes writers queue on busy_timeout instead.
IMMEDIATE = "offramp_sqlite_immediate"


def missing_sqlite_file(url: str) -> Path | None:
    """The file of a SQLite store that does not exist yet, else None (PostgreSQL, memory):
    a command that only reads must say so, since opening it would create an empty file."""
    parsed = make_url(url)
    db = parsed.database
    if parsed.get_backend_name() != "sqlite" or db in (None, "", ":memory:") \
            or db.startswith("file:"):
        return None
    path = Path(db).expanduser()
    return None if path.is_file() else path


def make_engine(url: str, **kwargs: Any) -> Engine:
    """A sync Engine for `url`; SQLite gets WAL, busy_timeout, foreign keys and real BEGINs."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite":
        return create_engine(url, pool_pre_ping=True, **kwargs)
    db = parsed.database
    if db and db != ":memory:" and not db.startswith("file:"):
        Path(db).expanduser().parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(url, **kwargs)

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        # Take transaction control away from the sqlite3 module (its legacy mode skips
        # BEGIN before SELECT and DDL); SQLAlchemy emits BEGIN in _on_begin below.
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        cur.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        _enable_wal(cur)
        cur.execute("PRAGMA synchronous=NORMAL")  # durable enough under WAL, much faster
        cur.execute("PRAGMA foreign_keys=ON")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        immediate = conn.get_execution_options().get(IMMEDIATE, False)
        conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")

    return engine


def _enable_wal(cur: Any) -> None:
    """WAL lets readers and the writer not block each other. Switching a file to WAL
    needs an exclusive lock and fails at once (no busy wait) while another process
    holds the file, so retry; once set, WAL is persistent and this is a cheap read."""
    deadline = time.monotonic() + SQLITE_BUSY_TIMEOUT_MS / 1000
    while True:
        try:
            if cur.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
                cur.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.01)


def utcnow() -> datetime:
    """Now as a naive UTC datetime (the store keeps naive UTC timestamps)."""
    return datetime.now(UTC).replace(tzinfo=None)


def naive_utc(value: datetime) -> datetime:
    """Aware datetimes are converted to UTC; naive ones are taken to be UTC already."""
    if value.tzinfo is None:
        return value
    return value.astimezone(UTC).replace(tzinfo=None)


def retry_unique(fn: Callable[[], T], attempts: int = 20) -> T:
    """Re-run `fn` when a concurrent writer won a unique-constraint race (PostgreSQL;
    SQLite writers are serialised by BEGIN IMMEDIATE and never get here)."""
    for attempt in range(attempts):
        try:
            return fn()
        except IntegrityError:
            if attempt == attempts - 1:
                raise
            time.sleep(random.uniform(0, 0.002 * (attempt + 1)))
    raise AssertionError("unreachable")

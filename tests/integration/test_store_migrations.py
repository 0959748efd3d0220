"""Alembic migrations of the store, on SQLite and (when configured) PostgreSQL."""

from __future__ import annotations

import multiprocessing
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect, text

from services.store import migrate
from services.store.db import make_engine
from services.store.tables import Base

TABLES = {
    "models",
    "artifacts",
    "ramps",
    "exit_configs",
    "exit_profiles",
    "requests",
    "workers",
    "ingested_batches",
    "latency_profiles",
    "ramp_utilities",
    "tuner_state",
    "ramp_heads",
    "batch_profiles",
    "deployment_plans",
    "subnet_profiles",
    "model_repository",
    "pht",
    "helios_decisions",
    "generations",
}


def _tables(url: str) -> set[str]:
    engine = make_engine(url)
    try:
        return set(inspect(engine).get_table_names()) - {"alembic_version"}
    finally:
        engine.dispose()


def test_upgrade_creates_tables_and_indexes(url: str) -> None:
    assert migrate.current(url) is None
    migrate.upgrade(url)
    assert _tables(url) == TABLES
    assert migrate.current(url) == migrate.head() == "0015_generation_decode_ms"
    engine = make_engine(url)
    try:
        insp = inspect(engine)
        indexes = {t: {tuple(i["column_names"]) for i in insp.get_indexes(t)} for t in TABLES}
        assert ("model", "received_at") in indexes["requests"]
        assert ("model", "window_end") in indexes["exit_profiles"]
        assert ("model", "created_at") in indexes["exit_configs"]
        assert ("model", "device") in indexes["latency_profiles"]
        assert ("model", "at") in indexes["ramp_utilities"]
        assert ("model", "created_at") in indexes["ramp_heads"]
        assert ("model", "window_end") in indexes["batch_profiles"]
        assert ("model", "created_at") in indexes["deployment_plans"]
        assert {("model", "received_at"), ("model", "assessment"),
                ("model", "request_id")} <= indexes["generations"]
    finally:
        engine.dispose()


def test_downgrade_then_upgrade_again(url: str) -> None:
    migrate.upgrade(url)
    migrate.downgrade(url, "base")
    assert _tables(url) == set()
    assert migrate.current(url) is None
    migrate.upgrade(url)
    assert _tables(url) == TABLES
    assert migrate.current(url) == migrate.head()


def test_models_match_migrated_schema(url: str) -> None:
    """models.py and the revisions are written separately: they must not drift apart."""
    migrate.upgrade(url)
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            ctx = MigrationContext.configure(conn, opts={"compare_type": True})
            assert compare_metadata(ctx, Base.metadata) == []
    finally:
        engine.dispose()


def test_concurrent_upgrades_all_succeed(url: str) -> None:
    # Every service process may run `upgrade` when it starts; none of them may fail.
    # Spawned, not forked: a fork copies whatever lock another thread of the test process
    # holds at that moment (the migrator's own, logging's), and the child waits on it forever.
    with multiprocessing.get_context("spawn").Pool(3) as pool:
        pool.map(migrate.upgrade, [url] * 3)
    with ThreadPoolExecutor(3) as threads:  # and threads of one process
        list(threads.map(lambda _: migrate.upgrade(url), range(3)))
    assert migrate.current(url) == migrate.head()
    assert _tables(url) == TABLES


def test_sqlite_connection_settings(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'new' / 'folder' / 'offramp.db'}"
    engine = make_engine(url)  # creates the missing folders
    try:
        with engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
            assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
            assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() >= 1000
    finally:
        engine.dispose()


def test_request_ids_become_unique_keeping_the_first_row(url: str) -> None:
    migrate.upgrade(url, "0004_config_heads")
    engine = make_engine(url)
    try:
        with engine.begin() as conn:
            for rid, status in [("a", "ok"), ("a", "deadline_exceeded"), ("", "bad_request"),
                                ("", "bad_request"), ("b", "ok")]:
                conn.execute(text("INSERT INTO requests (request_id, model, received_at, status) "
                                  "VALUES (:r, 'm', '2030-01-01 00:00:00', :s)"),
                             {"r": rid, "s": status})
        migrate.upgrade(url)
        with engine.connect() as conn:
            rows = conn.exec_driver_sql(
                "SELECT request_id, status FROM requests ORDER BY id").fetchall()
        assert [tuple(r) for r in rows] == [("a", "ok"), ("", "bad_request"),
                                            ("", "bad_request"), ("b", "ok")]
    finally:
        engine.dispose()

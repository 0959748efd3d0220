"""Shared fixtures of the integration tests: throw-away store databases (SQLite always,
PostgreSQL when `OFFRAMP_TEST_POSTGRES_URL` is set) and a freshly prepared `tiny`."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, make_url

from services.prepare.pipeline import prepare
from services.store import migrate
from services.store.repository import Store

POSTGRES_ENV = "OFFRAMP_TEST_POSTGRES_URL"


def backend_params() -> list[Any]:
    """pytest params: "sqlite", and "postgresql" (skipped without the env variable)."""
    return [
        "sqlite",
        pytest.param(
            "postgresql",
            marks=[
                pytest.mark.postgres,
                pytest.mark.skipif(
                    not os.environ.get(POSTGRES_ENV), reason=f"{POSTGRES_ENV} unset"
                ),
            ],
        ),
    ]


@contextmanager
def temp_database(backend: str, folder: Path) -> Iterator[str]:
    """Yield the URL of an empty database that is gone afterwards.

    PostgreSQL gets a uniquely named schema (much faster than CREATE DATABASE) that
    the URL selects through `search_path`; it is dropped with everything in it.
    """
    if backend == "sqlite":
        yield f"sqlite:///{folder / 'store' / 'offramp.db'}"
        return
    admin_url = os.environ[POSTGRES_ENV]
    schema = f"offramp_test_{uuid.uuid4().hex[:12]}"
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'CREATE SCHEMA "{schema}"')
        url = make_url(admin_url).update_query_dict({"options": f"-csearch_path={schema}"})
        yield url.render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        admin.dispose()


@pytest.fixture(params=backend_params())
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """An empty store database, on every backend."""
    with temp_database(request.param, tmp_path) as u:
        yield u


@pytest.fixture
def store(url: str) -> Iterator[Store]:
    """A migrated store, on every backend."""
    migrate.upgrade(url)
    s = Store(url)
    yield s
    s.close()


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`tiny` prepared from scratch (not the shared models folder)."""
    return prepare("tiny", tmp_path_factory.mktemp("models"), log=lambda s: None,
                   progress=lambda s: None)

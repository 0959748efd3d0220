"""Throw-away store databases for tests: SQLite always, PostgreSQL when
`OFFRAMP_TEST_POSTGRES_URL` is set. Any test needing a real store can use these:

    @pytest.fixture(params=backend_params())
    def store_url(request, tmp_path):
        with temp_database(request.param, tmp_path) as url:
            yield url
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, make_url

POSTGRES_ENV = "OFFRAMP_TEST_POSTGRES_URL"


def backend_params() -> list[Any]:
    """pytest params: "sqlite", and "postgresql" (skipped without the env variable)."""
    import pytest  # only test runs get here

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

"""Ad-hoc SQL over the store (``offramp db query``): the rows of a query on SQLite or
PostgreSQL alike, with no client but offramp's, in a read-only transaction: a query that
would write fails instead of changing the history the controllers resume from."""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass
from datetime import date, datetime
from typing import Any

from sqlalchemy import make_url
from sqlalchemy.exc import DBAPIError, StatementError

from services.store.db import make_engine, missing_sqlite_file


class QueryError(ValueError):
    """The database refused the query; the message is its own."""


@dataclass(frozen=True)
class QueryResult:
    columns: list[str]
    rows: list[tuple[Any, ...]]


def run_query(url: str, sql: str) -> QueryResult:
    """All rows of ``sql`` (one statement) at ``url``, read only."""
    sqlite = make_url(url).get_backend_name() == "sqlite"
    if (missing := missing_sqlite_file(url)) is not None:
        raise QueryError(f"no store at {missing}: `offramp up` (or `offramp db "
                         "upgrade`) creates it")
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            if sqlite:
                conn.exec_driver_sql("PRAGMA query_only=ON")  # this connection only
            else:
                conn.exec_driver_sql("SET TRANSACTION READ ONLY")
            try:
                # the driver's own SQL: no bind-parameter parsing of ':' or '%' in it
                result = conn.exec_driver_sql(sql)
                out = QueryResult(list(result.keys()), [tuple(r) for r in result]) \
                    if result.returns_rows else QueryResult([], [])
            except (DBAPIError, StatementError) as exc:
                said = str(getattr(exc, "orig", None) or exc).strip()
                if "no such table" in said or "does not exist" in said:
                    said += " (the store's tables: README, The store)"
                raise QueryError(said) from None
            finally:
                conn.rollback()
    finally:
        engine.dispose()
    return out


def _cell(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat(sep=" ")
    if isinstance(value, date):
        return value.isoformat()
    if isinstance(value, bytes | bytearray | memoryview):
        return f"<{len(bytes(value))} bytes>"
    return value


def as_table(res: QueryResult, max_width: int = 60) -> str:
    """Aligned columns, long cells cut to ``max_width`` characters, and a row count."""
    def text(v: Any) -> str:
        s = "NULL" if v is None else str(_cell(v))
        return s if len(s) <= max_width else s[: max_width - 1] + "…"

    cells = [[text(v) for v in row] for row in res.rows]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(res.columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(res.columns, widths, strict=True)),
             "  ".join("-" * w for w in widths)]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in cells]
    lines = [line.rstrip() for line in lines]
    n = len(res.rows)
    return "\n".join(lines + [f"({n} row{'' if n == 1 else 's'})"])


def as_csv(res: QueryResult) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(res.columns)
    w.writerows([[_cell(v) for v in r] for r in res.rows])
    return buf.getvalue().rstrip("\n")


def as_json(res: QueryResult) -> str:
    """One JSON object per row (JSON lines)."""
    return "\n".join(json.dumps({c: _cell(v) for c, v in zip(res.columns, r, strict=True)},
                                default=str) for r in res.rows)

"""``offramp db upgrade|downgrade|current``: the store's migrations; ``offramp db query
SQL``: rows of the store, read only, on SQLite or PostgreSQL alike."""

from __future__ import annotations

import argparse
import sys

from services.common import config as config_mod


def register(sub: argparse._SubParsersAction) -> None:
    db = sub.add_parser("db", help="store migrations and read-only SQL queries")
    db.add_argument("action", choices=["upgrade", "downgrade", "current", "query"])
    db.add_argument("sql", nargs="?", help="query: one SQL statement (- reads it from stdin)")
    db.add_argument("--format", choices=["table", "csv", "json"], default="table",
                    help="query output: aligned columns, CSV, or one JSON object per row")
    db.add_argument("--revision", help="upgrade/downgrade: the target (default head / one back)")
    db.add_argument("--url", help="database URL (default: $OFFRAMP_DATABASE_URL)")
    db.set_defaults(fn=run)


def run(args: argparse.Namespace) -> int:
    from services.store import migrate
    from services.store.db import missing_sqlite_file

    cfg = config_mod.load()
    url = args.url or cfg.database_url
    if args.action == "query":
        return _query(url, args.sql, args.format)
    if args.sql is not None:
        raise SystemExit(f"offramp db {args.action} takes no SQL")
    if args.action != "upgrade" and (missing := missing_sqlite_file(url)) is not None:
        print(f"no store at {missing} yet: `offramp up` (or `offramp db upgrade`) creates it")
        return 0 if args.action == "current" else 2
    if args.action == "upgrade":
        migrate.upgrade(url, args.revision or "head")
    elif args.action == "downgrade":
        migrate.downgrade(url, args.revision or "-1")
    print(migrate.current(url) or "(empty)")
    return 0


def _query(url: str, sql: str | None, fmt: str) -> int:
    from services.store.query import QueryError, as_csv, as_json, as_table, run_query

    if sql == "-":
        sql = sys.stdin.read()
    if not sql or not sql.strip():
        print("error: offramp db query needs SQL, e.g. offramp db query "
              "\"SELECT model, version, reason FROM exit_configs\"", file=sys.stderr)
        return 2
    try:
        res = run_query(url, sql)
    except QueryError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    out = {"table": as_table, "csv": as_csv, "json": as_json}[fmt](res)
    if out:
        print(out)
    return 0

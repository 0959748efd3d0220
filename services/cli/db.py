"""``offramp db upgrade|downgrade|current``: the store's migrations."""

from __future__ import annotations

import argparse

from services.common import config as config_mod


def register(sub: argparse._SubParsersAction) -> None:
    db = sub.add_parser("db", help="store migrations")
    db.add_argument("action", choices=["upgrade", "downgrade", "current"])
    db.add_argument("--revision")
    db.add_argument("--url", help="database URL (default: $OFFRAMP_DATABASE_URL)")
    db.set_defaults(fn=run)


def run(args: argparse.Namespace) -> int:
    from services.store import migrate

    cfg = config_mod.load()
    url = args.url or cfg.database_url
    if args.action == "upgrade":
        migrate.upgrade(url, args.revision or "head")
    elif args.action == "downgrade":
        migrate.downgrade(url, args.revision or "-1")
    print(migrate.current(url) or "(empty)")
    return 0

"""``offramp exit-config MODEL``: store a new exit-config version and publish it to the workers
(pins thresholds and active ramps by hand); with no change asked, show the one in force."""

from __future__ import annotations

import argparse

from services.common import config as config_mod
from services.common.credentials import server_url

DEFAULT_REASON = "set by hand (offramp exit-config)"


def register(sub: argparse._SubParsersAction) -> None:
    ec = sub.add_parser("exit-config", help="store and publish a new exit config version "
                        "(without options: show the one in force)")
    ec.add_argument("model")
    ec.add_argument("--threshold", type=float, help="one threshold for every active ramp")
    ec.add_argument("--set", action="append", default=[], metavar="RAMP=THRESHOLD",
                    help="one ramp's threshold (repeatable; over --threshold for its ramp)")
    ec.add_argument("--active", help="all, none (vanilla), caps (depth caps for a variant "
                    "router policy: the cheapest trained ramp and two spread over the "
                    "model's cost; with --mode compute) or a comma list of ramps (default: "
                    "the active set in force); a set over the ramp budget is stored with a "
                    "note of its cost")
    ec.add_argument("--head", action="append", default=[], metavar="RAMP=VERSION",
                    help="serve this stored head version of a ramp (0: the prepared head); "
                    "rolls back a refit. Later refits must beat it to replace it")
    ec.add_argument("--mode", choices=("latency", "compute"),
                    help="latency: exited samples run on to the end (Apparate); compute: they "
                    "leave the batch (E3). Default: the mode in force")
    ec.add_argument("--reason", default=DEFAULT_REASON,
                    help="why, stored with the new version")
    ec.set_defaults(fn=run)


def run(args: argparse.Namespace) -> int:
    from services.launcher.exit_config import set_exit_config
    from services.store.db import missing_sqlite_file

    cfg = config_mod.load()
    if (missing := missing_sqlite_file(cfg.database_url)) is not None:
        print(f"error: no store at {missing} yet: `offramp up` (or `offramp prepare "
              f"{args.model}`) creates it")
        return 2
    if args.threshold is None and not args.set and args.active is None and not args.head \
            and args.mode is None:
        if args.reason != DEFAULT_REASON:
            print("error: --reason says why a change is made; pass the change too "
                  "(--threshold, --set, --active, --head or --mode)")
            return 2
        return show(cfg, args.model)
    return set_exit_config(cfg, server_url(cfg), args.model, args.threshold, args.set,
                           args.active, args.reason, args.head, args.mode)


def show(cfg: config_mod.Config, model: str) -> int:
    """The exit config in force for ``model``, as stored (nothing is written)."""
    from services.store.repository import Store

    store = Store(cfg.database_url)
    try:
        row = store.latest_exit_config(model)
    finally:
        store.close()
    if row is None:
        print(f"error: {model!r} has no exit config (run `offramp up` or `offramp prepare`)")
        return 2
    print(f"exit config v{row.version} for {model} ({row.mode} mode), set "
          f"{row.created_at:%Y-%m-%d %H:%M:%S} UTC: {row.reason}\n"
          f"  active={row.active} thresholds={row.thresholds} heads={row.heads or 'prepared'}")
    return 0

"""``offramp exit-config MODEL``: store a new exit-config version and publish it to the workers
(pins thresholds and active ramps by hand)."""

from __future__ import annotations

import argparse

from services.common import config as config_mod
from services.common.credentials import server_url


def register(sub: argparse._SubParsersAction) -> None:
    ec = sub.add_parser("exit-config", help="store and publish a new exit config version")
    ec.add_argument("model")
    ec.add_argument("--threshold", type=float, help="one threshold for every active ramp")
    ec.add_argument("--set", action="append", default=[], help="RAMP=THRESHOLD")
    ec.add_argument("--active", help="comma list of active ramps (default: all; none = vanilla)")
    ec.add_argument("--head", action="append", default=[], metavar="RAMP=VERSION",
                    help="serve this stored head version of a ramp (0: the prepared head); "
                    "rolls back a refit. Later refits must beat it to replace it")
    ec.add_argument("--mode", choices=("latency", "compute"),
                    help="latency: exited samples run on to the end (Apparate); compute: they "
                    "leave the batch (E3). Default: the mode in force")
    ec.add_argument("--reason", default="set by hand (offramp exit-config)")
    ec.set_defaults(fn=run)


def run(args: argparse.Namespace) -> int:
    from services.launcher.exit_config import set_exit_config

    cfg = config_mod.load()
    return set_exit_config(cfg, server_url(cfg), args.model, args.threshold, args.set,
                           args.active, args.reason, args.head, args.mode)

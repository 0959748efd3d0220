"""``offramp credentials``: the NATS URL a role connects with, and the server-side
permissions for a NATS server the user runs (``schemas/roles.py``)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from schemas.roles import ROLES
from services.common import config as config_mod
from services.common.credentials import (
    CredentialsError,
    credentials_file,
    home_file,
    login_for,
    server_url,
    with_login,
)


def register(sub: argparse._SubParsersAction) -> None:
    cr = sub.add_parser("credentials", help="a role's NATS URL; a server's permission config",
                        description="Print the NATS URL (with user and password) that ROLE "
                        "connects with, or write the authorization block a nats-server needs "
                        "to enforce every role's permissions.")
    cr.add_argument("role", nargs="?", choices=sorted(ROLES), help="the role whose URL to print")
    cr.add_argument("--name", metavar="APP",
                    help="client only: a login of its own for application APP (created if "
                    "missing; a running `offramp up` takes it at once), so no other "
                    "application can read its replies")
    cr.add_argument("--url", help="server to name in the URL (default: OFFRAMP_NATS_URL, else "
                    "the server `offramp up` started)")
    cr.add_argument("--server-config", metavar="FILE",
                    help="write the nats-server `authorization` block for every role to FILE "
                    "(include it from the server config); creates missing credentials in "
                    "OFFRAMP_NATS_CREDENTIALS (else $OFFRAMP_HOME/nats/credentials.json)")
    cr.set_defaults(fn=run)


def run(args: argparse.Namespace) -> int:
    cfg = config_mod.load()
    if args.server_config:
        return write_server_config(cfg, Path(args.server_config))
    if not args.role:
        print("error: name a role or give --server-config", file=sys.stderr)
        return 2
    if args.name and args.role != "client":
        print("error: --name is for client logins", file=sys.stderr)
        return 2
    try:
        login = app_login(cfg, args.name) if args.name else login_for(cfg, args.role)
    except CredentialsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if login is None:
        print(f"error: no credentials at {home_file(cfg.home)}: `offramp up` creates them, "
              f"`offramp credentials --server-config FILE` too", file=sys.stderr)
        return 1
    print(with_login(args.url or server_url(cfg), login))
    return 0


def app_login(cfg: config_mod.Config, name: str):
    from services.launcher.nats_auth import ensure_app_login

    return ensure_app_login(credentials_file(cfg), name)


def write_server_config(cfg: config_mod.Config, out: Path) -> int:
    from services.launcher.nats_auth import authorization_block, ensure_logins

    path = credentials_file(cfg)
    logins = ensure_logins(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(authorization_block(logins))
    out.chmod(0o600)
    print(f"wrote the authorization block for {', '.join(sorted(logins))} to {out}; "
          f"credentials in {path}", file=sys.stderr)
    return 0

"""Per-role NATS credentials and the server ``authorization`` block that enforces
``schemas/roles.py``: what ``offramp up`` gives its embedded server, and what
``offramp credentials --server-config`` writes for a server the user runs."""

from __future__ import annotations

import json
import re
import secrets
from pathlib import Path

import bcrypt

from schemas.roles import ROLES, Permissions, inbox_prefix
from services.common.credentials import CredentialsError, Login, read, write

# The passwords are 192-bit random tokens, so the hash's work factor adds no protection
# against guessing; a low cost keeps the server's check cheap when every service
# reconnects at once after a restart (cost 11, nats' default, takes ~0.2 s per check here).
BCRYPT_COST = 6


def ensure_logins(path: Path) -> dict[str, Login]:
    """The credentials at ``path``, with a fresh login added for every role that lacks one
    (existing ones are kept, so URLs handed out stay valid across restarts)."""
    try:
        logins = read(path)
    except CredentialsError:
        if path.exists():
            raise
        logins = {}
    missing = [role for role in ROLES if role not in logins]
    if missing:
        for role in missing:
            logins[role] = Login(role, secrets.token_urlsafe(24))
        write(path, logins)
    return logins


def _allow(subjects: tuple[str, ...]) -> dict:
    # an empty allow list means "everything" to nats-server: deny all instead
    return {"allow": list(subjects)} if subjects else {"deny": [">"]}


def user_entry(login: Login, perms: Permissions) -> dict:
    entry = {
        "user": login.user,
        "password": bcrypt.hashpw(login.password.encode(), bcrypt.gensalt(BCRYPT_COST)).decode(),
        "permissions": {
            "publish": _allow(perms.publish),
            "subscribe": _allow((*perms.subscribe, f"{inbox_prefix(login.user)}.>")),
        },
    }
    if perms.responds:
        entry["permissions"]["allow_responses"] = True
    return entry


APP_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


def ensure_app_login(path: Path, name: str) -> Login:
    """A client login of its own for application ``name`` (user ``client-<name>``, stored
    under ``client:<name>``): the client role's permissions, and an inbox no other
    application can read."""
    if not APP_NAME.fullmatch(name):
        raise CredentialsError(f"application name {name!r}: use 1-64 letters, digits, - or _")
    logins = ensure_logins(path)
    key = f"client:{name}"
    if key not in logins:
        logins[key] = Login(f"client-{name}", secrets.token_urlsafe(24))
        write(path, logins)
    return logins[key]


def authorization_block(logins: dict[str, Login]) -> str:
    """The server config's ``authorization`` block: one user per role and per named
    application (``client:<name>``, the client role's permissions), no anonymous access
    (nats-server refuses a connection without a listed user once users are configured)."""
    users = [user_entry(login, ROLES[key.partition(":")[0]])
             for key, login in sorted(logins.items()) if key.partition(":")[0] in ROLES]
    # nats-server's config format reads JSON values; the password hashes need its quoting.
    return "authorization " + json.dumps({"users": users}, indent=1) + "\n"

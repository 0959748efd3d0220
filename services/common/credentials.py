"""Each role's NATS login: where services and the CLI find the user and password their role
connects with (``schemas/roles.py`` says what each role may do).

The credentials file is JSON, ``{"roles": {ROLE: {"user": ..., "password": ...}}}``, readable
only by its owner. ``offramp up`` writes ``$OFFRAMP_HOME/nats/credentials.json``; for a server
the user runs, ``OFFRAMP_NATS_CREDENTIALS`` names the file (it may hold only the roles that
host runs). A URL that carries ``user:password@`` wins over both.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from services.common.config import Config


class CredentialsError(RuntimeError):
    """The credentials file is missing, unreadable, or lacks the role asked for."""


@dataclass(frozen=True)
class Login:
    user: str
    password: str


def home_file(home: Path) -> Path:
    """Where ``offramp up`` keeps the credentials it generated."""
    return home / "nats" / "credentials.json"


def credentials_file(cfg: Config) -> Path:
    """The credentials this configuration uses: ``OFFRAMP_NATS_CREDENTIALS``, else the file
    in ``OFFRAMP_HOME``."""
    return cfg.nats_credentials or home_file(cfg.home)


DEFAULT_URL = "nats://127.0.0.1:4222"


def server_url_file(home: Path) -> Path:
    """Where ``offramp up`` notes the URL of the server it started, for the CLI."""
    return home / "nats" / "url"


def server_url(cfg: Config) -> str:
    """The server to connect to: ``OFFRAMP_NATS_URL``, else the one ``offramp up`` started
    with this ``OFFRAMP_HOME``, else a local one."""
    if cfg.nats_url:
        return cfg.nats_url
    noted = server_url_file(cfg.home)
    return noted.read_text().strip() if noted.exists() else DEFAULT_URL


def read(path: Path) -> dict[str, Login]:
    try:
        roles = json.loads(path.read_text())["roles"]
        return {role: Login(str(v["user"]), str(v["password"])) for role, v in roles.items()}
    except FileNotFoundError:
        raise CredentialsError(f"no credentials file at {path}") from None
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CredentialsError(f"unreadable credentials file {path}: {exc!r}") from None


def write(path: Path, logins: dict[str, Login]) -> None:
    """Write atomically with mode 0600: the file holds secrets."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({"roles": {r: {"user": v.user, "password": v.password}
                             for r, v in sorted(logins.items())}}, f, indent=1)
    os.replace(tmp, path)


def login_for(cfg: Config, role: str) -> Login | None:
    """The login ``role`` connects with: from ``OFFRAMP_NATS_CREDENTIALS`` (which must then
    hold it), else from the file ``offramp up`` wrote, else none (an open server)."""
    if cfg.nats_credentials is not None:
        logins = read(cfg.nats_credentials)
        if role not in logins:
            raise CredentialsError(f"{cfg.nats_credentials} has no credentials for role {role!r} "
                                   f"(it has: {', '.join(sorted(logins)) or 'none'})")
        return logins[role]
    path = home_file(cfg.home)
    if not path.exists():
        return None
    return read(path).get(role)


def url_user(url: str) -> str | None:
    """The user a ``nats://user:password@host`` URL logs in as, if any."""
    return urlsplit(url).username


def with_login(url: str, login: Login) -> str:
    """``url`` carrying ``login``, for handing to a NATS client of any language."""
    parts = urlsplit(url)
    host = parts.hostname or "127.0.0.1"
    netloc = f"{login.user}:{login.password}@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit((parts.scheme or "nats", netloc, parts.path, parts.query, parts.fragment))

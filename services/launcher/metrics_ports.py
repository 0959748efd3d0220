"""The ports on which the services of ``offramp up`` serve their Prometheus metrics.

The supervisor chooses one per child and keeps it across restarts, so a scrape target
stays put; it writes them to ``$OFFRAMP_HOME/metrics-ports.json``, where ``offramp
status`` (another process, perhaps another shell) finds them. A file is enough: only
processes on this host can reach a port bound to 127.0.0.1 anyway, and the supervisor's
pid in it tells a live stack from one that was killed before it could remove the file.
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from typing import Any

from services.common.config import ConfigError

FILE = "metrics-ports.json"
ANY_ADDRESS = ("0.0.0.0", "::", "")


def assign(names: list[str], base: int | None, bind: str) -> dict[str, int]:
    """A port per service name: consecutive from ``base`` in the given order when the user
    set ``OFFRAMP_METRICS_PORT``, else whatever the OS has free."""
    if base:
        if base + len(names) - 1 > 65535:
            raise ConfigError(f"OFFRAMP_METRICS_PORT={base}: {len(names)} services need ports "
                              f"up to {base + len(names) - 1}, past 65535")
        return {name: base + i for i, name in enumerate(names)}
    return dict(zip(names, free_ports(len(names), bind), strict=True))


def free_ports(n: int, bind: str) -> list[int]:
    """``n`` distinct ports free on ``bind`` now (all held open until every one is chosen).
    A port may be taken again before its service binds it; that service then logs so and
    serves without metrics."""
    family = socket.AF_INET6 if ":" in bind else socket.AF_INET
    held: list[socket.socket] = []
    try:
        for _ in range(n):
            s = socket.socket(family, socket.SOCK_STREAM)
            held.append(s)
            s.bind((bind, 0))
        return [s.getsockname()[1] for s in held]
    finally:
        for s in held:
            s.close()


def url(bind: str, port: int) -> str:
    host = "127.0.0.1" if bind in ANY_ADDRESS else (f"[{bind}]" if ":" in bind else bind)
    return f"http://{host}:{port}/metrics"


def write(home: Path, ports: dict[str, int], bind: str, pid: int | None = None) -> None:
    """Record ``ports`` for the stack this process (``pid``) supervises; replaced whole, so
    a reader never sees half a file."""
    path = home / FILE
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"pid": pid or os.getpid(), "bind": bind, "ports": ports}))
    tmp.replace(path)


def read(home: Path) -> dict[str, Any] | None:
    """What a live ``offramp up`` recorded: {"pid", "bind", "ports"}; None when there is no
    such file or its supervisor is gone."""
    try:
        data = json.loads((home / FILE).read_text())
        pid = int(data["pid"])
        ports = {str(k): int(v) for k, v in data["ports"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    if not alive(pid):
        return None
    return {"pid": pid, "bind": str(data.get("bind", "127.0.0.1")), "ports": ports}


def remove(home: Path, pid: int | None = None) -> None:
    """Forget the ports when the stack stops (only this supervisor's own file)."""
    path = home / FILE
    try:
        if int(json.loads(path.read_text())["pid"]) == (pid or os.getpid()):
            path.unlink()
    except (OSError, ValueError, KeyError, TypeError):
        pass


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True

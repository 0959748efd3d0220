"""A service tells the launcher that started it that it is ready.

`offramp up` must not report ready while a controller is still starting: the tuner takes
sample telemetry on plain NATS, so what workers publish before it subscribes never reaches
it (on a slow machine, a client's whole first burst). The router can say when every stage
has a worker, not when the controllers listen. So the launcher names a file per child in
``OFFRAMP_READY_FILE`` (:func:`ready_file`), and each service writes it once it has
subscribed. docker-compose.yml names one per container for its healthcheck; a service
started by hand without the variable writes nothing.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

READY_FILE_ENV = "OFFRAMP_READY_FILE"


def ready_file(home: Path, name: str) -> Path:
    """Where the process ``name`` about to start under ``home`` says it is ready; a file an
    earlier one left is removed."""
    path = home / "ready" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    return path


def mark_ready() -> None:
    """Say this process is ready, if whoever started it asked (``OFFRAMP_READY_FILE``)."""
    path = os.environ.get(READY_FILE_ENV)
    if path:
        Path(path).write_text(f"{os.getpid()}\n")


def is_ready(path: Path, pid: int) -> bool:
    """Whether the process ``pid`` marked ``path`` (an earlier run's file does not count)."""
    try:
        return path.read_text().strip() == str(pid)
    except OSError:
        return False


def await_ready(path: Path, proc: subprocess.Popen, timeout_s: float) -> None:
    """Block until ``proc`` (started with ``OFFRAMP_READY_FILE=path``) says it is ready.
    RuntimeError when it exits first or takes longer than ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not is_ready(path, proc.pid):
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args} exited with code {proc.returncode} before it "
                               "was ready")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{proc.args} not ready within {timeout_s:.0f} s")
        time.sleep(0.05)

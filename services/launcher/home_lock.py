"""One stack per state folder. ``offramp up``, the demo and the live benches all write the
server URL, login, ready and metrics files of ``OFFRAMP_HOME`` and the exit configs of its
store: a second stack there would leave the CLI talking to whichever started last and mix
both stacks' history. The lock is the kernel's (``flock``), so a stack that dies releases
it with no stale file to clean up."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

LOCK_FILE = "stack.lock"


class StackRunning(RuntimeError):
    """Another stack holds the state folder."""


class HomeLock:
    def __init__(self, home: Path) -> None:
        self.path = Path(home) / LOCK_FILE
        self.file = None

    @property
    def held(self) -> bool:
        return self.file is not None

    def acquire(self, what: str) -> None:
        """Hold the folder for this process (``what``: how to name it to a second stack)."""
        if self.held:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        f = open(self.path, "a+", encoding="utf-8")  # noqa: SIM115 - held until release
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            holder = f.read().strip() or "another process"
            f.close()
            raise StackRunning(
                f"a stack already runs with its state in {self.path.parent} ({holder}): stop "
                "it first, or give this one another folder (OFFRAMP_HOME)") from None
        f.seek(0)
        f.truncate()
        f.write(f"{what}, pid {os.getpid()}\n")
        f.flush()
        self.file = f

    def release(self) -> None:
        if self.file is not None:
            self.file.close()  # closing drops the flock
            self.file = None

"""Structured logging: one line per event, ``key=value`` fields, service name first."""

from __future__ import annotations

import logging
import sys

_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"


def setup(service: str, level: str = "INFO") -> logging.Logger:
    root = logging.getLogger()
    if not root.handlers:
        root.addHandler(logging.StreamHandler(sys.stderr))
    for handler in root.handlers:  # also the CLI's basicConfig one: every line gets its time
        handler.setFormatter(logging.Formatter(_FORMAT))
    root.setLevel(level)
    # nats-py logs every reconnect attempt at ERROR; our callbacks report them once.
    logging.getLogger("nats").setLevel(logging.CRITICAL)
    logging.getLogger("alembic").setLevel(logging.WARNING)
    return logging.getLogger(f"offramp.{service}")


class Repeats:
    """Says when an event that may repeat many times a second (a reconnect loop's error)
    is worth a line: the first time, when it changes, and every ``every_s`` seconds while
    it persists; ``hidden`` counts the lines held back since the last one."""

    def __init__(self, every_s: float = 30.0) -> None:
        self.every_s = every_s
        self.last: str | None = None
        self.at = 0.0
        self.hidden = 0

    def due(self, what: str, now: float) -> bool:
        if what == self.last and now - self.at < self.every_s:
            self.hidden += 1
            return False
        self.last, self.at = what, now
        return True

    def take_hidden(self) -> int:
        n, self.hidden = self.hidden, 0
        return n


def kv(**fields: object) -> str:
    return " ".join(f"{k}={v}" for k, v in fields.items())

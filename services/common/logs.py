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


def kv(**fields: object) -> str:
    return " ".join(f"{k}={v}" for k, v in fields.items())

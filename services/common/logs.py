"""Structured logging: one line per event, ``key=value`` fields, service name first."""

from __future__ import annotations

import logging
import sys

_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"


def setup(service: str, level: str = "INFO") -> logging.Logger:
    root = logging.getLogger()
    if not root.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter(_FORMAT))
        root.addHandler(handler)
    root.setLevel(level)
    # nats-py logs every reconnect attempt at ERROR; our callbacks report them once.
    logging.getLogger("nats").setLevel(logging.CRITICAL)
    logging.getLogger("alembic").setLevel(logging.WARNING)
    return logging.getLogger(f"offramp.{service}")


def kv(**fields: object) -> str:
    return " ".join(f"{k}={v}" for k, v in fields.items())

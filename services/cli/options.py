"""What several subcommands share: the configuration with ``--models`` applied, and
argument types that refuse impossible numbers at parse time (argparse then names the option
and exits 2, before any work starts)."""

from __future__ import annotations

import argparse
from dataclasses import replace

from services.common import config as config_mod


def config_with_models(models: str | None) -> config_mod.Config:
    """The configuration, serving ``models`` (a comma list) when given."""
    cfg = config_mod.load()
    if models:
        cfg = replace(cfg, models=tuple(m.strip() for m in models.split(",") if m.strip()))
    return cfg


def non_negative_int(text: str) -> int:
    value = _number(text, int)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def positive_int(text: str) -> int:
    value = _number(text, int)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def non_negative_float(text: str) -> float:
    value = _number(text, float)
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text}")
    return value


def loss_share(text: str) -> float:
    """A tolerated loss of agreement: a share in [0, 1)."""
    value = _number(text, float)
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"is a share of answers in [0, 1) (0.01 = 1 %), "
                                         f"got {text}")
    return value


def _number(text: str, kind: type) -> int | float:
    try:
        return kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not {'an integer' if kind is int else 'a number'}: "
                                         f"{text!r}") from None

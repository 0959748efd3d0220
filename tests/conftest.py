"""Shared fixtures of integration and end-to-end tests: the zoo models, prepared once.
(Unit tests may not use them: tests/unit/conftest.py.)"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# Where dev.sh prepared the zoo: the same default as services.common.config.
MODELS_DIR = Path(os.environ.get("OFFRAMP_MODELS_DIR")
                  or Path(os.environ.get("OFFRAMP_HOME") or Path.home() / ".offramp") / "models")


@pytest.fixture(scope="session")
def models_dir() -> Path:
    """Zoo models prepared once (idempotent: reuses artifacts by hash; dev.sh prepares them)."""
    from services.prepare.pipeline import prepare  # unit runs load this file too: no torch

    for name in ("tiny", "efficientnet-lite0"):
        prepare(name, MODELS_DIR, log=lambda m: None)
    return MODELS_DIR


@pytest.fixture(scope="session")
def zoo_dir(models_dir) -> Path:
    """Every zoo model prepared (dev.sh prepares them all; idempotent)."""
    from services.prepare.pipeline import ZOO, prepare

    for name in ZOO:
        prepare(name, MODELS_DIR, log=lambda m: None)
    return MODELS_DIR

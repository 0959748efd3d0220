"""Cached trained weights (the zoo's trained models and supernets), written atomically."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import torch
from torch import nn


def save_state(module: nn.Module, path: Path) -> None:
    """``module``'s state dict to ``path``, all at once: concurrent builders never read a
    partial file, and a crash leaves no half-written one behind."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name, suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        torch.save(module.state_dict(), tmp)
        os.chmod(tmp, 0o644)  # mkstemp makes it 0600
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)

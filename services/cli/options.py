"""What several subcommands share: the configuration with ``--models`` applied."""

from __future__ import annotations

from dataclasses import replace

from services.common import config as config_mod


def config_with_models(models: str | None) -> config_mod.Config:
    """The configuration, serving ``models`` (a comma list) when given."""
    cfg = config_mod.load()
    if models:
        cfg = replace(cfg, models=tuple(m.strip() for m in models.split(",") if m.strip()))
    return cfg


"""Which of a model's feasible ramp sites ``offramp prepare`` turns into ramps."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SiteChoice:
    """Which candidate sites become ramps: ``keep`` restricts (tensor names or ordinals of
    the feasible sites), ``max_ramps`` thins evenly; 0 = the source's default."""

    keep: tuple[str, ...] = ()
    max_ramps: int = 0

"""Summary statistics every reporter shares (pure)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def percentile(values: Sequence[float] | np.ndarray, q: float) -> float | None:
    """The ``q``-th percentile (0-100, linear interpolation between closest ranks, numpy's
    default) of ``values``; None when there are none."""
    return float(np.percentile(values, q)) if len(values) else None


Z95 = 1.959964  # two-sided 95 %


def wilson_interval(successes: int, n: int, z: float = Z95) -> tuple[float, float] | None:
    """Wilson score interval of a binomial proportion (sound at small ``n`` and at 0 or
    ``n`` successes, where the normal approximation collapses to a point); None for n = 0."""
    if n <= 0:
        return None
    if not 0 <= successes <= n:
        raise ValueError(f"successes must lie in [0, {n}], got {successes}")
    p = successes / n
    z2 = z * z
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z * np.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    return max(0.0, float(centre - half)), min(1.0, float(centre + half))

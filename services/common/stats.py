"""Summary statistics every reporter shares (pure)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def percentile(values: Sequence[float] | np.ndarray, q: float) -> float | None:
    """The ``q``-th percentile (0-100, linear interpolation between closest ranks, numpy's
    default) of ``values``; None when there are none."""
    return float(np.percentile(values, q)) if len(values) else None

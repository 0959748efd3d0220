"""The Wilson score interval (services.common.stats.wilson_interval)."""

from __future__ import annotations

import pytest

from services.common.stats import wilson_interval


def test_known_values_and_edges() -> None:
    lo, hi = wilson_interval(8, 10)
    assert lo == pytest.approx(0.4902, abs=1e-4) and hi == pytest.approx(0.9433, abs=1e-4)
    lo, hi = wilson_interval(16, 16)  # all agree: still an interval, not a point
    assert hi == 1.0 and lo == pytest.approx(0.8064, abs=1e-4)
    assert wilson_interval(0, 0) is None
    with pytest.raises(ValueError):
        wilson_interval(3, 2)


def test_it_narrows_with_samples() -> None:
    widths = [hi - lo for lo, hi in (wilson_interval(n * 99 // 100, n) for n in (100, 1000, 10000))]
    assert widths[0] > widths[1] > widths[2]

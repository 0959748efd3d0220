"""Which samples' ramp features a worker publishes (services.worker.feature_sampling)."""

from __future__ import annotations

import pytest

from services.worker.feature_sampling import FeatureSampler

IDS = [f"req-{i}" for i in range(2000)]


def test_about_the_rate_and_the_same_ids_every_time():
    s = FeatureSampler(0.25, 1e9)
    rows = s.rows(IDS, 0.0)
    assert 0.21 < len(rows) / len(IDS) < 0.29
    assert list(FeatureSampler(0.25, 1e9).rows(IDS, 5.0)) == list(rows)
    assert set(FeatureSampler(0.5, 1e9).rows(IDS, 0.0)) >= set(rows)  # nested shares


def test_the_rate_limit_caps_a_burst_and_refills():
    s = FeatureSampler(1.0, 100)
    assert len(s.rows(IDS[:500], 0.0)) == 100 and s.dropped == 400
    assert len(s.rows(IDS[:500], 0.0)) == 0
    assert len(s.rows(IDS[:500], 0.5)) == 50  # half a second refills half the bucket
    assert len(s.rows(IDS[:500], 100.0)) == 100  # never more than one second's worth


def test_off_and_bad_settings():
    assert not FeatureSampler(0.0, 100).enabled and len(FeatureSampler(0, 100).rows(IDS, 0)) == 0
    assert not FeatureSampler(0.5, 0).enabled
    with pytest.raises(ValueError):
        FeatureSampler(1.5, 10)

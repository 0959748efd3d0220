"""Which samples' ramp features a worker publishes (services.worker.feature_sampling)."""

from __future__ import annotations

import pytest

from services.worker.feature_sampling import FeatureSampler

BATCHES = [f"batch-{i}" for i in range(2000)]


def test_about_the_rate_of_batches_all_their_rows_and_the_same_batches_every_time():
    s = FeatureSampler(0.25, 1e9)
    got = [len(s.rows(b, 4, 0.0)) for b in BATCHES]
    assert set(got) == {0, 4}  # a batch has its features computed for every row or none
    assert 0.21 < sum(1 for g in got if g) / len(BATCHES) < 0.29
    again = FeatureSampler(0.25, 1e9)
    assert [len(again.rows(b, 4, 5.0)) for b in BATCHES] == got
    wider = FeatureSampler(0.5, 1e9)
    assert all(len(wider.rows(b, 4, 0.0)) for b, g in zip(BATCHES, got) if g)  # nested shares


def test_the_rate_limit_caps_a_burst_and_refills():
    s = FeatureSampler(1.0, 100)
    assert len(s.rows("a", 500, 0.0)) == 100 and s.dropped == 400
    assert len(s.rows("b", 500, 0.0)) == 0
    assert len(s.rows("c", 500, 0.5)) == 50  # half a second refills half the bucket
    assert len(s.rows("d", 500, 100.0)) == 100  # never more than one second's worth


def test_off_and_bad_settings():
    assert not FeatureSampler(0.0, 100).enabled and len(FeatureSampler(0, 100).rows("a", 4, 0)) == 0
    assert not FeatureSampler(0.5, 0).enabled
    with pytest.raises(ValueError):
        FeatureSampler(1.5, 10)

"""Which samples' ramp features a worker publishes (services.worker.feature_sampling)."""

from __future__ import annotations

import pytest

from services.worker.feature_sampling import MAX_CREDIT, FeatureSampler

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


def _serve(s: FeatureSampler, batches: range, exit_share: float, rows: int = 1) -> int:
    """Offer ``batches``; every batch has ``exit_share`` of its rows answered early."""
    taken = 0
    for i in batches:
        taken += len(s.rows(f"batch-{i}", rows, 0.0))
        s.exited(rows, round(exit_share * rows))
    return taken


def test_boost_samples_faster_while_little_exits_and_banks_while_most_exit():
    s = FeatureSampler(0.25, 1e9, boost=2.0)
    fast = _serve(s, range(400), exit_share=0.0)    # a scene no head knows yet
    assert 0.42 < fast / 400 < 0.58                  # twice the rate, from the start credit
    slow = _serve(s, range(400, 2400), exit_share=1.0)  # the loop has learned it
    assert 0.09 < slow / 2000 < 0.16                 # half the rate, banking the rest
    assert s.credit > 0.1 * 2000                      # banked for the next scene


def test_boost_never_spends_more_than_the_budget():
    s = FeatureSampler(0.25, 1e9, boost=4.0)
    n = 20000
    taken = _serve(s, range(n), exit_share=0.0, rows=4)  # never exits: always boosting
    assert abs(taken - 0.25 * 4 * n) <= MAX_CREDIT   # the long-run share stays the rate


def test_a_batch_larger_than_the_credit_is_still_sampled_at_the_rate():
    s = FeatureSampler(0.25, 1e9, boost=2.0)
    taken = _serve(s, range(400), exit_share=0.0, rows=600)  # never coverable by credit
    assert 0.18 < taken / (400 * 600) < 0.32


def test_without_boost_exits_do_not_change_what_is_sampled():
    plain, told = FeatureSampler(0.25, 1e9), FeatureSampler(0.25, 1e9)
    for i, b in enumerate(BATCHES):
        assert len(plain.rows(b, 2, 0.0)) == len(told.rows(b, 2, 0.0))
        told.exited(2, 2 * (i % 2))
    every = FeatureSampler(1.0, 1e9, boost=2.0)
    assert _serve(every, range(500), exit_share=1.0) == 500  # nothing to bank at rate 1
    with pytest.raises(ValueError, match="boost"):
        FeatureSampler(0.25, 10, boost=0.5)

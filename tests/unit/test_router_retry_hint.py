"""The retry hint of an ``overloaded`` reply and the router's check of it, with
hand-computed expectations."""

from __future__ import annotations

import pytest

from services.router import retry_hint as adm


@pytest.mark.parametrize("service_ms,queued,max_batch,expected", [
    (20.0, 64, 16, 80.0),     # 64 queued = 4 batches of 20 ms
    (20.0, 64, 0, 1280.0),    # a batch of 0 counts as 1
    (20.0, 10, 3, 66.7),      # 200/3 = 66.666.. to 0.1 ms
    (0.5, 1, 1, 1.0),         # floor at 1 ms: never "retry right now"
    (1.0, 1, 1, 1.0),         # exactly the floor
    (0.0, 0, 8, 1.0),
])
def test_retry_after_ms(service_ms, queued, max_batch, expected):
    assert adm.retry_after_ms(service_ms, queued, max_batch) == expected


def test_retry_after_from_the_recent_drain_rate():
    # two workers pipelining batches of 16 in 20 ms each: 1,600 requests/s, far more than
    # one batch's dispatch-to-release time says (16 per 20 ms = 800/s)
    drained = adm.DrainRate()
    for i in range(300):  # 3 s of releases; the window keeps the last 2 s
        drained.add(9.0 + 0.01 * i, 16)
    rate = drained.rate(11.99)
    assert rate == pytest.approx(3200 / 1.99, rel=0.02)
    assert len(drained.released) <= 201  # older releases are forgotten as new ones come
    assert adm.retry_after_ms(20.0, 1024, 16, rate) == pytest.approx(1e3 * 1024 / rate, abs=0.1)
    assert drained.rate(20.0) is None and drained.total == 0  # nothing recent
    assert adm.DrainRate().rate(1.0) is None
    assert adm.retry_after_ms(20.0, 0, 16, 100.0) == 1.0      # floor
    # a burst's first release: the rate over at least 0.1 s, not over the whole window
    first = adm.DrainRate()
    first.add(5.0, 16)
    assert first.rate(5.01) == pytest.approx(160.0)


def test_retry_after_before_anything_was_served_counts_batches_served_at_once():
    assert adm.retry_after_ms(20.0, 1024, 16, None) == 1280.0             # one at a time
    assert adm.retry_after_ms(20.0, 1024, 16, None, parallel=4) == 320.0  # 2 workers x 2


def test_the_hint_hedges_toward_the_best_recent_second():
    drained = adm.DrainRate()
    for i in range(200):  # 2 s at 1,600 requests/s
        drained.add(100.0 + 0.01 * i, 16)
    for i in range(100):  # then a burst slows serving to 400/s
        drained.add(102.0 + 0.04 * i, 16)
    now = 106.0
    current = drained.rate(now)
    assert current == pytest.approx(400, rel=0.05)
    # the best second served 1,600: the hint divides by the geometric mean, 800
    assert drained.hint_rate(now) == pytest.approx((current * 1600) ** 0.5, rel=0.02)
    # a memory of BEST_MEMORY_S: long after, only the current rate counts
    later = 102.0 + adm.BEST_MEMORY_S + 10
    for i in range(300):
        drained.add(later - 3 + 0.01 * i, 4)
    assert drained.hint_rate(later) == pytest.approx(drained.rate(later))
    # no better past: the current rate as it is
    fresh = adm.DrainRate()
    fresh.add(5.0, 16)
    assert fresh.hint_rate(5.01) == fresh.rate(5.01)


def test_no_hint_past_the_tails_deadline():
    # 1,024 queued at 100/s would take 10.24 s, but the tail expires in 0.8 s: by then
    # every queued request has its answer
    assert adm.retry_after_ms(20.0, 1024, 16, 100.0, answered_by_s=0.8) == 800.0
    assert adm.retry_after_ms(20.0, 1024, 16, 100.0, answered_by_s=20.0) == 10240.0
    assert adm.retry_after_ms(20.0, 1024, 16, None, answered_by_s=0.05) == 50.0
    assert adm.retry_after_ms(20.0, 1024, 16, 100.0, answered_by_s=-1.0) == 1.0  # floor


def test_the_audit_compares_each_hint_with_the_drain_it_met():
    audit = adm.HintAudit()
    audit.note("tail-a", 10.0, 500.0)    # hint 0.5 s
    audit.note("tail-a", 10.2, 400.0)    # same tail, later refusal
    audit.note("tail-b", 10.5, 1000.0)
    assert audit.settle("not-a-tail", 10.6) == []
    # tail-a answered at 11.0: drains of 1.0 s and 0.8 s
    assert audit.settle("tail-a", 11.0) == pytest.approx([0.5, 0.5])
    assert audit.settle("tail-a", 12.0) == []          # settled once
    assert audit.settle("tail-b", 11.0) == pytest.approx([2.0])
    assert audit.waiting == {}


def test_the_audit_is_bounded():
    audit = adm.HintAudit(tails=2, per_tail=3)
    for i in range(5):
        audit.note("a", float(i), 100.0)
    assert len(audit.waiting["a"]) == 3                  # later refusals not noted
    audit.note("b", 0.0, 100.0)
    audit.note("c", 0.0, 100.0)                          # forgets the oldest tail, "a"
    assert set(audit.waiting) == {"b", "c"} and audit.forgotten == 3
    assert audit.settle("a", 9.0) == []

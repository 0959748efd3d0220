"""Batch fusion: full batches leave at once, partial ones only when a deadline or the hold
limit says so; parts are fused whole, earliest deadline first, never past the target."""

from __future__ import annotations

import pytest

from services.worker.fusion import FusionBuffer, Part


def part(rows, deadline, arrived=0.0, name=""):
    return Part(rows, deadline, arrived, name or f"{rows}@{deadline}")


def test_parts_fuse_up_to_the_target_and_leave_at_once():
    buf = FusionBuffer(target=16, service_ms=20.0, max_hold_ms=50.0)
    buf.add(part(8, 10.0, name="a"))
    assert buf.take(0.001) == []                  # 8 of 16, deadlines far: wait
    buf.add(part(8, 9.0, name="b"))
    got = buf.take(0.002)
    assert [p.payload for p in got] == ["b", "a"]  # earliest deadline first
    assert buf.rows == 0 and buf.flush_at() is None


def test_a_partial_batch_flushes_when_its_earliest_deadline_allows_no_more():
    buf = FusionBuffer(target=16, service_ms=20.0, max_hold_ms=1000.0)
    buf.add(part(5, 1.0, arrived=0.5))
    assert buf.flush_at() == pytest.approx(0.98)   # deadline 1.0 less 20 ms of service
    assert buf.take(0.979) == []
    assert [p.rows for p in buf.take(0.98)] == [5]


def test_a_partial_batch_flushes_after_the_hold_limit():
    buf = FusionBuffer(target=16, service_ms=20.0, max_hold_ms=50.0)
    buf.add(part(3, 100.0, arrived=1.0))
    buf.add(part(4, 100.0, arrived=1.02))
    assert buf.flush_at() == pytest.approx(1.05)   # the oldest part waited 50 ms
    assert buf.take(1.049) == []
    assert sum(p.rows for p in buf.take(1.05)) == 7


def test_never_past_the_target_unless_one_part_alone_is():
    buf = FusionBuffer(target=16, service_ms=0.0, max_hold_ms=0.0)
    for rows, deadline in ((10, 1.0), (10, 2.0), (6, 3.0)):
        buf.add(part(rows, deadline))
    first = buf.take(0.0)
    assert [p.rows for p in first] == [10, 6]      # 10 + 10 would pass 16; the 6 fits
    assert [p.rows for p in buf.take(0.0)] == [10]
    big = FusionBuffer(target=4, service_ms=0.0, max_hold_ms=10.0)
    big.add(part(9, 5.0))
    assert [p.rows for p in big.take(0.0)] == [9]  # one oversized part still runs


def test_drain_hands_everything_back_and_bad_settings_are_refused():
    buf = FusionBuffer(target=8, service_ms=1.0, max_hold_ms=1.0)
    buf.add(part(2, 1.0))
    buf.add(part(3, 0.5))
    assert [p.rows for p in buf.drain()] == [3, 2] and buf.rows == 0
    with pytest.raises(ValueError):
        FusionBuffer(target=0, service_ms=1.0, max_hold_ms=1.0)


def _cut(payload, k):
    return payload[:k], payload[k:]


def test_with_a_split_every_full_batch_is_the_target_and_the_rest_stays_held():
    buf = FusionBuffer(target=16, service_ms=0.0, max_hold_ms=1e4, split=_cut)
    for name, deadline in (("a", 1.0), ("b", 2.0), ("c", 3.0)):
        buf.add(Part(10, deadline, 0.0, [f"{name}{i}" for i in range(10)]))
    first = buf.take(0.0)
    assert [p.rows for p in first] == [10, 6]      # a whole, then b cut at the target
    assert first[1].payload == [f"b{i}" for i in range(6)] and first[1].deadline == 2.0
    assert buf.rows == 14 and [p.rows for p in buf.parts] == [4, 10]
    assert buf.take(1.9) == []                     # 14 of 16: held until b's deadline
    second = buf.take(2.0)
    assert [p.payload for p in second] == [["b6", "b7", "b8", "b9"],
                                          [f"c{i}" for i in range(10)]]
    assert buf.rows == 0


def test_a_split_cuts_a_part_bigger_than_the_batch_and_keeps_its_rest():
    buf = FusionBuffer(target=4, service_ms=0.0, max_hold_ms=10.0, split=_cut)
    buf.add(Part(9, 5.0, 0.0, list(range(9))))
    assert [p.payload for p in buf.take(0.0)] == [[0, 1, 2, 3]]
    assert [p.payload for p in buf.take(0.0)] == [[4, 5, 6, 7]]
    assert buf.take(0.0) == []                     # one row, not due yet
    assert [p.payload for p in buf.take(1.0)] == [[8]]

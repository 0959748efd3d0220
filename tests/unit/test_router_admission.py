"""Router admission and dispatch rules, with hand-computed expectations and their boundaries."""

from __future__ import annotations

import numpy as np
import pytest

from schemas.heartbeat import worker_timeout_s
from services.router import admission as adm
from services.router.edf_queue import EDFQueue, Pending
from services.router.policy import QueueView


def _p(i: int, deadline: float, arrival: float = 0.0, attempts: int = 0,
       replied: bool = False) -> Pending:
    return Pending(id=str(i), model="m", reply="r", inputs={}, arrival=arrival, deadline=deadline,
                   replied=replied, attempts=attempts)


# ---------------------------------------------------------------- intake


def test_worker_timeout_is_three_heartbeats():
    assert worker_timeout_s(200) == pytest.approx(0.6)
    assert worker_timeout_s(1000) == 3.0


@pytest.mark.parametrize("slo_ms,expected", [
    (250.0, 10.25),       # the request's own SLO
    (None, 11.0),         # the default (1000 ms)
    (0.0, 10.0),          # 0 is an SLO, not a missing one
])
def test_request_deadline(slo_ms, expected):
    assert adm.request_deadline(10.0, slo_ms, 1000.0) == pytest.approx(expected)


@pytest.mark.parametrize("has_worker,now,expected", [
    (True, 100.0, False),     # a worker: always admitted
    (False, 11.0, False),     # 1 s after start: workers may still be announcing themselves
    (False, 12.0, False),     # exactly the 2 s grace: still waiting
    (False, 12.001, True),    # past it: refused
])
def test_refuse_for_no_workers(has_worker, now, expected):
    assert adm.refuse_for_no_workers(has_worker, now, started=10.0) is expected


def test_refuse_for_no_workers_custom_grace():
    assert adm.refuse_for_no_workers(False, 10.6, started=10.0, grace_s=0.5)
    assert not adm.refuse_for_no_workers(False, 10.4, started=10.0, grace_s=0.5)


# ---------------------------------------------------------------- service estimate


@pytest.mark.parametrize("full_ms,expected", [
    (0.0, 5.0),       # floor
    (2.0, 5.0),       # 4 ms < floor
    (2.5, 5.0),       # exactly the floor
    (3.0, 6.0),       # twice the profiled time
    (40.0, 80.0),
])
def test_initial_service_ms(full_ms, expected):
    assert adm.initial_service_ms(full_ms) == expected


@pytest.mark.parametrize("old,elapsed,expected", [
    (50.0, 100.0, 60.0),     # 0.8 * 50 + 0.2 * 100
    (50.0, 0.0, 40.0),
    (10.0, 10.0, 10.0),      # steady state stays put
])
def test_updated_service_ms(old, elapsed, expected):
    assert adm.updated_service_ms(old, elapsed) == pytest.approx(expected)


def test_updated_service_ms_is_the_reference_ewma_exactly():
    for old, elapsed in [(7.3, 19.1), (123.456, 0.001), (5.0, 1e6)]:
        assert adm.updated_service_ms(old, elapsed) == 0.8 * old + 0.2 * elapsed


def test_service_estimate_converges_geometrically():
    est = 100.0
    for _ in range(3):
        est = adm.updated_service_ms(est, 0.0)
    assert est == pytest.approx(100.0 * 0.8 ** 3)  # 51.2


# ---------------------------------------------------------------- dispatch


def test_queue_view():
    q = EDFQueue(limit=10)
    q.push(_p(0, deadline=10.5, arrival=9.8))
    q.push(_p(1, deadline=10.2, arrival=9.9))   # head (earliest deadline), not the oldest
    view = adm.queue_view(q, now=10.0, service_ms=50.0)
    assert view.size == 2
    assert view.oldest_wait_ms == pytest.approx(200.0)   # arrival 9.8
    assert view.min_slack_ms == pytest.approx(150.0)     # 200 ms to the head's deadline - 50


def test_queue_view_shows_the_workers_and_the_most_urgent_deadlines():
    q = EDFQueue(limit=10)
    for i, d in enumerate((10.5, 10.2, 10.9, 10.3)):
        q.push(_p(i, deadline=d, arrival=9.9))
    view = adm.queue_view(q, now=10.0, service_ms=50.0, workers=3, urgent=3)
    assert view.workers == 3
    assert view.deadlines_ms == pytest.approx((200.0, 300.0, 500.0))
    assert adm.queue_view(q, now=10.0, service_ms=50.0).deadlines_ms == ()
    assert adm.queue_view(q, now=10.0, service_ms=50.0, workers=0).workers == 1
    assert len(q) == 4   # looked at, not taken


def test_queue_view_negative_slack_when_head_cannot_make_it():
    q = EDFQueue(limit=10)
    q.push(_p(0, deadline=10.03, arrival=10.0))
    view = adm.queue_view(q, now=10.0, service_ms=50.0)
    assert view == QueueView(1, 0.0, pytest.approx(-20.0), pytest.approx(30.0))


@pytest.mark.parametrize("wait_ms,expected_s", [(4.0, 0.004), (0.1, 0.0001), (0.0, 0.0001),
                                                (-3.0, 0.0001)])
def test_reask_after_s(wait_ms, expected_s):
    assert adm.reask_after_s(wait_ms) == pytest.approx(expected_s)


MB = 1024 * 1024


@pytest.mark.parametrize("batch_size,sample_bytes,max_payload,expected", [
    (16, 1000, MB, 16),                  # small samples: the policy's size
    (16, 100_000 - 256, MB, 9),          # (1 MiB - 64 KiB) // 100000 = 983040 // 100000
    (16, 983_040 // 4 - 256, MB, 4),     # exactly four fit
    (16, 983_040 // 4 - 255, MB, 3),     # one byte more each: three
    (16, 2 * MB, MB, 1),                 # one oversized request still goes (and fails clearly)
    (0, 10, MB, 1),
])
def test_payload_batch_cap(batch_size, sample_bytes, max_payload, expected):
    assert adm.payload_batch_cap(batch_size, sample_bytes, max_payload) == expected


@pytest.mark.parametrize("deadline,expected", [
    (10.1, True),      # 100 ms left, 50 needed
    (10.05, True),     # exactly enough
    (10.0499, False),  # 0.1 ms short
    (9.9, False),      # already past
])
def test_can_finish_in_time(deadline, expected):
    assert adm.can_finish_in_time(10.0, deadline, 50.0) is expected


def test_screen_for_dispatch_keeps_order_drops_answered_refuses_late():
    entries = [_p(0, 10.2), _p(1, 10.3, replied=True), _p(2, 10.04), _p(3, 10.05)]
    out = adm.screen_for_dispatch(entries, now=10.0, service_ms=50.0)
    assert [e.id for e in out.send] == ["0", "3"]
    assert [(e.id, r.code) for e, r in out.refuse] == [("2", "deadline_exceeded")]
    assert out.refuse[0][1].message == ("cannot finish within the SLO: about 50.0 ms needed, "
                                        "40.0 ms left")


def test_screen_for_dispatch_everything_late():
    out = adm.screen_for_dispatch([_p(0, 9.0)], now=10.0, service_ms=5.0)
    assert out.send == [] and out.refuse[0][1].message.endswith("-1000.0 ms left")


# ---------------------------------------------------------------- worker loss and deadlines


def test_after_worker_loss_requeues_until_max_attempts():
    entries = [_p(0, 10.0, attempts=1), _p(1, 10.0, attempts=2), _p(2, 10.0, attempts=3),
               _p(3, 10.0, attempts=4), _p(4, 10.0, attempts=1, replied=True)]
    out = adm.after_worker_loss(entries)
    assert [e.id for e in out.requeue] == ["0", "1"]          # 1 and 2 dispatches < 3
    assert [(e.id, r.code) for e, r in out.give_up] == [("2", "no_workers"), ("3", "no_workers")]
    assert out.give_up[0][1].message == "3 workers were lost while serving it"


def test_after_worker_loss_requeues_past_deadline_work_for_the_queue_to_expire():
    out = adm.after_worker_loss([_p(0, deadline=0.0, attempts=1)])
    assert [e.id for e in out.requeue] == ["0"] and out.give_up == []


def test_after_worker_loss_custom_limit():
    out = adm.after_worker_loss([_p(0, 1.0, attempts=1)], max_attempts=1)
    assert out.requeue == [] and len(out.give_up) == 1


def test_track_worker_absence_grace_then_drain():
    w = adm.WorkerAbsence
    assert adm.track_worker_absence(True, 5.0, 10.0, queued=3) == w(None, False)   # back
    assert adm.track_worker_absence(False, None, 10.0, queued=3) == w(10.0, False)  # starts clock
    assert adm.track_worker_absence(False, 10.0, 12.0, queued=3) == w(10.0, False)  # exactly 2 s
    assert adm.track_worker_absence(False, 10.0, 12.01, queued=3) == w(10.0, True)  # past it
    assert adm.track_worker_absence(False, 10.0, 20.0, queued=0) == w(10.0, False)  # nothing to drain


def test_track_worker_absence_never_drains_on_first_sight():
    assert adm.track_worker_absence(False, None, 10.0, queued=3, grace_s=0.0) == \
        adm.WorkerAbsence(10.0, False)


@pytest.mark.parametrize("code,expected", [
    ("overloaded", "overloaded"), ("payload_too_large", "payload_too_large"),
    ("segfault", "internal"), (None, "internal"), (3, "internal"), (["x"], "internal"),
])
def test_client_error_code(code, expected):
    assert adm.client_error_code(code) == expected


def test_payload_cap_for_an_image_batch():
    x = np.zeros((3, 224, 224), np.float32)   # 602112 bytes
    assert adm.payload_batch_cap(8, x.nbytes, 8 * MB) == 8
    assert adm.payload_batch_cap(32, x.nbytes, 8 * MB) == 13   # 8323072 // 602368


def test_slowdown_follows_live_over_profiled_batch_time():
    s = 1.0
    for _ in range(30):
        s = adm.updated_slowdown(s, elapsed_ms=30.0, expected_ms=10.0)
    assert s == pytest.approx(3.0, rel=0.01)
    assert adm.updated_slowdown(2.0, 5.0, 10.0) == pytest.approx(0.8 * 2.0 + 0.2 * 1.0)  # >= 1
    assert adm.updated_slowdown(2.0, 500.0, 10.0) == pytest.approx(0.8 * 2.0 + 0.2 * 10.0)
    assert adm.updated_slowdown(2.0, 30.0, 0.0) == 2.0   # not a variant batch: unchanged
    q = EDFQueue(limit=10)
    q.push(_p(0, deadline=10.05, arrival=10.0))
    assert adm.queue_view(q, now=10.0, service_ms=5.0, slowdown=1.5).slowdown == 1.5


def test_a_variant_batch_is_screened_on_its_own_profiled_time():
    from services.router.variant_table import VariantProfile

    fast = VariantProfile("fast", 0.7, (1, 16), (2.0, 32.0))     # 2 ms per sample
    # the EWMA of recent (slower) batches, when the batch has no variant
    assert adm.dispatch_estimate_ms(150.0, False, None, 16, 1.5, 5.0) == 150.0
    # 16 on the fast variant: 32 ms x 1.5 live slowdown + 5 ms of hops
    assert adm.dispatch_estimate_ms(150.0, False, fast, 16, 1.5, 5.0) == pytest.approx(53.0)
    # behind a batch the worker runs: that batch's estimate first
    assert adm.dispatch_estimate_ms(150.0, True, fast, 16, 1.5, 5.0) == pytest.approx(203.0)
    # a request with 60 ms left is kept for the fast batch, refused on the EWMA
    q = EDFQueue(limit=4)
    q.push(_p(0, deadline=10.06, arrival=9.9))
    entries = q.pop(1)
    assert adm.screen_for_dispatch(entries, 10.0, 53.0).send == entries
    assert not adm.screen_for_dispatch(entries, 10.0, 150.0).send

"""After a silence long enough for a router to take the worker for lost, the worker answers
what it received before it (or in transit just after it) through the router only."""

from __future__ import annotations

from services.worker.silence import SilenceGuard


def _guard() -> SilenceGuard:
    g = SilenceGuard(period_s=0.2, transit_s=2.0)
    for t in (0.0, 0.2, 0.4):
        assert not g.beat(t)
    return g


def test_beats_on_time_let_every_batch_be_answered_directly():
    g = _guard()
    assert g.may_answer_directly(received=0.1, now=0.45)
    assert not g.beat(0.8)  # two periods: late, but no router has given up yet


def test_a_silence_sends_earlier_batches_through_the_router():
    g = _guard()
    assert not g.may_answer_directly(received=0.3, now=0.81)  # silent right now
    assert g.beat(1.5)                                         # the silence ends
    assert not g.may_answer_directly(received=0.3, now=1.6)    # received before it
    assert not g.may_answer_directly(received=1.6, now=1.7)    # may have been in transit
    for k in range(1, 11):
        assert not g.beat(1.5 + 0.2 * k)                       # beats on time again
    assert not g.may_answer_directly(received=3.5, now=3.55)   # the transit margin's edge
    assert g.may_answer_directly(received=3.51, now=3.6)       # sent after the router knew


def test_no_beat_yet_is_not_a_silence():
    g = SilenceGuard(period_s=0.2, transit_s=2.0)
    assert g.may_answer_directly(received=0.0, now=100.0)
    assert not g.beat(100.0)

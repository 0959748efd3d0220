"""The router's generation desk: slots, waiting requests, released and lost streams."""

from __future__ import annotations

from services.router.llm_desk import LlmDesk, Stream


def _desk() -> LlmDesk:
    return LlmDesk(timeout_s=0.6, transit_s=2.0, queue_limit=2)


def _s(rid: str, deadline: float = 100.0) -> Stream:
    return Stream(rid, "llm", f"_INBOX.c.{rid}", b"", 0.0, deadline)


def test_requests_go_to_the_worker_with_the_most_free_slots_in_order():
    d = _desk()
    d.heartbeat("a", "llm", 1, 0.0, ())
    d.heartbeat("b", "llm", 2, 0.0, ())
    assert d.enqueue(_s("r0")) and d.enqueue(_s("r1"))
    assert not d.enqueue(_s("r2"))                       # the queue holds 2
    sent = d.assign("llm", 1.0)
    assert [(s.id, s.worker) for s in sent] == [("r0", "b"), ("r1", "a")]
    assert d.enqueue(_s("r2")) and d.assign("llm", 1.0)[0].worker == "b"
    assert d.enqueue(_s("r3")) and d.assign("llm", 1.0) == []   # every slot taken
    assert d.release("b", "r0").id == "r0"
    assert [s.id for s in d.assign("llm", 1.5)] == ["r3"]


def test_a_stream_no_heartbeat_lists_is_settled_only_after_the_transit_margin():
    d = _desk()
    d.heartbeat("a", "llm", 2, 0.0, ())
    d.enqueue(_s("r0"))
    d.assign("llm", 1.0)
    assert d.heartbeat("a", "llm", 2, 2.9, ()) == []       # may not have arrived yet
    assert d.heartbeat("a", "llm", 2, 3.0, ("r0",)) == []  # it holds it
    assert [s.id for s in d.heartbeat("a", "llm", 2, 3.1, ())] == ["r0"]
    assert d.workers["a"].free == 2 and "r0" not in d.open
    assert d.heartbeat("a", "llm", 2, 3.2, None) == []     # says nothing: settles nothing


def test_a_silent_worker_gives_up_its_streams_and_late_waits_leave_the_queue():
    d = _desk()
    d.heartbeat("a", "llm", 1, 0.0, ())
    d.enqueue(_s("r0"))
    d.enqueue(_s("r1", deadline=5.0))
    d.assign("llm", 0.1)
    assert d.lost(0.6) == []
    assert [s.id for s in d.lost(0.61)] == ["r0"] and not d.has_worker("llm")
    assert d.late(4.9) == [] and [s.id for s in d.late(5.0)] == ["r1"]
    assert d.open == {} and d.serves("llm")

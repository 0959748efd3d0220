"""The store's generation streams (revision 0011): stored once per stream however often a
telemetry batch is delivered, read back per assessment, and summed per candidate and depth
so the optimizer can tell how far an assessment got; the decision in force comes back with
the id its broadcast carries. On SQLite and (when configured) PostgreSQL."""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import inspect

from services.store import Store, migrate
from services.store.db import make_engine

T0 = datetime(2030, 1, 1, 12, 0, 0)


def gen(rid: str, candidate: str = "opt-1.3b", depth: int = 12, assessment: int | None = 1,
        tokens: int = 10, seconds: float = 0.0, model: str = "chat") -> dict:
    return {"request_id": rid, "model": model, "worker": "chat-s0-abcdef",
            "received_at": T0 + timedelta(seconds=seconds), "candidate": candidate,
            "depth": depth, "assessment": assessment, "prompt_tokens": 7, "tokens": tokens,
            "ttft_ms": 40.0, "tpot_ms": 20.0, "duration_ms": 240.0, "logprob": -5.5,
            "exits": {6: tokens - 2, 12: 2}, "breaches": 1, "memory_bytes": 3_000_000_000,
            "checked": 2, "agreed": 1, "first_deviation": 4, "judged_logprob": -6.25,
            "judging": False, "decode_ms": 180.0}


def _count(store: Store) -> int:
    with store.engine.connect() as conn:
        return conn.exec_driver_sql("SELECT count(*) FROM generations").scalar()


def test_the_revision_adds_and_removes_the_table(url: str) -> None:
    migrate.upgrade(url)
    migrate.downgrade(url, "0010_helios")
    engine = make_engine(url)
    try:
        assert "generations" not in inspect(engine).get_table_names()
        migrate.upgrade(url)
        assert "generations" in inspect(engine).get_table_names()
    finally:
        engine.dispose()


def test_streams_round_trip_with_every_column(store: Store) -> None:
    assert store.add_generations([gen("g1"), gen("g2", seconds=1.0)]) == 2
    first, second = store.generations("chat", 1)
    assert second["received_at"] == T0 + timedelta(seconds=1)
    assert {k: v for k, v in first.items() if k != "id"} == {
        **gen("g1"), "exits": {6: 8, 12: 2}}  # int layer keys, as stored from ints
    assert first["id"] < second["id"]
    assert store.generations("chat", 2) == [] and store.generations("other", 1) == []


def test_a_stream_being_judged_is_kept_and_counts_once_its_score_completes_it(
        store: Store) -> None:
    pending = {**gen("g2"), "judged_logprob": None, "judging": True}
    store.add_generations([gen("g1"), pending], "gen:w1:1")
    assert _count(store) == 2  # on record, though its judge has not scored it yet
    assert [r["request_id"] for r in store.generations("chat", 1)] == ["g1"]
    assert store.assessment_progress("chat", 1)[0]["tokens"] == 10  # the PHT waits for it
    store.add_generations([{**gen("g2"), "judged_logprob": -9.0}], "gen:w1:j2")  # completes
    _, g2 = store.generations("chat", 1)
    assert (g2["judged_logprob"], g2["judging"], g2["logprob"]) == (-9.0, False, -5.5)
    assert store.assessment_progress("chat", 1)[0]["tokens"] == 20
    store.add_generations([pending], "gen:w1:1-again")  # a late redelivery undoes nothing
    store.add_generations([{**gen("g1"), "judged_logprob": -1.0}], "gen:w1:j1")  # not judging
    assert [(r["judged_logprob"], r["judging"]) for r in store.generations("chat", 1)] == [
        (-6.25, False), (-9.0, False)]
    assert _count(store) == 2


def test_a_redelivered_batch_or_a_stream_stored_twice_adds_nothing(store: Store) -> None:
    assert store.add_generations([gen("g1"), gen("g2")], "gen:w1:1") == 2
    assert store.add_generations([gen("g1"), gen("g2")], "gen:w1:1") == 0  # redelivery
    store.add_generations([gen("g2", tokens=99), gen("g3")], "gen:w1:2")  # g2 again: kept
    assert _count(store) == 3
    assert [r["tokens"] for r in store.generations("chat", 1)] == [10, 10, 10]
    store.add_generations([gen("g1", model="other")])  # another model's g1: its own row
    store.add_generations([gen(""), gen("")])  # streams without an id are all kept
    assert _count(store) == 6
    # what `offramp status` sums per model (each gen row: 10 tokens, 2 checked, 1 agreed)
    assert store.generation_totals() == {
        "chat": {"streams": 5, "tokens": 50, "checked": 10, "agreed": 5},
        "other": {"streams": 1, "tokens": 10, "checked": 2, "agreed": 1}}


def test_assessment_progress_per_candidate_and_depth(store: Store) -> None:
    store.add_generations([gen("a", tokens=10, seconds=1), gen("b", tokens=20, seconds=5),
                           gen("c", "opt-6.7b", 32, tokens=4, seconds=3),
                           gen("d", depth=24, tokens=6, seconds=2),
                           gen("e", assessment=2, tokens=50, seconds=9),
                           gen("f", assessment=None, tokens=70, seconds=9)])
    assert store.assessment_progress("chat", 1) == [
        {"candidate": "opt-1.3b", "depth": 12, "requests": 2, "tokens": 30,
         "last_at": T0 + timedelta(seconds=5)},
        {"candidate": "opt-1.3b", "depth": 24, "requests": 1, "tokens": 6,
         "last_at": T0 + timedelta(seconds=2)},
        {"candidate": "opt-6.7b", "depth": 32, "requests": 1, "tokens": 4,
         "last_at": T0 + timedelta(seconds=3)}]
    assert [p["tokens"] for p in store.assessment_progress("chat", 2)] == [50]
    assert store.assessment_progress("chat", 3) == []


def test_assessments_with_streams_stored_after_an_id(store: Store) -> None:
    assert store.generation_assessments() == []
    store.add_generations([gen("a"), gen("b", assessment=2), gen("c", assessment=None),
                           gen("d", model="other", assessment=7)])
    ids = {r["request_id"]: r["id"] for a in (1, 2) for r in store.generations("chat", a)}
    other = store.generations("other", 7)[0]["id"]
    assert store.generation_assessments() == [
        {"model": "chat", "assessment": 1, "last_id": ids["a"]},
        {"model": "chat", "assessment": 2, "last_id": ids["b"]},
        {"model": "other", "assessment": 7, "last_id": other}]
    assert store.generation_assessments(ids["a"]) == [
        {"model": "chat", "assessment": 2, "last_id": ids["b"]},
        {"model": "other", "assessment": 7, "last_id": other}]  # c: outside any assessment
    assert store.generation_assessments(other) == []


def test_the_decision_in_force_comes_back_with_its_id(store: Store) -> None:
    assert store.latest_helios_decision("chat") is None
    first = store.record_helios_decision("chat", {"kind": "evaluate", "candidate": "opt-1.3b",
                                                  "depth": 24, "reason": "a", "assessment": 1},
                                         at=T0)
    second = store.record_helios_decision("chat", {"kind": "switch", "candidate": "opt-6.7b",
                                                   "depth": 9, "reason": "b"},
                                          at=T0 + timedelta(seconds=5))
    assert second["id"] > first["id"]
    latest = store.latest_helios_decision("chat")
    assert latest is not None and latest == second  # every column, as recorded
    assert [d["id"] for d in store.helios_decisions("chat")] == [first["id"], second["id"]]
    assert store.latest_helios_decision("other") is None

"""The store's HELIOS tables (revision 0010): model repository, Performance History Table
and decisions round-trip through the policy's own dataclasses, and one query tells which
candidate and depth served each request and why; on SQLite and (when configured) PostgreSQL.
"""

from __future__ import annotations

from dataclasses import asdict, fields
from datetime import datetime, timedelta

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect, text

from services.optimizer.helios import (
    Candidate,
    PhtRow,
    Slo,
    SwitchCosts,
    load_or_switch,
    select_top_k,
)
from services.store import Store, migrate
from services.store.db import make_engine
from services.store.pht import SERVED_BY_SQL
from services.store.tables import Base

HELIOS_TABLES = {"model_repository", "pht", "helios_decisions"}
T0 = datetime(2030, 1, 1, 12, 0, 0)
A = Candidate("opt-1.3b", "opt", 24, (6, 12, 24), 100, 200, 1, 40.0, 1.9,
              exit_distribution={6: 0.74, 12: 0.047, 24: 0.213})
B = Candidate("opt-6.7b", "opt", 32, (9, 17, 32), 400, 800, 2, 25.0, 1.7)
PHT = [PhtRow("opt-1.3b", 1, 24, 50.0, 43.0, 20.0, 1.50, {6: 0.6, 12: 0.1, 24: 0.3}, 2600, 500),
       PhtRow("opt-6.7b", 1, 32, 20.0, 69.0, 50.0, 1.52, {9: 0.75, 32: 0.25}, 13600, 500)]


def _tables(url: str) -> set[str]:
    engine = make_engine(url)
    try:
        return set(inspect(engine).get_table_names())
    finally:
        engine.dispose()


def test_migrations_apply_from_empty_and_match_the_models(url: str) -> None:
    assert migrate.current(url) is None
    migrate.upgrade(url)
    assert migrate.current(url) == migrate.head()
    assert HELIOS_TABLES <= _tables(url)
    engine = make_engine(url)
    try:
        insp = inspect(engine)
        for table in ("pht", "helios_decisions"):
            assert ("model", "at") in {tuple(i["column_names"]) for i in insp.get_indexes(table)}
        with engine.connect() as conn:
            ctx = MigrationContext.configure(conn, opts={"compare_type": True})
            assert compare_metadata(ctx, Base.metadata) == []
    finally:
        engine.dispose()
    migrate.downgrade(url, "0009_cap_agreement")
    assert not HELIOS_TABLES & _tables(url)
    migrate.upgrade(url)
    assert HELIOS_TABLES <= _tables(url)


def _candidate(row: dict) -> Candidate:
    return Candidate(**{f.name: row[f.name] for f in fields(Candidate)})


def test_repository_round_trip_feeds_top_k(store: Store) -> None:
    assert store.save_repository_candidates([asdict(A), asdict(B)]) == 2
    assert [_candidate(r) for r in store.repository_candidates()] == [A, B]
    faster = {**asdict(B), "tokens_per_s": 80.0, "path": "/models/opt-6.7b"}
    store.save_repository_candidates([faster])  # same name: replaced, not added
    rows = store.repository_candidates(family="opt")
    assert len(rows) == 2 and rows[1]["tokens_per_s"] == 80.0
    assert rows[1]["path"] == "/models/opt-6.7b" and rows[1]["exit_distribution"] == {}
    assert store.repository_candidates(family="llama") == []
    top = select_top_k([_candidate(r) for r in rows], Slo(), memory_budget=20_000)
    assert [c.name for c in top] == ["opt-6.7b", "opt-1.3b"]


def test_pht_round_trip_and_replace(store: Store) -> None:
    assert store.record_pht("chat", [asdict(r) for r in PHT], at=T0) == 2
    got = store.pht_rows("chat")
    assert [PhtRow(**{k: r[k] for k in asdict(PHT[0])}) for r in got] == PHT
    assert got[0]["model"] == "chat" and got[0]["at"] == T0
    again = {**asdict(PHT[0]), "tokens_per_s": 55.0}
    store.record_pht("chat", [again], at=T0 + timedelta(seconds=5))
    got = store.pht_rows("chat")
    assert len(got) == 2 and got[0]["tokens_per_s"] == 55.0
    store.record_pht("chat", [{**asdict(PHT[1]), "assessment": 2}], at=T0 + timedelta(minutes=9))
    assert store.latest_assessment("chat") == 2 and store.latest_assessment("other") is None
    assert [r["candidate"] for r in store.pht_rows("chat", assessment=2)] == ["opt-6.7b"]
    assert len(store.pht_rows("chat", since=T0 + timedelta(seconds=5))) == 2


def _decide(store: Store, seconds: float, kind: str, candidate: str, depth: int,
            reason: str) -> None:
    store.record_helios_decision("chat", {"kind": kind, "candidate": candidate, "depth": depth,
                                          "reason": reason, "assessment": 1},
                                 at=T0 + timedelta(seconds=seconds))


def test_which_model_and_depth_served_these_requests_and_why(store: Store) -> None:
    _decide(store, 0, "evaluate", "opt-1.3b", 24, "assessment 1: requests 150-154")
    _decide(store, 10, "evaluate", "opt-6.7b", 32, "assessment 1: requests 155-159")
    _decide(store, 20, "stay", "opt-6.7b", 32, "superseded at the same instant")
    _decide(store, 20, "switch", "opt-1.3b", 6, "assessment 1 by throughput")
    breach = load_or_switch(A, 6, [A, B], PHT, SwitchCosts(load_ms_per_byte=0.01,
                                                           horizon_tokens=1000))
    assert breach.kind == "load"
    store.record_helios_decision("chat", {**asdict(breach), "assessment": 1, "batch": 3},
                                 at=T0 + timedelta(seconds=40))
    arrivals = {"r0": -5, "r1": 1, "r2": 12, "r3": 20, "r4": 30, "r5": 40, "r6": 50}
    store.add_requests([{"request_id": rid, "model": "chat", "status": "ok",
                         "received_at": T0 + timedelta(seconds=s)} for rid, s in arrivals.items()])
    store.add_requests([{"request_id": "x", "model": "other", "status": "ok",
                         "received_at": T0 + timedelta(seconds=30)}])
    rows = store.requests_served_by("chat", since=T0 - timedelta(minutes=1))
    got = [(r["request_id"], r["candidate"], r["depth"], r["kind"]) for r in rows]
    assert got == [("r0", None, None, None), ("r1", "opt-1.3b", 24, "evaluate"),
                   ("r2", "opt-6.7b", 32, "evaluate"), ("r3", "opt-1.3b", 6, "switch"),
                   ("r4", "opt-1.3b", 6, "switch"), ("r5", "opt-1.3b", 24, "load"),
                   ("r6", "opt-1.3b", 24, "load")]
    assert rows[5]["decided_at"] == T0 + timedelta(seconds=40)
    assert rows[5]["reason"] == breach.reason and "-> load" in rows[5]["reason"]
    window = store.requests_served_by("chat", T0 + timedelta(seconds=12), T0 + timedelta(seconds=40))
    assert [r["request_id"] for r in window] == ["r2", "r3", "r4"]
    decisions = store.helios_decisions("chat")
    assert [d["kind"] for d in decisions] == ["evaluate", "evaluate", "stay", "switch", "load"]
    assert decisions[-1]["batch"] == 3 and decisions[-1]["load_bytes"] == 1800


def test_served_by_is_one_plain_query(store: Store) -> None:
    _decide(store, 0, "switch", "opt-1.3b", 6, "why")
    store.add_requests([{"request_id": "r", "model": "chat", "status": "ok",
                         "received_at": T0 + timedelta(seconds=1)}])
    with store.engine.connect() as conn:  # as a user would run it, parameters bound
        got = conn.execute(text(SERVED_BY_SQL), {"model": "chat", "since": T0,
                                                 "until": T0 + timedelta(hours=1)}).all()
    assert [(r.request_id, r.candidate, r.depth, r.reason) for r in got] == \
        [("r", "opt-1.3b", 6, "why")]


def test_unknown_decision_kind_is_refused(store: Store) -> None:
    with pytest.raises(ValueError):
        store.record_helios_decision("chat", {"kind": "guess", "candidate": "a", "depth": 1,
                                              "reason": ""})

"""The store's variant profiles (revision 0007): written per model, device and source in
one transaction, read back as the frontier, fastest first; answerable in SQL."""

from __future__ import annotations

from sqlalchemy import text

from services.store import Store

ROWS = [
    {"variant": "D=2,2;W=1,1", "accuracy": 1.0, "labelled_accuracy": 0.86,
     "latency_ms": {1: 3.0, 16: 20.0}, "pareto": True},
    {"variant": "D=1,1;W=0.25,0.25", "accuracy": 0.8, "labelled_accuracy": None,
     "latency_ms": {1: 1.0, 16: 6.0}, "pareto": True},
    {"variant": "D=1,2;W=0.5,0.25", "accuracy": 0.7, "latency_ms": {}, "pareto": False},
]


def test_profiles_round_trip_fastest_first(store: Store) -> None:
    assert store.save_subnet_profiles("sn", "cpu-x", ROWS, source="search") == 3
    rows = store.subnet_profiles("sn")
    assert [r["variant"] for r in rows] == ["D=1,1;W=0.25,0.25", "D=2,2;W=1,1"]
    assert rows[0]["latency_ms"] == {1: 1.0, 16: 6.0}
    assert rows[1]["labelled_accuracy"] == 0.86 and rows[0]["labelled_accuracy"] is None
    assert len(store.subnet_profiles("sn", pareto=False)) == 3
    assert store.subnet_profiles("sn", device="cuda-a40") == []


def test_saving_again_replaces_only_that_source_and_device(store: Store) -> None:
    store.save_subnet_profiles("sn", "cpu-x", ROWS, source="search")
    store.save_subnet_profiles("sn", "cpu-x", [{"variant": "depth<=3", "accuracy": 0.9,
                                                "latency_ms": {1: 2.0}, "pareto": True}],
                               source="depth-cap")
    store.save_subnet_profiles("sn", "cpu-x", ROWS[:1], source="search")
    assert sorted(r["variant"] for r in store.subnet_profiles("sn")) == ["D=2,2;W=1,1",
                                                                        "depth<=3"]


def test_frontier_in_one_query(store: Store) -> None:
    store.save_subnet_profiles("sn", "cpu-x", ROWS, source="search")
    with store.engine.connect() as conn:
        got = conn.execute(text(
            "SELECT variant, accuracy FROM subnet_profiles WHERE model = 'sn' AND pareto "
            "ORDER BY accuracy")).all()
    assert [tuple(r) for r in got] == [("D=1,1;W=0.25,0.25", 0.8), ("D=2,2;W=1,1", 1.0)]


def test_requests_keep_the_variant_that_served_them(store: Store) -> None:
    from services.store.db import utcnow
    now = utcnow()
    store.add_requests([
        {"request_id": "a", "model": "sn", "received_at": now, "latency_ms": 3.0,
         "status": "ok", "exit": -1, "early": False, "label": 1, "config_version": 0,
         "variant": "D=1,1;W=0.25,0.25"},
        {"request_id": "b", "model": "sn", "received_at": now, "latency_ms": 4.0,
         "status": "ok", "exit": -1, "early": False, "label": 2, "config_version": 0}])
    with store.engine.connect() as conn:
        got = conn.execute(text("SELECT request_id, variant FROM requests WHERE model = 'sn' "
                                "ORDER BY request_id")).all()
    assert [tuple(r) for r in got] == [("a", "D=1,1;W=0.25,0.25"), ("b", None)]

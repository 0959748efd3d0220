"""Round trips through services.store.Store, on SQLite and (when configured) PostgreSQL."""

from __future__ import annotations

import copy
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select, text

from services.store import ExitConfigRow, Store
from services.store.db import utcnow
from services.store.tables import Request

MANIFEST: dict[str, Any] = {
    "name": "tiny",
    "version": "1",
    "kind": "classifier",
    "inputs": [{"name": "x", "shape": [3, 8, 8]}],
    "outputs": [{"name": "logits", "shape": [10]}],
    "classes": 10,
    "blocks": [{"index": i, "file": f"block{i}.onnx", "sha256": f"b{i}"} for i in range(3)],
    "ramps": [
        {
            "index": 0,
            "after_block": 0,
            "file": "ramp0.onnx",
            "sha256": "r0",
            "arch": "pool_fc",
            "params": 1000,
            "agreement": 0.7,
            "cost_ms": 0.1,
        },
        {
            "index": 1,
            "after_block": 1,
            "file": "ramp1.onnx",
            "sha256": "r1",
            "arch": "pool_fc",
            "params": 2000,
            "agreement": 0.8,
            "cost_ms": 0.2,
        },
    ],
    "base_params": 50_000,
    "full_ms": 3.5,
}




def test_register_model_round_trip_and_idempotent(store: Store, tmp_path: Path) -> None:
    (tmp_path / "block0.onnx").write_bytes(b"x" * 123)  # size read from disk when absent
    model_id = store.register_model(MANIFEST, str(tmp_path))
    assert store.model_names() == ["tiny"]
    first = store.model("tiny")
    assert first is not None and first["manifest"] == MANIFEST and first["classes"] == 10
    assert first["path"] == str(tmp_path) and first["version"] == "1"
    assert store.ramps("tiny") == [
        {
            "index": 0,
            "after_block": 0,
            "arch": "pool_fc",
            "params": 1000,
            "agreement": 0.7,
            "cost_ms": 0.1,
            "tensor": None,
            "cost_by_batch": None,
            "file": "ramp0.onnx",
            "sha256": "r0",
        },
        {
            "index": 1,
            "after_block": 1,
            "arch": "pool_fc",
            "params": 2000,
            "agreement": 0.8,
            "cost_ms": 0.2,
            "tensor": None,
            "cost_by_batch": None,
            "file": "ramp1.onnx",
            "sha256": "r1",
        },
    ]
    with store.engine.connect() as conn:
        sizes = dict(conn.execute(text("SELECT file, bytes FROM artifacts")).all())
    assert sizes == {
        "block0.onnx": 123,
        "block1.onnx": None,
        "block2.onnx": None,
        "ramp0.onnx": None,
        "ramp1.onnx": None,
    }

    assert store.register_model(MANIFEST, str(tmp_path)) == model_id
    assert store.model("tiny") == first  # untouched, updated_at included


def test_register_new_version_replaces_artifacts_and_ramps(store: Store) -> None:
    model_id = store.register_model(MANIFEST, "/m/1")
    v2 = copy.deepcopy(MANIFEST)
    v2["version"] = "2"
    v2["ramps"] = [{**v2["ramps"][1], "agreement": 0.9, "sha256": "r1b"}]
    assert store.register_model(v2, "/m/2") == model_id
    assert [(r["index"], r["agreement"], r["sha256"]) for r in store.ramps("tiny")] == [
        (1, 0.9, "r1b")
    ]
    with store.engine.connect() as conn:
        kinds = conn.execute(
            text("SELECT kind, count(*) FROM artifacts GROUP BY kind ORDER BY kind")
        ).all()
    assert [tuple(k) for k in kinds] == [("block", 3), ("ramp", 1)]
    assert store.model("tiny")["version"] == "2"  # type: ignore[index]
    assert store.ramps("unknown") == [] and store.model("unknown") is None


def test_exit_config_versions_are_per_model(store: Store) -> None:
    assert store.latest_exit_config("a") is None
    versions = [
        store.save_exit_config("a", {0: 0.5 + i / 10, 3: 0.9}, [0, 3], "latency", f"r{i}").version
        for i in range(3)
    ]
    assert versions == [1, 2, 3]
    assert store.save_exit_config("b", {}, [], "vanilla", "start").version == 1
    latest = store.latest_exit_config("a")
    assert isinstance(latest, ExitConfigRow)
    assert (
        latest.model,
        latest.version,
        latest.thresholds,
        latest.active,
        latest.mode,
        latest.reason,
    ) == ("a", 3, {0: 0.7, 3: 0.9}, [0, 3], "latency", "r2")
    assert (
        abs(latest.created_at - utcnow()) < timedelta(minutes=1)
        and latest.created_at.tzinfo is None
    )
    assert store.latest_exit_config("b").version == 1  # type: ignore[union-attr]


def test_exit_configs_keep_the_heads_they_serve(store: Store) -> None:
    assert store.save_exit_config("h", {0: 0.1}, [0], "latency", "prepared").heads == {}
    row = store.save_exit_config("h", {0: 0.1}, [0], "latency", "refit",
                                 {2: "ramp_2.v3.0123456789ab.onnx"})
    assert row.heads == {2: "ramp_2.v3.0123456789ab.onnx"}
    assert store.latest_exit_config("h").heads == row.heads  # type: ignore[union-attr]
    assert [c.heads for c in store.exit_configs("h")] == [{}, row.heads]


def test_exit_config_versions_under_concurrency(store: Store) -> None:
    def save(i: int) -> int:
        return store.save_exit_config("m", {0: i / 100}, [0], "compute", "race").version

    with ThreadPoolExecutor(4) as pool:
        versions = list(pool.map(save, range(16)))
    assert sorted(versions) == list(range(1, 17))
    assert store.latest_exit_config("m").version == 16  # type: ignore[union-attr]


def _profiles(now: datetime) -> list[dict[str, Any]]:
    rows = []
    for k, (samples, rate, agr) in enumerate([(10, 0.5, 1.0), (30, 0.1, 0.5)]):
        end = now - timedelta(minutes=k)
        for ramp in (-1, 2):
            rows.append(
                {
                    "model": "m",
                    "config_version": 1,
                    "window_start": end - timedelta(seconds=30),
                    "window_end": end,
                    "ramp": ramp,
                    "samples": samples,
                    "exit_rate": rate,
                    "agreement": agr,
                }
            )
    return rows


def test_exit_profiles_summary(store: Store) -> None:
    now = utcnow()
    assert store.add_exit_profiles(_profiles(now)) == 4
    old = {**_profiles(now)[0], "window_end": now - timedelta(hours=3), "exit_rate": 1.0}
    store.add_exit_profiles([old, {**old, "model": "other", "window_end": now}])
    summary = store.exit_profile_summary("m", now - timedelta(hours=1))
    assert [s["ramp"] for s in summary] == [-1, 2]
    for s in summary:  # sample-weighted: (10*0.5 + 30*0.1) / 40
        assert s["windows"] == 2 and s["samples"] == 40
        assert s["exit_rate"] == pytest.approx(0.2) and s["agreement"] == pytest.approx(0.625)
    assert len(store.exit_profile_summary("m", now - timedelta(hours=4))[0:1]) == 1
    assert store.exit_profile_summary("m", now + timedelta(hours=1)) == []


def _requests(now: datetime, n: int = 100) -> list[dict[str, Any]]:
    rows = [
        {
            "request_id": f"r{i}",
            "model": "m",
            "received_at": now - timedelta(seconds=i),
            "latency_ms": float(i + 1),
            "status": "ok",
            "exit": 2 if i % 4 == 0 else None,
            "early": i % 4 == 0,
            "label": 7,
            "config_version": 1,
        }
        for i in range(n)
    ]
    rows.append(
        {
            "request_id": "x",
            "model": "m",
            "received_at": now,
            "latency_ms": 0.1,
            "status": "overloaded",
        }
    )  # optional keys may be missing
    return rows


def test_requests_and_stats(store: Store) -> None:
    now = utcnow()
    assert store.add_requests(_requests(now)) == 101
    store.add_requests([{**_requests(now)[0], "received_at": now - timedelta(days=1)}])
    stats = store.request_stats("m", now - timedelta(hours=1))
    assert stats == {
        "count": 101,
        "errors": 1,
        "p50_ms": pytest.approx(50.5),
        "p95_ms": pytest.approx(95.05),
        "early_share": pytest.approx(0.25),
        "first_at": now - timedelta(seconds=99),  # the oldest row since the cut-off
    }
    assert store.request_stats("m", now + timedelta(hours=1)) == {
        "count": 0,
        "errors": 0,
        "p50_ms": None,
        "p95_ms": None,
        "early_share": None,
        "first_at": None,
    }


def test_request_latencies_by_id(store: Store) -> None:
    now = utcnow()
    store.add_requests(_requests(now, n=5))
    store.add_requests([{**_requests(now)[0], "request_id": "old",
                         "received_at": now - timedelta(days=1)}])
    got = store.request_latencies("m", now - timedelta(hours=1))
    # ok requests only ("x" was overloaded), and nothing from before `since`
    assert got == {"r0": 1.0, "r1": 2.0, "r2": 3.0, "r3": 4.0, "r4": 5.0}
    assert store.request_latencies("other", now - timedelta(hours=1)) == {}


def test_request_arrivals_by_id(store: Store) -> None:
    now = utcnow()
    store.add_requests(_requests(now, n=2))
    store.add_requests([{**_requests(now)[0], "request_id": "old",
                         "received_at": now - timedelta(days=1)}])
    got = store.request_arrivals("m", now - timedelta(hours=1))
    assert set(got) >= {"r0", "r1"} and "old" not in got
    expected = now.replace(tzinfo=UTC).timestamp()  # utcnow() is naive UTC
    assert got["r0"] == pytest.approx(expected, abs=1e-3)  # Unix seconds of received_at


def test_aware_datetimes_are_stored_as_naive_utc(store: Store) -> None:
    tz = timezone(timedelta(hours=5))
    at = datetime(2030, 1, 1, 17, 0, tzinfo=tz)
    store.add_requests(
        [{"request_id": "a", "model": "m", "received_at": at, "latency_ms": 1.0, "status": "ok"}]
    )
    with store.engine.connect() as conn:
        stored = conn.execute(select(Request.received_at)).scalar_one()
    assert stored == datetime(2030, 1, 1, 12, 0)
    assert store.request_stats("m", datetime(2030, 1, 1, 11, 30, tzinfo=UTC))["count"] == 1


def test_plain_sql_time_window(store: Store) -> None:
    """The README's kind of query: naive UTC columns against the database's own clock."""
    now = utcnow()
    store.add_requests(
        [
            {**r, "received_at": now - timedelta(minutes=m)}
            for r, m in zip(_requests(now, 2), (10, 120), strict=False)
        ]
    )
    hour_ago = (
        "datetime('now', '-1 hour')"
        if store.engine.dialect.name == "sqlite"
        else "now() AT TIME ZONE 'UTC' - interval '1 hour'"
    )
    with store.engine.connect() as conn:
        n = conn.execute(
            text(f"SELECT count(*) FROM requests WHERE received_at > {hour_ago}")
        ).scalar()
    assert n == 1


def test_ingest_key_dedup(store: Store) -> None:
    now = utcnow()
    rows = _requests(now, 5)
    assert store.add_requests(rows, ingest_key="w1:7") == 6
    assert store.add_requests(rows, ingest_key="w1:7") == 0  # redelivered
    fresh = [{**r, "request_id": f"{r['request_id']}-b"} for r in rows[:2]]
    assert store.add_requests(fresh, ingest_key="w1:8") == 2
    assert store.request_stats("m", now - timedelta(hours=1))["count"] == 8
    # Keys are per table: the same batch may also carry exit profiles.
    assert store.add_exit_profiles(_profiles(now), ingest_key="w1:7") == 4
    assert store.add_exit_profiles(_profiles(now), ingest_key="w1:7") == 0
    assert store.exit_profile_summary("m", now - timedelta(hours=1))[0]["windows"] == 2
    assert store.add_requests([], ingest_key="empty") == 0 and store.add_requests([]) == 0
    assert store.prune_ingested(utcnow() + timedelta(seconds=1)) == 4
    assert store.add_requests(rows[:1], ingest_key="w1:8") == 1  # forgotten after pruning
    assert store.request_stats("m", now - timedelta(hours=1))["count"] == 8  # one row per id


def test_workers_upsert(store: Store) -> None:
    t0 = datetime(2030, 1, 1, 12, 0)
    store.upsert_worker("w-b", "m", 1, 4, 7, "h1", 11, "up", t0)
    store.upsert_worker("w-a", "m", 0, 0, 3, "h1", 10, "up", t0)
    store.upsert_worker("w-c", "other", 0, 0, 9, "h2", 12, "up", t0)
    store.upsert_worker("w-a", "m", 0, 0, 3, "h1", 10, "busy", t0 + timedelta(seconds=1))
    workers = store.workers("m")
    assert [w["worker_id"] for w in workers] == ["w-a", "w-b"]
    assert workers[0] == {
        "worker_id": "w-a",
        "model": "m",
        "stage": 0,
        "first_block": 0,
        "last_block": 3,
        "host": "h1",
        "pid": 10,
        "status": "busy",
        "started_at": t0,
        "last_seen": t0 + timedelta(seconds=1),
        "device": None,
        "straggler_since": None,
    }
    store.upsert_worker("w-a", "m", 0, 0, 3, "h1", 99, "up", t0 + timedelta(seconds=5))  # restarted
    assert store.workers("m")[0]["started_at"] == t0 + timedelta(seconds=5)
    assert len(store.workers()) == 3


def test_request_statuses_by_prefix_and_ids(store: Store) -> None:
    now = utcnow()
    rows = [{"request_id": rid, "model": m, "received_at": now, "status": status}
            for rid, m, status in [("ca-1", "m", "ok"), ("ca-1", "n", "bad_request"),
                                   ("ca-2", "n", "overloaded"), ("c%-3", "m", "ok"),
                                   ("cb-1", "m", "ok"), ("x", "m", "ok")]]
    store.add_requests(rows)
    got = sorted(store.request_statuses("ca-"))
    assert got == [("ca-1", "bad_request"), ("ca-1", "ok"), ("ca-2", "overloaded")]
    # the prefix is literal (no LIKE wildcards); listed ids add rows, each row once
    assert sorted(store.request_statuses("c%", ["x", "ca-2"])) == [
        ("c%-3", "ok"), ("ca-2", "overloaded"), ("x", "ok")]
    assert store.request_statuses("", ["cb-1"]) == [("cb-1", "ok")]
    assert store.request_statuses("zz") == []


def test_a_request_keeps_one_row_its_first(store: Store) -> None:
    """A resend served twice (same id) or its records stored again add no second row;
    requests too malformed to carry an id ("") are all kept."""
    now = utcnow()
    first = {"request_id": "dup", "model": "m", "received_at": now, "latency_ms": 1.0,
             "status": "deadline_exceeded"}
    assert store.add_requests([first], "a:1") == 1
    store.add_requests([{**first, "status": "ok", "latency_ms": 9.0}], "b:1")
    store.add_requests([{**first, "model": "other"}], "c:1")  # ids are per model
    for key in ("d:1", "d:2"):
        store.add_requests([{**first, "request_id": "", "status": "bad_request"}], key)
    stats = store.request_stats("m", now - timedelta(hours=1))
    assert stats["count"] == 3 and stats["errors"] == 3  # dup once (its first), "" twice
    assert store.request_stats("other", now - timedelta(hours=1))["count"] == 1

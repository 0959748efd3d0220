"""The store's E3 history (revision 0006): batch profiles, deployment plans and worker
marks, on SQLite and (when configured) PostgreSQL."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta

import pytest
from sqlalchemy import text

from services.store import Store

T0 = datetime(2026, 11, 26, 12, 0, 0)
W = timedelta(seconds=10)


def test_forecast_then_observed_fills_one_row_per_window_and_ramp(store: Store) -> None:
    store.record_forecast("m", T0, T0 + W, {2: (0.6, 0.5), 5: (0.3, 0.25)}, config_version=3)
    assert store.record_observed("m", T0, T0 + W, {2: (40, 0.45), 5: (40, 0.3)},
                                 config_version=3, drifted=True) == 2
    rows = store.batch_profiles("m")
    assert [(r["ramp"], r["samples"], r["observed"], r["forecast"], r["forecast_naive"])
            for r in rows] == [(2, 40, 0.45, 0.6, 0.5), (5, 40, 0.3, 0.3, 0.25)]
    assert rows[0]["error"] == pytest.approx(0.15)
    assert rows[1]["error"] == pytest.approx(0.0)
    assert all(r["drifted"] is True and r["config_version"] == 3 for r in rows)


def test_observed_first_then_forecast_and_windows_without_a_forecast(store: Store) -> None:
    store.record_observed("m", T0, T0 + W, {2: (10, 0.5)})  # no forecast for the first window
    assert store.batch_profiles("m")[0]["error"] is None
    store.record_forecast("m", T0 + W, T0 + 2 * W, {2: (0.5, 0.5)})  # the next, not observed
    store.record_forecast("m", T0, T0 + W, {2: (0.7, 0.5)})  # late forecast of the first
    first, second = store.batch_profiles("m")
    assert first["error"] == pytest.approx(0.2)
    assert second["observed"] is None and second["samples"] is None and second["error"] is None


def test_batch_profiles_filter_by_time_ramp_and_model(store: Store) -> None:
    for k in range(4):
        start = T0 + k * W
        store.record_observed("m", start, start + W, {1: (5, 0.9 - 0.1 * k), 3: (5, 0.2)})
    store.record_observed("other", T0, T0 + W, {1: (5, 0.1)})
    assert len(store.batch_profiles("m")) == 8
    recent = store.batch_profiles("m", since=T0 + 2 * W, ramp=1)
    assert [r["observed"] for r in recent] == pytest.approx([0.7, 0.6])
    assert store.batch_profiles("nobody") == []


def test_plans_are_versioned_and_the_newest_is_in_force(store: Store) -> None:
    assert store.latest_plan("m") is None
    first = store.save_plan("m", "first plan", True, 120.0, 80.0, 9.5,
                            {"stages": [{"first_block": 0, "last_block": 4}]}, {"rate": 100.0})
    second = store.save_plan("m", "drift: ramp 2 off by 0.2", False, 0.0, 0.0, 0.0,
                             {"stages": []}, {"rate": 300.0})
    assert (first["version"], second["version"]) == (1, 2)
    latest = store.latest_plan("m")
    assert latest is not None and latest["version"] == 2 and latest["feasible"] is False
    assert latest["reason"].startswith("drift")
    assert [p["version"] for p in store.deployment_plans("m")] == [1, 2]
    assert [p["version"] for p in store.deployment_plans("m", since_version=1)] == [2]
    assert store.deployment_plans("m")[0]["plan"] == {"stages": [{"first_block": 0,
                                                                  "last_block": 4}]}
    assert store.deployment_plans("m")[0]["inputs"] == {"rate": 100.0}


def test_concurrent_plan_writers_get_distinct_versions(store: Store) -> None:
    with ThreadPoolExecutor(4) as pool:
        rows = list(pool.map(lambda k: store.save_plan("m", f"r{k}", True, 1, 1, 1, {}, {}),
                             range(8)))
    assert sorted(r["version"] for r in rows) == list(range(1, 9))


def test_a_plan_that_is_not_json_is_refused_before_writing(store: Store) -> None:
    with pytest.raises(TypeError):
        store.save_plan("m", "bad", True, 1, 1, 1, {"x": object()}, {})
    assert store.latest_plan("m") is None


def test_which_plan_served_a_model_at_a_time_in_one_query(store: Store) -> None:
    """The README's query: the newest plan created at or before t, and why."""
    store.save_plan("m", "first", True, 1, 1, 1, {}, {})
    with store.engine.begin() as conn:
        conn.execute(text("UPDATE deployment_plans SET created_at = :t"), {"t": T0})
    store.save_plan("m", "timer", True, 1, 1, 1, {}, {})
    query = text("SELECT version, reason FROM deployment_plans WHERE model = :m "
                 "AND created_at <= :t ORDER BY created_at DESC LIMIT 1")
    with store.engine.connect() as conn:
        assert tuple(conn.execute(query, {"m": "m", "t": T0 + W}).one()) == (1, "first")


def test_workers_carry_their_device_class_and_straggler_mark(store: Store) -> None:
    store.upsert_worker("w-1", "m", 0, 0, 3, "h", 10, "up", T0, "cpu-2c")
    store.upsert_worker("w-2", "m", 0, 0, 3, "h", 11, "up", T0)
    assert store.mark_straggler("w-1", T0 + W)
    assert not store.mark_straggler("w-9", T0)
    by_id = {w["worker_id"]: w for w in store.workers("m")}
    assert by_id["w-1"]["device"] == "cpu-2c" and by_id["w-2"]["device"] is None
    assert by_id["w-1"]["straggler_since"] == T0 + W
    store.upsert_worker("w-1", "m", 0, 0, 3, "h", 10, "up", T0 + 2 * W, "cpu-2c")
    assert store.workers("m")[0]["straggler_since"] == T0 + W  # a heartbeat keeps the mark
    store.mark_straggler("w-1", None)
    assert store.workers("m")[0]["straggler_since"] is None


def test_ensure_exit_mode_makes_a_new_version_only_when_the_mode_differs(store: Store) -> None:
    assert store.ensure_exit_mode("m", "compute", "x") is None  # no config yet
    store.save_exit_config("m", {0: 0.3, 1: 0.0}, [0], "latency", "first", {0: "h.onnx"})
    row = store.ensure_exit_mode("m", "compute", "compute mode: test")
    assert row is not None and (row.version, row.mode) == (2, "compute")
    latest = store.latest_exit_config("m")
    assert (latest.thresholds, latest.active, latest.heads) == ({0: 0.3, 1: 0.0}, [0],
                                                                {0: "h.onnx"})
    assert store.ensure_exit_mode("m", "compute", "again") is None

"""Revision 0002 (tuning tables) and its repository functions, on SQLite and (when
configured) PostgreSQL."""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import json
import logging
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect, select, text

from services.common import config
from services.profiler.service import Profiler, expected_keys
from services.runtime.manifest import Manifest
from services.store import Store, migrate
from services.store.db import make_engine, utcnow
from services.store.tables import Base, RampUtility

NEW_TABLES = {"latency_profiles", "ramp_utilities", "tuner_state"}
RAMP_COLUMNS_0001 = ["id", "model_id", "idx", "site", "arch", "params", "agreement", "cost_ms"]

MANIFEST: dict[str, Any] = {
    "name": "tiny",
    "version": "1",
    "kind": "classifier",
    "classes": 10,
    "blocks": [{"index": i, "file": f"block{i}.onnx", "sha256": f"b{i}"} for i in range(3)],
    "ramps": [
        {
            "index": 0,
            "after_block": 0,
            "file": "ramp0.onnx",
            "sha256": "r0",
            "arch": "gap_fc",
            "params": 100,
            "agreement": 0.7,
            "cost_ms": 0.1,
            "site": "/0/Relu_output_0",
            "cost_by_batch": {"1": 0.1, "4": 0.15, "16": 0.3},
        },
        {  # written before manifests named the tensor or measured batch costs
            "index": 1,
            "after_block": 1,
            "file": "ramp1.onnx",
            "sha256": "r1",
            "arch": "gap_fc",
            "params": 200,
            "agreement": 0.8,
            "cost_ms": 0.2,
        },
    ],
}






def _schema(url: str) -> tuple[set[str], list[str], dict[str, set[tuple[str, ...]]]]:
    """Tables, ramps' columns and every table's indexes."""
    engine = make_engine(url)
    try:
        insp = inspect(engine)
        tables = set(insp.get_table_names()) - {"alembic_version"}
        columns = [c["name"] for c in insp.get_columns("ramps")] if "ramps" in tables else []
        indexes = {t: {tuple(i["column_names"]) for i in insp.get_indexes(t)} for t in tables}
        return tables, columns, indexes
    finally:
        engine.dispose()


def _drift(url: str) -> list[Any]:
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            ctx = MigrationContext.configure(conn, opts={"compare_type": True})
            return compare_metadata(ctx, Base.metadata)
    finally:
        engine.dispose()


def test_upgrade_downgrade_round_trip_keeps_data(url: str) -> None:
    migrate.upgrade(url, "0001_initial")
    with Store(url) as s:  # a 0001 store with a model and its ramps in it
        engine = s.engine
        with engine.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO models (id, name, version, kind, manifest, path, created_at, "
                    "updated_at) VALUES (1, 'm', '1', 'c', :manifest, '/m', :t, :t)"
                ),
                {"t": utcnow(), "manifest": json.dumps({"ramps": MANIFEST["ramps"]})},
            )
            conn.execute(
                text(
                    "INSERT INTO ramps (model_id, idx, site, cost_ms) "
                    "VALUES (1, 0, 0, 0.5), (1, 1, 1, 0.6)"
                )
            )

    migrate.upgrade(url)
    assert migrate.current(url) == migrate.head()
    tables, columns, indexes = _schema(url)
    assert NEW_TABLES <= tables
    assert columns == [*RAMP_COLUMNS_0001, "tensor", "cost_by_batch"]
    assert ("model", "device") in indexes["latency_profiles"]
    assert ("model", "at") in indexes["ramp_utilities"]
    assert _drift(url) == []
    with Store(url) as s:  # filled from the manifest the store already held
        assert [(r["tensor"], r["cost_by_batch"], r["cost_ms"]) for r in s.ramps("m")] == [
            ("/0/Relu_output_0", {"1": 0.1, "4": 0.15, "16": 0.3}, 0.5),
            (None, None, 0.6),
        ]

    migrate.downgrade(url, "0001_initial")
    assert migrate.current(url) == "0001_initial"
    tables, columns, _ = _schema(url)
    assert not NEW_TABLES & tables and "ramps" in tables
    assert columns == RAMP_COLUMNS_0001
    engine = make_engine(url)
    try:
        with engine.connect() as conn:  # the rebuilt table kept its rows and constraints
            rows = conn.execute(text("SELECT idx, site, cost_ms FROM ramps ORDER BY idx")).all()
            assert [tuple(r) for r in rows] == [(0, 0, 0.5), (1, 1, 0.6)]
        uniques = {
            tuple(u["column_names"]) for u in inspect(engine).get_unique_constraints("ramps")
        }
        fks = [fk["referred_table"] for fk in inspect(engine).get_foreign_keys("ramps")]
        assert ("model_id", "idx") in uniques and fks == ["models"]
    finally:
        engine.dispose()

    migrate.upgrade(url)
    assert _drift(url) == []
    migrate.downgrade(url, "base")
    assert _schema(url)[0] == set()


def test_latency_profile_upsert(store: Store) -> None:
    rows = [
        {"kind": "block", "idx": i, "batch_size": b, "ms": 0.1 * (i + 1) * b, "runs": 20}
        for i in range(2)
        for b in (1, 4)
    ]
    rows.append({"kind": "full", "idx": 7, "batch_size": 1, "ms": 0.5, "runs": 20})
    assert store.save_latency_profile("m", "cpu-2c", rows) == 5
    store.save_latency_profile("m", "GPU X", rows[:1])  # another device class
    store.save_latency_profile("other", "cpu-2c", rows[:1])
    got = store.latency_profile("m", "cpu-2c")
    assert [(r["kind"], r["idx"], r["batch_size"]) for r in got] == [
        ("block", 0, 1),
        ("block", 0, 4),
        ("block", 1, 1),
        ("block", 1, 4),
        ("full", -1, 1),  # 'full' is always idx -1
    ]
    assert got[3]["ms"] == pytest.approx(0.8) and got[3]["runs"] == 20
    assert abs(got[0]["measured_at"] - utcnow()) < timedelta(minutes=1)

    at = datetime(2030, 1, 1, 17, 0, tzinfo=timezone(timedelta(hours=5)))
    again = [
        {**rows[0], "ms": 9.0, "runs": 3, "measured_at": at},
        {**rows[0], "ms": 1.0, "runs": 5, "measured_at": at},  # last one wins
        {"kind": "ramp", "idx": 0, "batch_size": 1, "ms": 0.05, "runs": 5},
    ]
    assert store.save_latency_profile("m", "cpu-2c", again) == 2
    got = store.latency_profile("m", "cpu-2c")
    assert len(got) == 6
    assert (got[0]["ms"], got[0]["runs"], got[0]["measured_at"]) == (
        1.0,
        5,
        datetime(2030, 1, 1, 12, 0),
    )
    assert got[-1]["kind"] == "ramp"

    assert store.save_latency_profile("m", "cpu-2c", again[2:], replace=True) == 1
    assert [r["kind"] for r in store.latency_profile("m", "cpu-2c")] == ["ramp"]
    assert len(store.latency_profile("m", "GPU X")) == 1  # other profiles untouched
    assert store.latency_profile("nope", "cpu-2c") == []
    with pytest.raises(ValueError):
        store.save_latency_profile("m", "cpu-2c", [{**rows[0], "kind": "layer"}])


def test_tuner_state_upsert_and_read(store: Store) -> None:
    assert store.tuner_state("m") is None
    state = {"round": 3, "thresholds": {"0": 0.5}, "active": [0, 2], "history": [1.5, None]}
    store.save_tuner_state("m", state, 4)
    got = store.tuner_state("m")
    assert got is not None
    assert (got["model"], got["state"], got["config_version"]) == ("m", state, 4)
    first_at = got["updated_at"]
    assert abs(first_at - utcnow()) < timedelta(minutes=1) and first_at.tzinfo is None

    store.save_tuner_state("m", {"round": 4}, 5)
    store.save_tuner_state("n", {}, 1)
    got = store.tuner_state("m")
    assert got is not None and (got["state"], got["config_version"]) == ({"round": 4}, 5)
    assert got["updated_at"] >= first_at
    with pytest.raises(TypeError):
        store.save_tuner_state("m", {"bad": object()}, 6)
    assert store.tuner_state("m")["state"] == {"round": 4}  # type: ignore[index]


def test_ramp_utilities_insert(store: Store) -> None:
    at = datetime(2030, 1, 1, 12, 0)
    rows = [
        {
            "model": "m",
            "round": 2,
            "config_version": 7,
            "ramp": r,
            "exits": 10 * r,
            "saved_ms": 1.5 * r,
            "added_ms": 0.5,
            "utility_ms": 1.5 * r - 0.5,
            "action": "deactivate_and_trial" if r == 0 else "keep",
            "at": at,
        }
        for r in range(3)
    ]
    rows.append({**rows[0], "round": 3, "action": "add_earlier", "at": None})  # at: now
    del rows[-1]["config_version"]
    assert store.add_ramp_utilities(rows) == 4
    assert store.add_ramp_utilities([]) == 0
    with store.engine.connect() as conn:
        u = RampUtility
        got = conn.execute(
            select(u.round, u.config_version, u.ramp, u.exits, u.utility_ms, u.action, u.at)
            .where(u.model == "m")
            .order_by(u.round, u.ramp)
        ).all()
    assert [tuple(g[:6]) for g in got] == [
        (2, 7, 0, 0, -0.5, "deactivate_and_trial"),
        (2, 7, 1, 10, 1.0, "keep"),
        (2, 7, 2, 20, 2.5, "keep"),
        (3, None, 0, 0, -0.5, "add_earlier"),
    ]
    assert got[0][6] == at and abs(got[3][6] - utcnow()) < timedelta(minutes=1)


def test_register_model_fills_ramp_tensor_and_costs(store: Store) -> None:
    store.register_model(MANIFEST, "/m/1")
    ramps = store.ramps("tiny")
    assert [(r["index"], r["after_block"], r["tensor"], r["cost_by_batch"]) for r in ramps] == [
        (0, 0, "/0/Relu_output_0", {"1": 0.1, "4": 0.15, "16": 0.3}),
        (1, 1, None, None),
    ]
    v2 = copy.deepcopy(MANIFEST)
    v2["version"] = "2"
    v2["ramps"][1].update(site="/1/Relu_output_0", cost_by_batch={4: 0.4, 1: 0.2})
    store.register_model(v2, "/m/2")
    assert [(r["tensor"], r["cost_by_batch"]) for r in store.ramps("tiny")] == [
        ("/0/Relu_output_0", {"1": 0.1, "4": 0.15, "16": 0.3}),
        ("/1/Relu_output_0", {"1": 0.2, "4": 0.4}),
    ]


def test_profiler_service_profiles_each_model_version_once(store: Store, models_dir: Path) -> None:
    """The profiler's poll against a real store and the prepared `tiny` model."""
    tiny = models_dir / "tiny"
    manifest = Manifest.load(tiny).to_dict()
    store.register_model(manifest, str(tiny))
    store.register_model({**manifest, "name": "ghost"}, "/nonexistent/ghost")  # not on this host
    cfg = dataclasses.replace(config.load(), device="cpu", ort_threads=1)
    log = logging.getLogger("test.profiler")

    def poll(p: Profiler) -> int:
        return asyncio.run(p.poll())

    profiler = Profiler(cfg, store, log, batch_sizes=(1, 2))
    assert profiler.device.startswith("cpu-")
    assert poll(profiler) == 1  # tiny; ghost failed and waits for its retry
    rows = store.latency_profile("tiny", profiler.device)
    assert {(r["kind"], r["idx"], r["batch_size"]) for r in rows} == expected_keys(manifest, (1, 2))
    assert all(r["ms"] > 0 for r in rows) and store.latency_profile("ghost", profiler.device) == []
    assert poll(profiler) == 0
    assert poll(Profiler(cfg, store, log, batch_sizes=(1, 2))) == 0  # a restart: profile is fresh

    with store.engine.begin() as conn:  # the model was re-registered after it was profiled
        conn.execute(
            text("UPDATE latency_profiles SET measured_at = :t"),
            {"t": utcnow() - timedelta(days=1)},
        )
    assert poll(Profiler(cfg, store, log, batch_sizes=(1, 2))) == 1
    assert min(r["measured_at"] for r in store.latency_profile("tiny", profiler.device)) > (
        utcnow() - timedelta(hours=1)
    )


def test_ramp_heads_are_versioned_idempotent_and_resumable(store: Store) -> None:
    verdict = {"serving_agreement": 0.5, "agreement": 0.9, "serving_calibration": 0.2,
               "calibration": 0.05}
    store.save_ramp_head("m", 3, 1, "ramp_3.v1.aaaaaaaaaaaa.onnx", "a" * 64, 768, 256, verdict)
    store.save_ramp_head("m", 3, 1, "ramp_3.v1.aaaaaaaaaaaa.onnx", "a" * 64, 768, 256, verdict)
    store.save_ramp_head("m", 3, 2, "ramp_3.v2.bbbbbbbbbbbb.onnx", "b" * 64, 768, 256,
                         {**verdict, "agreement": 0.95})
    store.save_ramp_head("m", 1, 1, "ramp_1.v1.cccccccccccc.onnx", "c" * 64, 100, 30, verdict)
    store.save_ramp_head("other", 3, 1, "x.onnx", "d" * 64, 1, 1, verdict)
    rows = store.ramp_heads("m")
    assert [(r["ramp"], r["version"]) for r in rows] == [(1, 1), (3, 1), (3, 2)]
    latest = store.latest_ramp_heads("m")
    assert set(latest) == {1, 3} and latest[3]["version"] == 2 and latest[3]["agreement"] == 0.95
    assert latest[3]["file"].startswith("ramp_3.v2.") and latest[3]["judged_on"] == 256
    assert store.latest_ramp_heads("none") == {}

"""The optimizer service against a real store (and a real bus for the broadcast): plans
made for the pool in the store, stored with inputs and reason, re-made on inventory change
and drift, and resumed after a restart."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from schemas import subjects
from schemas.codec import unpack
from schemas.plans import Plan
from services.common import bus, config
from services.launcher.natsserver import EmbeddedNats
from services.optimizer.replan import UNMEASURED
from services.optimizer.service import Optimizer
from services.store import Store
from services.store.db import utcnow

LOG = logging.getLogger("test")
MANIFEST: dict[str, Any] = {
    "name": "m", "version": "1", "kind": "classifier", "classes": 10,
    "blocks": [{"index": i, "file": f"block{i}.onnx", "sha256": f"b{i}",
                "output_shape": [8, 4, 4] if i < 3 else [10]} for i in range(4)],
    "ramps": [{"index": r, "after_block": r, "file": f"ramp{r}.onnx", "sha256": f"r{r}",
               "arch": "gap_fc", "params": 10, "agreement": 0.9, "cost_ms": 0.01}
              for r in range(3)],
}


def cfg(tmp_path: Path, url: str, **kw: Any) -> config.Config:
    base = config.load()
    return dataclasses.replace(base, home=tmp_path, database_url=url, models=("m",),
                               default_slo_ms=1000.0, max_batch=16, **kw)


def profile(store: Store, device: str, block_ms: float = 1.0) -> None:
    rows = [{"kind": "block", "idx": k, "batch_size": b, "ms": block_ms * (0.5 + b / 4),
             "runs": 3} for k in range(4) for b in (1, 4, 16)]
    rows += [{"kind": "ramp", "idx": r, "batch_size": b, "ms": 0.01 * b, "runs": 3}
             for r in range(3) for b in (1, 4, 16)]
    store.save_latency_profile("m", device, rows, True)


def pool(store: Store, *ids: str, device: str = "cpu-2c") -> None:
    for i in ids:
        store.upsert_worker(i, "", -1, 0, 0, "h", 1, "pool", utcnow(), device)


@pytest.fixture
def ready(store: Store, tmp_path: Path) -> Store:
    store.register_model(MANIFEST, str(tmp_path))
    profile(store, "cpu-2c")
    pool(store, "pool-a", "pool-b")
    return store


def test_first_plan_is_stored_with_inputs_and_assigns_the_pool(ready: Store, tmp_path, url):
    opt = Optimizer(None, cfg(tmp_path, url), ready, LOG)
    plan, new = opt.consider("m", 1000.0)
    assert new and plan is not None and plan.feasible and plan.version == 1
    assert plan.reason.startswith("first plan")
    assert {w for s in plan.stages for w in s.workers} <= {"pool-a", "pool-b"}
    assert plan.stages[0].first_block == 0 and plan.stages[-1].last_block == 4
    row = ready.latest_plan("m")
    assert row["version"] == 1 and Plan.decode(row["plan"]) == plan
    assert row["inputs"]["inventory"] == {"cpu-2c": ["pool-a", "pool-b"]}
    assert row["inputs"]["probe_ramps"] == [0, 1, 2]  # no forecast yet: every ramp runs
    assert row["inputs"]["optimizer_ms"] >= 0
    again, new = opt.consider("m", 1010.0)  # nothing changed
    assert not new and again == plan and len(ready.deployment_plans("m")) == 1


def test_inventory_change_and_drift_make_new_versions(ready: Store, tmp_path, url) -> None:
    opt = Optimizer(None, cfg(tmp_path, url), ready, LOG)
    opt.consider("m", 1000.0)
    pool(ready, "pool-c")
    plan, new = opt.consider("m", 1010.0)
    assert new and plan.version == 2 and plan.reason.startswith("inventory: +pool-c@cpu-2c")
    start = utcnow().replace(microsecond=0)
    ready.record_forecast("m", start, start + timedelta(seconds=10), {0: (0.5, 0.5)})
    ready.record_observed("m", start, start + timedelta(seconds=10), {0: (50, 0.1)},
                          drifted=True)
    plan, new = opt.consider("m", 1020.0)
    assert new and plan.version == 3 and plan.reason.startswith("drift")
    assert ready.latest_plan("m")["inputs"]["forecast"] == {"0": 0.5}
    plan, new = opt.consider("m", 1020.0 + 120.0)
    assert new and plan.reason.startswith("timer")


def test_the_rate_of_a_stream_that_just_began_is_not_diluted(ready: Store, tmp_path, url):
    """A 30 s span (3 windows of 10 s): 40 requests over its last 2 s have no rate yet (a
    stream younger than a window); 60 over its last 15 s read 4 req/s over those 15 s,
    where the whole span would read 2."""
    opt = Optimizer(None, cfg(tmp_path, url, profile_window_s=10.0), ready, LOG)
    assert opt.rate("m") == 0.0
    now = utcnow()
    ready.add_requests([{"request_id": f"q{i}", "model": "m", "status": "ok",
                         "received_at": now - timedelta(seconds=2 * i / 40)} for i in range(40)])
    assert opt.rate("m") == UNMEASURED
    ready.add_requests([{"request_id": f"r{i}", "model": "m", "status": "ok",
                         "received_at": now - timedelta(seconds=15 * i / 19)} for i in range(20)])
    assert opt.rate("m") == pytest.approx(60 / 15, rel=0.02)


def test_until_the_rate_is_measured_the_plan_is_the_whole_pool_s(ready: Store, tmp_path, url):
    """A stream's first seconds: the plan takes every pool worker (a trickle's plan would
    leave a burst on one); once a window has passed, the measured rate sizes it down."""
    pool(ready, "pool-c", "pool-d")
    opt = Optimizer(None, cfg(tmp_path, url, profile_window_s=10.0), ready, LOG)
    now = utcnow()
    ready.add_requests([{"request_id": f"q{i}", "model": "m", "status": "ok",
                         "received_at": now - timedelta(seconds=i / 10)} for i in range(5)])
    plan, new = opt.consider("m", 1000.0)
    assert new and "sized for the whole pool until the rate is measured" in plan.reason
    assert sum(len(s.workers) for s in plan.stages) == 4
    row = ready.latest_plan("m")
    assert row["inputs"]["rate_rps"] is None
    restarted = Optimizer(None, cfg(tmp_path, url, profile_window_s=10.0), ready, LOG)
    plan, new = restarted.consider("m", 1001.0)  # still unmeasured: nothing to re-plan
    assert not new
    ready.add_requests([{"request_id": f"r{i}", "model": "m", "status": "ok",
                         "received_at": now - timedelta(seconds=12 + i)} for i in range(5)])
    plan, new = restarted.consider("m", 1002.0)
    assert new and plan.reason.startswith("load: ") and "before it was measured" in plan.reason
    assert sum(len(s.workers) for s in plan.stages) < 4
    assert ready.latest_plan("m")["inputs"]["rate_rps"] == pytest.approx(10 / 16, rel=0.05)


def test_a_restarted_optimizer_resumes_from_the_stored_plan(ready: Store, tmp_path, url):
    Optimizer(None, cfg(tmp_path, url), ready, LOG).consider("m", 1000.0)
    plan, new = Optimizer(None, cfg(tmp_path, url), ready, LOG).consider("m", 1030.0)
    assert not new and plan.version == 1


def test_no_plan_keeps_the_one_in_force_and_says_why(ready: Store, tmp_path, url) -> None:
    opt = Optimizer(None, cfg(tmp_path, url), ready, LOG)
    first, _ = opt.consider("m", 1000.0)
    ready.upsert_worker("pool-a", "", -1, 0, 0, "h", 1, "pool", utcnow() - timedelta(minutes=1),
                        "cpu-2c")
    ready.upsert_worker("pool-b", "", -1, 0, 0, "h", 1, "pool", utcnow() - timedelta(minutes=1),
                        "cpu-2c")
    pool(ready, "pool-g", device="gpu-unprofiled")
    plan, new = opt.consider("m", 1010.0)
    assert not new and plan == first  # still in force
    latest = ready.latest_plan("m")
    assert latest["version"] == 2 and latest["feasible"] is False
    assert "no plan" in latest["reason"] and "without a latency profile: gpu-unprofiled" \
        in latest["reason"]


def test_plans_are_broadcast_on_the_bus(ready: Store, tmp_path: Path, url: str) -> None:
    async def run() -> list[Plan]:
        with EmbeddedNats(tmp_path / "nats") as srv:
            nc = await bus.connect(srv.url, "test")
            got: list[Plan] = []

            async def on_plan(msg: Any) -> None:
                got.append(Plan.decode(unpack(msg.data)))

            await nc.subscribe(subjects.plan("m"), cb=on_plan)
            opt = Optimizer(nc, cfg(tmp_path, url), ready, LOG)
            await opt.tick()
            await opt.tick()  # the plan in force again: a worker that missed it catches up
            await nc.flush()
            await asyncio.sleep(0.2)
            await bus.close(nc)
            return got

    got = asyncio.run(run())
    assert [p.version for p in got] == [1, 1]


def test_a_straggler_is_marked_and_left_out_of_the_next_plan(ready: Store, tmp_path, url):
    from types import SimpleNamespace

    from schemas.heartbeat import Heartbeat

    opt = Optimizer(None, cfg(tmp_path, url), ready, LOG)
    opt.consider("m", 1000.0)

    def beat(pool: str, ms_per_batch: float) -> SimpleNamespace:
        # 4 batches of 16 over blocks 0..3; the profile says 4 x (0.5 + 16 / 4) = 18 ms each
        return SimpleNamespace(data=Heartbeat(f"m-s0-{pool[-1]}", "m", 0, 1, 2, 0, 4,
                                              pool=pool, ran=4, ran_rows=64,
                                              ran_ms=4 * ms_per_batch).encode())

    for _ in range(3):
        asyncio.run(opt.on_heartbeat(beat("pool-a", 40.0)))  # 2.2x its profile
        asyncio.run(opt.on_heartbeat(beat("pool-b", 18.0)))
        opt.check_stragglers()
    marks = {w["worker_id"]: w["straggler_since"] for w in ready.workers()}
    assert marks["pool-a"] is not None and marks["pool-b"] is None
    plan, new = opt.consider("m", 1010.0)
    assert new and plan.reason.startswith("inventory: -pool-a@cpu-2c")
    assert "pool-a" not in {w for s in plan.stages for w in s.workers}
    pool(ready, "pool-a")  # still alive and heartbeating: the mark stays
    assert next(w for w in ready.workers() if w["worker_id"] == "pool-a")["straggler_since"]

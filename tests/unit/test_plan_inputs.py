"""What the optimizer plans from (services.optimizer.plan_inputs) and when it re-plans
(services.optimizer.replan)."""

from __future__ import annotations

import math
from datetime import datetime, timedelta

import pytest

from services.optimizer import plan_inputs as pi
from services.optimizer.replan import (
    UNMEASURED,
    Basis,
    inventory_change,
    rate_moved,
    replan_reason,
    request_rate,
)
from services.optimizer.splits import plan

T = datetime(2026, 11, 26, 12, 0, 0)
MANIFEST = {
    "blocks": [{"index": i, "output_shape": [8, 2, 2] if i < 3 else [10]} for i in range(4)],
    "ramps": [{"index": 7, "after_block": 2}, {"index": 5, "after_block": 0}],
}
GEO = pi.geometry(MANIFEST)


def profile_rows(block_ms: float = 1.0, sizes=(1, 4, 16)) -> list[dict]:
    rows = [{"kind": "block", "idx": k, "batch_size": b, "ms": block_ms * b} for k in range(4)
            for b in sizes]
    rows += [{"kind": "ramp", "idx": r, "batch_size": b, "ms": 0.01 * b} for r in (5, 7)
             for b in sizes]
    return rows + [{"kind": "full", "idx": -1, "batch_size": 1, "ms": 4.0}]


def test_geometry_orders_ramps_by_site_and_sizes_activations() -> None:
    assert GEO.n_blocks == 4 and GEO.ramp_ids == (5, 7) and GEO.ramp_after == (0, 2)
    assert GEO.bytes_per_sample == (128.0, 128.0)  # 8 x 2 x 2 floats
    text = pi.geometry({"blocks": [{"index": 0, "output_shape": [-1, 4]}],
                        "ramps": [{"index": 0, "after_block": 0}]})
    assert text.bytes_per_sample == (4.0 * pi.DYNAMIC_DIM * 4,)


def test_latest_forecast_and_survival_carry_over_ramps_without_one() -> None:
    rows = [{"ramp": 5, "window_start": T, "forecast": 0.9},
            {"ramp": 5, "window_start": T + timedelta(seconds=10), "forecast": 0.6},
            {"ramp": 7, "window_start": T, "forecast": None}]
    forecast = pi.latest_forecast(rows)
    assert forecast == {5: 0.6}
    assert pi.survival(GEO, forecast) == (0.6, 0.6)        # ramp 7: exits nothing known
    assert pi.survival(GEO, {}) == (1.0, 1.0)
    assert pi.survival(GEO, {5: 0.5, 7: 0.7}) == (0.5, 0.5)  # made non-increasing


def test_a_switched_off_ramps_old_forecast_stays_within_the_running_ramps_around_it():
    geo = pi.ModelGeometry(4, (1, 2, 3), (0, 1, 2), (4.0, 4.0, 4.0))
    rows = [{"ramp": 1, "window_start": T, "forecast": 0.7},
            {"ramp": 2, "window_start": T, "forecast": 0.5},  # then switched off
            {"ramp": 3, "window_start": T, "forecast": 0.4},
            {"ramp": 1, "window_start": T + timedelta(seconds=10), "forecast": 0.75},
            {"ramp": 3, "window_start": T + timedelta(seconds=10), "forecast": 0.6}]
    forecast, now = pi.latest_forecast(rows), pi.current_ramps(rows)
    assert now == {1, 3} and forecast == {1: 0.75, 2: 0.5, 3: 0.6}
    # taken as it is, ramp 2's 0.5 would claim every exit the running ramp 3 makes
    assert pi.survival(geo, forecast) == (0.75, 0.5, 0.5)
    assert pi.survival(geo, forecast, now) == (0.75, 0.6, 0.6)
    inside = {1: 0.75, 2: 0.7, 3: 0.6}  # within the bounds: kept
    assert pi.survival(geo, inside, now) == (0.75, 0.7, 0.6)
    assert pi.current_ramps([]) == frozenset()


def test_latency_table_uses_only_complete_batch_sizes() -> None:
    rows = profile_rows()
    table = pi.latency_table(rows, GEO)
    assert table is not None and table.batch_sizes == (1, 4, 16)
    partial = [r for r in rows if not (r["batch_size"] == 16 and r["kind"] == "ramp")]
    assert pi.latency_table(partial, GEO).batch_sizes == (1, 4)
    assert pi.latency_table([r for r in rows if r["kind"] != "ramp"], GEO) is None


def test_pool_inventory_keeps_live_pool_workers_that_are_not_stragglers() -> None:
    def w(i, **kw):
        return {"worker_id": i, "status": "pool", "device": "cpu-2c", "last_seen": T,
                "straggler_since": None, **kw}

    rows = [w("b"), w("a"), w("g", device="gpu"), w("old", last_seen=T - timedelta(seconds=7)),
            w("slow", straggler_since=T), w("fixed", status="up"), w("nodev", device=None)]
    assert pi.pool_inventory(rows, T, fresh_s=6.0) == {"cpu-2c": ("a", "b"), "gpu": ("g",)}


def test_problem_leaves_out_classes_without_a_profile() -> None:
    tables = {"cpu-2c": pi.latency_table(profile_rows(), GEO)}
    p = pi.problem(GEO, {5: 0.5}, tables, {"cpu-2c": ("a", "b"), "gpu": ("g",)}, 50.0,
                   pi.Targets(slo_ms=1000.0, batch=16))
    assert [c.name for c in p.classes] == ["cpu-2c"] and p.classes[0].count == 2
    assert p.chain.survival == (0.5, 0.5) and p.transfer.bytes_per_sample == (128.0, 128.0)
    assert p.rate == pytest.approx(50.0 * pi.HEADROOM)  # sized with headroom


def test_assign_keeps_unchanged_roles_and_fills_the_rest_in_id_order() -> None:
    tables = {"cpu-2c": pi.latency_table(profile_rows(), GEO)}
    p = pi.problem(GEO, {5: 0.2, 7: 0.1}, tables, {"cpu-2c": ("a", "b", "c")}, 2000.0,
                   pi.Targets(slo_ms=1000.0, batch=16))
    dp = plan(p)
    assert dp.feasible
    spans = [(s.first_block, s.last_block + 1) for s in dp.stages]
    replicas = [s.replicas for s in dp.stages]
    fresh = pi.assign(dp, {"cpu-2c": ("a", "b", "c")}, {})
    assert [len(x) for x in fresh] == replicas
    assert sorted(w for x in fresh for w in x) == ["a", "b", "c"][:sum(replicas)]
    # "c" served the last stage's range before: it keeps it
    sticky = pi.assign(dp, {"cpu-2c": ("a", "b", "c")}, {"c": spans[-1]})
    assert "c" in sticky[-1]


def test_to_message_names_ramps_by_index_and_runs_ramps_without_a_forecast() -> None:
    tables = {"cpu-2c": pi.latency_table(profile_rows(), GEO)}
    p = pi.problem(GEO, {}, tables, {"cpu-2c": ("a",)}, 10.0, pi.Targets(1000.0, 16))
    dp = plan(p)
    msg = pi.to_message("m", 1, "first plan", GEO, dp, pi.assign(dp, {"cpu-2c": ("a",)}, {}),
                        200.0, 0.0, probe=[7])
    assert msg.stages[0].first_block == 0 and msg.stages[-1].last_block == 4
    assert msg.stages[0].workers == ("a",)
    ran = [r for s in msg.stages for r in s.active_ramps]
    assert 7 in ran and 5 not in ran  # nothing exits at 5 as far as anyone knows: it costs


def test_request_rate_counts_from_the_first_request_within_the_span() -> None:
    # a steady stream over the whole 12 s span: the plain average
    assert request_rate(1200, 12.0, 12.0, 4.0) == 100.0
    # a stream that began 6 s ago: over those seconds, not diluted by the quiet before
    assert request_rate(570, 12.0, 6.0, 4.0) == 95.0
    # one younger than a window has no rate yet: the plan is the whole pool's until it has
    assert request_rate(190, 12.0, 1.0, 4.0) == UNMEASURED == math.inf
    # an old first request (a sparse stream) caps at the span; nothing: 0
    assert request_rate(12, 12.0, 30.0, 4.0) == 1.0
    assert request_rate(0, 12.0, None, 4.0) == 0.0


def test_an_unmeasured_rate_re_plans_once_measured_and_only_then() -> None:
    assert rate_moved(10.0, UNMEASURED) and rate_moved(UNMEASURED, 150.0)
    assert not rate_moved(UNMEASURED, UNMEASURED)
    assert not rate_moved(100.0, 140.0) and rate_moved(100.0, 160.0)


def test_replan_reasons_in_order() -> None:
    inv = {"cpu-2c": ("a", "b")}
    assert replan_reason(None, 0.0, inv, None) == "first plan"
    basis = Basis(100.0, inv, None)
    assert replan_reason(basis, 150.0, inv, None) is None
    assert replan_reason(basis, 220.0, inv, None).startswith("timer")
    assert replan_reason(basis, 150.0, {"cpu-2c": ("a",)}, None) == "inventory: -b@cpu-2c"
    assert replan_reason(basis, 150.0, inv, T).startswith("drift")
    seen = Basis(100.0, inv, T)
    assert replan_reason(seen, 150.0, inv, T) is None  # that drift was planned for
    assert replan_reason(seen, 150.0, inv, T + timedelta(seconds=10)).startswith("drift")
    assert inventory_change(inv, {"gpu": ("a",), "cpu-2c": ("b",)}) == "+a@gpu -a@cpu-2c"


@pytest.mark.parametrize("interval", [30.0, 120.0])
def test_timer_follows_the_interval(interval: float) -> None:
    basis = Basis(0.0, {}, None)
    assert replan_reason(basis, interval - 0.1, {}, None, interval) is None
    assert replan_reason(basis, interval, {}, None, interval) is not None


def test_assign_on_a_two_stage_plan() -> None:
    from services.optimizer.splits import DeploymentPlan, Stage

    def stage(first, last, replicas, device="cpu"):
        return Stage(first, last, device, replicas, 16, (), 1.0, 1.0, 1.0, 0.0)

    dp = DeploymentPlan(True, "x", (stage(0, 1, 1), stage(2, 3, 2)))
    inv = {"cpu": ("a", "b", "c", "d")}
    assert pi.assign(dp, inv, {}) == [("a",), ("b", "c")]
    # d served blocks 2..3 and c blocks 0..1: both keep them; a fills the rest
    assert pi.assign(dp, inv, {"d": (2, 4), "c": (0, 2)}) == [("c",), ("a", "d")]
    # a class short of devices leaves a stage short (the plan was made for what is there)
    assert pi.assign(dp, {"cpu": ("a", "b")}, {}) == [("a",), ("b",)]


def test_a_new_latency_profile_or_a_moved_rate_asks_for_a_plan() -> None:
    inv = {"cpu": ("a",)}
    basis = Basis(0.0, inv, None, frozenset(), 10.0)
    assert replan_reason(basis, 1.0, inv, None, profiled=frozenset({"cpu"})) == \
        "profiles: cpu now profiled"
    seen = Basis(0.0, inv, None, frozenset({"cpu"}), 10.0)
    assert replan_reason(seen, 1.0, inv, None, profiled=frozenset({"cpu"}), rate=14.0) is None
    assert replan_reason(seen, 1.0, inv, None, profiled=frozenset({"cpu"}), rate=16.0) == \
        "load: 16 req/s, planned for 10"
    assert replan_reason(seen, 1.0, inv, None, rate=4.0).startswith("load")
    idle = Basis(0.0, inv, None, frozenset(), 0.2)
    assert replan_reason(idle, 1.0, inv, None, rate=0.9) is None  # noise below 1 req/s
    assert replan_reason(idle, 1.0, inv, None, rate=UNMEASURED) == \
        "load: a stream began (its rate not measured yet)"
    pooled = Basis(0.0, inv, None, frozenset(), UNMEASURED)
    assert replan_reason(pooled, 1.0, inv, None, rate=UNMEASURED) is None
    assert replan_reason(pooled, 1.0, inv, None, rate=150.0) == \
        "load: 150 req/s, planned for the whole pool before it was measured"

"""The E3 simulator (services/sim/e3_sim.py) and its policies (services/sim/e3_policies.py):
hand-computed batch times, conservation of requests, fusion, goodput, determinism."""

from __future__ import annotations

import math

import numpy as np
import pytest

from services.optimizer.block_costs import LatencyTable, ModelChain
from services.optimizer.splits import DeviceClass, Transfer, plan
from services.sim.e3_policies import (
    capacity_rps,
    e3_pipeline,
    e3_problem,
    easy_mask,
    fusion_bound,
    mix_stream,
    modeled_table,
    naive_pipeline,
    parse_mix,
    site_cost_fraction,
    useful_sites,
    vanilla_pipeline,
    window_survival,
)
from services.sim.e3_sim import (
    FINAL,
    NOT_DROPPED,
    Pipeline,
    SimResult,
    StageSpec,
    exit_sites,
    simulate,
    summarize,
)

# Two blocks, one ramp after block 0. Block 0: 2 ms + 1 ms a row, block 1: 1 ms + 1 ms a
# row (measured at 1 and 8 rows, linear between), the ramp head 0.5 ms flat.
TABLE = LatencyTable.build((1, 8), [[3.0, 10.0], [2.0, 9.0]], [[0.5, 0.5]])
AFTER = (0,)
HALF = ModelChain(2, AFTER, (0.5,))


def block0(rows: int) -> float:
    return 2.0 + rows


def block1(rows: int) -> float:
    return 1.0 + rows


def stage(first, last, sites, replicas, batch, expected, **kw) -> StageSpec:
    return StageSpec(first, last, sites, replicas, batch, TABLE, expected, **kw)


def two_stage(replicas=(1, 1), batch=4, hold_ms=10.0, fixed_ms=0.0) -> Pipeline:
    return Pipeline("e3", (stage(0, 0, (0,), replicas[0], batch, block0(batch) + 0.5,
                                 transfer_fixed_ms=fixed_ms),
                           stage(1, 1, (), replicas[1], batch, block1(batch))), AFTER, hold_ms)


# -- batch times ----------------------------------------------------------------------------

def test_vanilla_batch_time_equals_the_profile():
    pipe = vanilla_pipeline(TABLE, AFTER, devices=1, batch=4)
    assert pipe.stages[0].expected_ms == pytest.approx(block0(4) + block1(4))
    # the first request runs alone; the four that queue meanwhile run as one batch of 4
    arrival = np.array([0.0, 0.001, 0.001, 0.001, 0.001])
    res = simulate(pipe, arrival, np.full(5, FINAL), slo_ms=1000.0)
    t1 = (block0(1) + block1(1)) / 1e3
    assert res.done_s[0] == pytest.approx(t1)
    assert res.done_s[1:] == pytest.approx([t1 + (block0(4) + block1(4)) / 1e3] * 4)
    assert res.batch_rows == [[1, 4]]
    assert res.busy_ms[0] == pytest.approx(block0(1) + block1(1) + block0(4) + block1(4))


def test_naive_early_exit_batch_shrinks_as_samples_exit():
    pipe = naive_pipeline(HALF, TABLE, (0,), devices=1, batch=4)
    # expected: block 0 at 4, the head, block 1 at the 2 rows the forecast says survive
    assert pipe.stages[0].expected_ms == pytest.approx(block0(4) + 0.5 + block1(2))
    arrival = np.array([0.0] + [0.001] * 4)
    exits = np.array([FINAL, 0, FINAL, 0, 0])  # of the batch of 4, three exit at the ramp
    res = simulate(pipe, arrival, exits, slo_ms=1000.0)
    t1 = (block0(1) + 0.5 + block1(1)) / 1e3
    ramp = t1 + (block0(4) + 0.5) / 1e3
    assert res.done_s[[1, 3, 4]] == pytest.approx([ramp] * 3)  # answered at the ramp
    assert res.done_s[2] == pytest.approx(ramp + block1(1) / 1e3)  # one row left in block 1
    assert res.block_runs.tolist() == [2, 2]
    assert res.mean_batch_at_blocks() == pytest.approx([2.5, 1.0])  # (1 + 4) / 2, (1 + 1) / 2


def test_a_batch_whose_rows_all_exit_skips_the_rest_of_the_model():
    pipe = naive_pipeline(HALF, TABLE, (0,), devices=1, batch=2)
    res = simulate(pipe, np.array([0.0]), np.array([0]), slo_ms=1000.0)
    assert res.done_s[0] == pytest.approx((block0(1) + 0.5) / 1e3)
    assert res.block_runs.tolist() == [1, 0] and res.busy_ms[0] == pytest.approx(3.5)


def test_survivors_travel_to_the_next_stage_over_the_link():
    pipe = two_stage(batch=1, fixed_ms=2.0)
    # admission's worst case: stage 0 with its head, the transfer, the hold, stage 1
    assert pipe.remaining_ms(0) == pytest.approx(3.5 + 2.0 + 10.0 + 2.0)
    assert pipe.remaining_ms(1) == pytest.approx(2.0)
    res = simulate(pipe, np.array([0.0, 0.0]), np.array([FINAL, FINAL]), slo_ms=1000.0)
    s0, s1 = (block0(1) + 0.5) / 1e3, block1(1) / 1e3
    # the second request waits for stage 0; both transfers take 2 ms, one after the other
    assert res.done_s == pytest.approx([s0 + 0.002 + s1, 2 * s0 + 0.002 + s1])


def test_links_per_device_carry_messages_side_by_side():
    """Two replicas on each side, a link per device: the two first-stage batches end
    together and their 2 ms transfers run at once instead of one after the other; with one
    channel per cut the second waits."""
    def pipe(per_device: bool) -> Pipeline:
        return Pipeline("e3", (stage(0, 0, (0,), 2, 1, block0(1) + 0.5, transfer_fixed_ms=2.0,
                                     per_device_links=per_device),
                               stage(1, 1, (), 2, 1, block1(1))), AFTER, 10.0)
    s0, s1 = (block0(1) + 0.5) / 1e3, block1(1) / 1e3
    arrival, exits = np.array([0.0, 0.0]), np.array([FINAL, FINAL])
    own = simulate(pipe(True), arrival, exits, slo_ms=1000.0)
    assert own.done_s == pytest.approx([s0 + 0.002 + s1] * 2)
    one = simulate(pipe(False), arrival, exits, slo_ms=1000.0)
    assert one.done_s == pytest.approx([s0 + 0.002 + s1, s0 + 0.004 + s1])


# -- fusion ---------------------------------------------------------------------------------

def test_fusion_keeps_later_stage_batches_fuller_than_naive_early_exit():
    """Batches of 4, half of every batch exits at the ramp. Naive EE runs block 1 on the 2
    rows left of each batch; E3's second stage fuses two such parts back into 4."""
    n = 64
    arrival = np.arange(n) * 0.004  # one row every 4 ms: batches of 4 keep forming
    exits = np.where(np.arange(n) % 2 == 0, 0, FINAL)
    naive = simulate(naive_pipeline(HALF, TABLE, (0,), 1, 4), arrival, exits, 1000.0)
    e3 = simulate(two_stage(batch=4, hold_ms=100.0), arrival, exits, 1000.0)
    assert naive.mean_batch_at_blocks()[1] <= 2.0 + 1e-9
    assert e3.mean_batch_at_blocks()[1] > naive.mean_batch_at_blocks()[1] + 1.0
    assert np.mean(e3.batch_rows[1]) >= 3.5
    assert e3.answered.all() and naive.answered.all()


def test_a_lone_part_leaves_after_the_hold_limit():
    pipe = two_stage(batch=4, hold_ms=10.0)
    res = simulate(pipe, np.array([0.0]), np.array([FINAL]), slo_ms=1000.0)
    s0 = (block0(1) + 0.5) / 1e3
    assert res.done_s[0] == pytest.approx(s0 + 0.010 + block1(1) / 1e3)
    assert res.batch_rows == [[1], [1]]


# -- conservation, drops, goodput -------------------------------------------------------------

def overload(n=400, seed=3):
    rng = np.random.default_rng(seed)
    arrival = np.cumsum(rng.exponential(0.0005, n))  # 2000 req/s: far beyond capacity
    exits = np.where(rng.random(n) < 0.5, 0, FINAL)
    return arrival, exits


@pytest.mark.parametrize("pipe", [
    vanilla_pipeline(TABLE, AFTER, 2, 4),
    naive_pipeline(HALF, TABLE, (0,), 2, 4),
    two_stage(replicas=(2, 1), batch=4, hold_ms=5.0, fixed_ms=0.5),
], ids=["vanilla", "naive", "e3"])
def test_every_request_is_answered_once_or_dropped_with_a_reason(pipe):
    arrival, exits = overload()
    if not pipe.active:
        exits = np.full_like(exits, FINAL)
    res = simulate(pipe, arrival, exits, slo_ms=40.0)
    answered, dropped = res.answered, res.dropped_at != NOT_DROPPED
    assert (answered ^ dropped).all()  # exactly one of the two
    assert dropped.any() and answered.any()  # overloaded: both happen
    assert set(np.unique(res.dropped_at[dropped])) <= set(range(len(pipe.stages)))
    s = summarize(pipe, res, arrival, np.ones(arrival.size, bool), 40.0)
    assert s.answered + s.dropped == arrival.size and sum(s.dropped_by_stage) == s.dropped
    assert (res.done_s[answered] >= arrival[answered]).all()


def test_goodput_counts_only_answers_within_the_slo():
    """Ten requests 10 ms apart, SLO 12 ms; the window runs from the arrival of request 1
    (warm-up 10 %) to the last arrival (90 ms). Answers: in time, late, dropped, and one
    in time but after the window closed."""
    pipe = vanilla_pipeline(TABLE, AFTER, 1, 1)
    arrival = np.arange(10) * 0.010
    lat_ms = np.array([5, 5, 20, np.nan, 12, 30, 5, np.nan, 5, 11])
    done = arrival + lat_ms / 1e3
    dropped = np.where(np.isnan(lat_ms), 0, NOT_DROPPED)
    res = SimResult(done, dropped, [[1] * 8], [40.0], np.array([8, 8]), np.array([8, 8]))
    s = summarize(pipe, res, arrival, np.ones(10, bool), 12.0, warmup=0.1)
    # in time and given within [10, 90] ms: requests 1, 4, 6 (request 8 at 85 ms is too;
    # request 9 answers at 101 ms, after the window; request 0 at 5 ms, before it)
    assert s.goodput_rps == pytest.approx(4 / 0.080)
    assert (s.answered, s.late, s.dropped) == (8, 2, 2)
    assert s.cost == pytest.approx(1000.0 / s.goodput_rps)
    lw = lat_ms[1:][~np.isnan(lat_ms[1:])]  # latencies of the window's answered arrivals
    assert s.p50_ms == pytest.approx(np.percentile(lw, 50))
    assert s.p99_ms == pytest.approx(np.percentile(lw, 99))


def test_answers_are_never_late_when_the_queue_is_the_only_wait():
    """Admission drops whatever the worst case could not answer in time: with one stage
    (vanilla or naive EE) no answer is late, however deep the overload."""
    rng = np.random.default_rng(5)
    arrival = np.cumsum(rng.exponential(0.0002, 500))
    exits = np.where(rng.random(500) < 0.5, 0, FINAL)
    for pipe, ex in ((vanilla_pipeline(TABLE, AFTER, 2, 4), np.full(500, FINAL)),
                     (naive_pipeline(HALF, TABLE, (0,), 2, 4), exits)):
        res = simulate(pipe, arrival, ex, slo_ms=30.0)
        lat = (res.done_s - arrival) * 1e3
        assert np.nanmax(lat) <= 30.0 + 1e-9 and (res.dropped_at == 0).sum() > 100


def test_agreement_is_over_answered_requests_of_the_window():
    pipe = vanilla_pipeline(TABLE, AFTER, 1, 1)
    arrival = np.arange(10) * 1.0
    agree = np.array([True] * 5 + [False] * 5)
    res = simulate(pipe, arrival, np.full(10, FINAL), slo_ms=100.0)
    assert summarize(pipe, res, arrival, agree, 100.0, warmup=0.0).agreement == 0.5
    assert summarize(pipe, res, arrival, agree, 100.0, warmup=0.5).agreement == 0.0


def test_a_slow_last_stage_holds_back_the_stages_before_it():
    """Three stages, the last one slow and alone: its credit (2 batches) runs out, the
    middle stage stops taking parts, then the first stops taking requests; the backlog
    waits (and is dropped) in the first queue, and the run ends."""
    slow = LatencyTable.build((1, 8), [[0.1, 0.8], [0.1, 0.8], [20.0, 160.0]], [[0, 0]] * 2)
    after = (0, 1)
    pipe = Pipeline("e3", (StageSpec(0, 0, (0,), 2, 4, slow, 0.4),
                           StageSpec(1, 1, (1,), 2, 4, slow, 0.4),
                           StageSpec(2, 2, (), 1, 4, slow, 80.0)), after, hold_ms=5.0)
    arrival = np.arange(2000) * 0.0002  # 5000/s against ~50/s at the last stage
    res = simulate(pipe, arrival, np.full(2000, FINAL), slo_ms=1000.0)
    assert ((res.dropped_at != NOT_DROPPED) ^ res.answered).all()
    assert (res.dropped_at == 0).sum() > 1500  # the backlog is dropped where it arrived
    assert len(res.batch_rows[0]) < 200  # the first stage stopped taking requests


def test_the_simulation_is_deterministic():
    arrival, exits = overload(seed=11)
    pipe = two_stage(replicas=(2, 1), batch=4, hold_ms=5.0, fixed_ms=0.5)
    a, b = (simulate(pipe, arrival, exits, 40.0) for _ in range(2))
    assert np.array_equal(a.done_s, b.done_s, equal_nan=True)
    assert np.array_equal(a.dropped_at, b.dropped_at) and a.batch_rows == b.batch_rows
    easy, hard = np.arange(10), np.arange(10, 30)
    assert np.array_equal(mix_stream(easy, hard, 0.8, 50, 7), mix_stream(easy, hard, 0.8, 50, 7))
    assert not np.array_equal(mix_stream(easy, hard, 0.8, 50, 7),
                              mix_stream(easy, hard, 0.8, 50, 8))


def test_exits_at_ramps_the_pipeline_does_not_run_are_refused():
    with pytest.raises(ValueError, match="does not run"):
        simulate(vanilla_pipeline(TABLE, AFTER, 1, 1), np.array([0.0]), np.array([0]), 10.0)


# -- policies and workload --------------------------------------------------------------------

def test_exit_sites_pick_the_first_active_ramp_that_passes():
    score = np.array([[0.1, 0.5, 0.5, 0.0],
                      [0.1, 0.1, 0.5, 0.0]])
    th = np.array([0.2, 0.2])
    assert exit_sites(score, th, (0, 1)).tolist() == [0, 1, FINAL, 0]
    assert exit_sites(score, th, (1,)).tolist() == [1, 1, FINAL, 1]
    assert exit_sites(score, np.array([0.0, 0.2]), (0, 1)).tolist() == [1, 1, FINAL, 1]
    assert useful_sites([0.0, 0.2], exit_sites(score, np.array([0.0, 0.2]), (0, 1))) == (1,)


def test_easy_samples_exit_in_the_first_half_of_the_model_by_cost():
    t = LatencyTable.build((1,), [[1.0], [1.0], [2.0]], [[0.0], [0.0]])
    frac = site_cost_fraction(t, (0, 1))
    assert frac == pytest.approx([0.25, 0.5])
    assert easy_mask(np.array([0, 1, FINAL]), frac).tolist() == [True, True, False]
    assert easy_mask(np.array([0, 1]), frac, half=0.3).tolist() == [True, False]


def test_mixes_draw_easy_samples_in_their_share_and_grow_by_prefix():
    easy, hard = np.arange(5), np.arange(100, 103)
    s = mix_stream(easy, hard, 0.8, 10000, 0)
    share = (s < 100).mean()
    assert abs(share - 0.8) < 5 * math.sqrt(0.8 * 0.2 / 10000)  # binomial, 5 sigma
    assert set(s[s < 100]) == set(easy) and set(s[s >= 100]) == set(hard)
    assert np.array_equal(mix_stream(easy, hard, 0.8, 300, 0), s[:300])
    assert (mix_stream(easy, hard, 1.0, 50, 0) < 100).all()
    assert parse_mix("80/20") == 0.8 and parse_mix("20/80") == pytest.approx(0.2)
    with pytest.raises(ValueError):
        parse_mix("80/30")
    with pytest.raises(ValueError):
        mix_stream(np.zeros(0, np.int64), hard, 0.5, 10, 0)


def test_window_survival_is_per_chunk():
    exits = np.array([0, FINAL, 1, FINAL, 0, 0, 1, 1])
    assert window_survival(exits, 2, 2) == [(0.75, 0.5), (0.5, 0.0)]


def test_a_modeled_class_scales_blocks_and_heads_per_batch_size():
    t = LatencyTable.build((1, 4), [[1.0, 4.0], [3.0, 12.0]], [[0.5, 2.0]])
    m, ratio = modeled_table(t, {1: 4.0, 4: 16.0}, {1: 2.0, 2: 2.0, 8: 4.0})
    assert ratio == {1: 0.5, 4: pytest.approx(1 / 6)}  # reference at 4: 2 + 2/3, interpolated
    assert m.block_ms[:, 0] == pytest.approx([0.5, 1.5])
    assert m.block_ms[:, 1] == pytest.approx([4 / 6, 2.0])
    assert m.head_ms[0] == pytest.approx([0.25, 2 / 6])
    with pytest.raises(ValueError):
        modeled_table(t, {1: 4.0, 4: 16.0}, {2: 1.0, 8: 2.0})  # does not cover batch 1


def test_the_plan_becomes_a_pipeline_that_serves_every_request():
    """3 devices and demand far beyond capacity: the planner splits at the ramp, two
    replicas for block 0 and one for block 1 (test_optimizer_splits computes why)."""
    chain = ModelChain(2, AFTER, (0.5,))
    table = LatencyTable.build((1, 8), [[11.0, 18.0], [7.0, 14.0]], [[0.0, 0.0]])
    p = e3_problem(chain, DeviceClass("gpu", 3, table), 10000.0, 200.0, 8,
                   Transfer((100.0,), 0.001, 0.2))
    pl = plan(p)
    pipe = e3_pipeline(p, pl)
    assert [(s.first_block, s.last_block, s.replicas) for s in pipe.stages] == \
        [(0, 0, 2), (1, 1, 1)]
    assert pipe.stages[0].transfer_fixed_ms == 0.2
    assert pipe.stages[0].transfer_ms_per_row == pytest.approx(0.1)
    assert pipe.hold_ms == pytest.approx(40.0) and pipe.devices == 3
    arrival, exits = overload(n=300)
    res = simulate(pipe, arrival, exits, 200.0)
    assert ((res.dropped_at != NOT_DROPPED) ^ res.answered).all()
    assert res.batch_rows[1] and max(res.batch_rows[1]) <= 8
    assert capacity_rps(vanilla_pipeline(table, AFTER, 3, 8)) == pytest.approx(3 * 8000 / 32)
    # naive: block 0 at 8, block 1 at the 4 rows the forecast leaves: 18 + 10 ms
    assert capacity_rps(naive_pipeline(chain, table, (0,), 3, 8)) == pytest.approx(3 * 8000 / 28)


def test_the_fusion_bound_is_naive_block_time_over_the_same_rows_in_full_batches():
    # TABLE: block 0 is 3 ms at 1 row and 10 at 8, block 1 is 2 and 9. Naive runs block 0
    # on 8 rows and block 1 on the 2 left: 10 + (2 + 7/7) = 13 ms; fused, block 1 takes a
    # quarter of a full batch: 10 + 9 / 4 = 12.25 ms.
    assert fusion_bound(TABLE, [8.0, 2.0], 8) == pytest.approx(13.0 / 12.25)
    assert fusion_bound(TABLE, [8.0, 8.0], 8) == pytest.approx(1.0)  # nothing exits: no gain

"""Hysteresis of the exit wrapper (services.optimizer.sticky_ramps): a stage keeps the
ramps it runs unless the new choice is clearly faster."""

from __future__ import annotations

import pytest

from services.optimizer.block_costs import LatencyTable, ModelChain
from services.optimizer.splits import DeviceClass, Problem, plan
from services.optimizer.sticky_ramps import STICKY, keep_running, running_sites

# 3 blocks of 1 ms a row; ramps after blocks 0 and 1; 10 % exit at the first, 50 % by the
# second. At batch 8 ramp 0 saves 0.8 ms of block 1 for a 0.7 ms head: it barely pays.
CHAIN = ModelChain(3, (0, 1), (0.9, 0.5))
TABLE = LatencyTable.build((1, 8), [[1.0, 8.0]] * 3, [[0.0875, 0.7], [0.0625, 0.5]])
PROBLEM = Problem(CHAIN, (DeviceClass("cpu", 1, TABLE),), rate=10_000, slo_ms=10_000, batch=8)


def test_the_wrapper_alone_runs_the_ramp_that_barely_pays():
    p = plan(PROBLEM)
    assert [(s.first_block, s.last_block, s.active_ramps) for s in p.stages] == [(0, 2, (0, 1))]
    assert p.stages[0].ms == pytest.approx(8 + 0.7 + 7.2 + 0.45 + 4)


def test_a_running_set_within_the_margin_is_kept_with_its_own_estimate():
    new = plan(PROBLEM)
    kept = keep_running(new, PROBLEM, {(0, 2, "cpu"): (1,)})
    s = kept.stages[0]
    assert s.active_ramps == (1,) and kept.active_ramps == (1,)
    assert s.ms == pytest.approx(8 + 8 + 0.5 + 4)  # 20.5 ms against 20.35: within 5 %
    assert s.capacity == pytest.approx(new.stages[0].capacity * new.stages[0].ms / s.ms)
    assert kept.goodput == pytest.approx(min(new.goodput, s.capacity))


def test_a_running_set_clearly_slower_is_replaced():
    new = plan(PROBLEM)
    # ramp 1 off: blocks 1 and 2 run on 7.2 rows, 23.1 ms, 13 % slower
    assert keep_running(new, PROBLEM, {(0, 2, "cpu"): (0,)}) == new
    assert keep_running(new, PROBLEM, {(0, 2, "cpu"): (0,)}, sticky=0.2).stages[0].active_ramps == (0,)
    assert STICKY < 0.13


def test_only_a_stage_with_the_same_blocks_and_class_is_sticky():
    new = plan(PROBLEM)
    assert keep_running(new, PROBLEM, {(0, 1, "cpu"): (1,)}) == new
    assert keep_running(new, PROBLEM, {(0, 2, "gpu"): (1,)}) == new
    assert keep_running(new, PROBLEM, {}) == new


def test_the_plan_in_force_maps_to_sites_by_ramp_id():
    assert running_sites([(0, 3, "cpu", (7, 9)), (3, 5, "cpu", (4,))], (7, 9)) == \
        {(0, 2, "cpu"): (0, 1), (3, 4, "cpu"): ()}

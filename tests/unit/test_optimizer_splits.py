"""The E3 split/replica planner (services/optimizer/splits.py, §3.2 Fig. 6): hand-computed
plans, the dynamic program against brute force, constraints, heterogeneity."""

from __future__ import annotations

import math
import time
from itertools import combinations, product

import numpy as np
import pytest

from services.optimizer.block_costs import (
    LatencyTable,
    ModelChain,
    interpolate,
    monotone_survival,
    stage_ms,
)
from services.optimizer.splits import DeviceClass, Problem, Transfer, baseline, plan


def table(scale: float = 1.0) -> LatencyTable:
    """Block 0 takes 10 + b ms, block 1 takes 6 + b ms (measured at b = 1 and 8); the ramp
    head is free. Batching pays: a fused batch of 8 beats two halves."""
    return LatencyTable.build((1, 8), [[11 * scale, 18 * scale], [7 * scale, 14 * scale]],
                              [[0.0, 0.0]])


HALF = ModelChain(2, (0,), (0.5,))  # one ramp after block 0; half the samples exit there


def shape(p):
    return [(s.first_block, s.last_block, s.device_class, s.replicas) for s in p.stages]


# -- latency tables -------------------------------------------------------------------------

def test_latency_between_measured_sizes_is_interpolated():
    t = LatencyTable.build((1, 4, 16), [[1.0, 2.5, 7.0]], [[0.1, 0.4, 1.6]])
    assert t.blocks_at(2)[0] == pytest.approx(1.5)  # 1 + 1/3 of 1.5
    assert t.blocks_at(10)[0] == pytest.approx(4.75)  # 2.5 + 1/2 of 4.5
    assert t.blocks_at(16)[0] == pytest.approx(7.0)
    assert t.heads_at(10)[0] == pytest.approx(1.0)
    assert t.blocks_at(0.5)[0] == pytest.approx(0.5)  # below the smallest: from the origin
    assert t.blocks_at(20)[0] == pytest.approx(8.5)  # beyond: the last two sizes' slope
    many = t.blocks_at(np.array([0.5, 2.0, 10.0, 20.0]))
    assert many.shape == (1, 4) and many[0] == pytest.approx([0.5, 1.5, 4.75, 8.5])


def test_latency_never_falls_as_the_batch_grows():
    t = LatencyTable.build((1, 4, 16), [[1.0, 0.8, 3.0]], [[0.0, 0.0, 0.0]])
    assert list(t.block_ms[0]) == [1.0, 1.0, 3.0]  # a noisy dip is raised to its left
    xs = np.linspace(0.1, 40, 200)
    assert np.all(np.diff(t.blocks_at(xs)[0]) >= 0)
    single = interpolate(np.array([4.0]), np.array([[2.0]]), 6.0)  # one size: proportional
    assert single[0] == pytest.approx(3.0)


def test_the_batch_shrinks_inside_a_stage():
    # 3 blocks of 1 ms per sample, heads 0.1 ms per sample, batch 4, survival 0.5 then 0.25
    lin = LatencyTable.build((1, 4), [[1.0, 4.0]] * 3, [[0.1, 0.4]] * 2)
    chain = ModelChain(3, (0, 1), (0.5, 0.25))
    assert stage_ms(chain, lin, 0, 2, 4, (0, 1)) == pytest.approx(4 + 0.4 + 2 + 0.2 + 1)
    assert stage_ms(chain, lin, 0, 2, 4, ()) == pytest.approx(12.0)
    assert stage_ms(chain, lin, 1, 2, 4, (1,)) == pytest.approx(4 + 0.4 + 2)  # fused again


def test_inputs_are_checked():
    with pytest.raises(ValueError):
        ModelChain(3, (0, 1), (0.5, 0.6))  # survival rises
    with pytest.raises(ValueError):
        ModelChain(3, (1, 1), (0.5, 0.4))
    assert monotone_survival([1.2, 0.5, 0.6, -0.1]) == (1.0, 0.5, 0.5, 0.0)
    with pytest.raises(ValueError):
        Problem(HALF, (DeviceClass("gpu", 1, LatencyTable.build((1,), [[1.0]], [[0.0]])),),
                100, 100, 8)  # a one-block table for a two-block model
    with pytest.raises(ValueError):
        Problem(HALF, (DeviceClass("gpu", 1, table()),), 100, 100, 8, slack=1.0)


# -- hand-computed plans --------------------------------------------------------------------

def test_the_bottleneck_stage_sets_the_goodput():
    """3 devices, demand far above capacity. Per replica, in samples entering the model/s:
    one stage (block 0 at 8 = 18 ms, the ramp halves the batch, block 1 at 4 = 10 ms):
    8000 / 28 = 285.7; stage A (block 0): 8000 / 18 = 444.4; stage B (block 1, fused back to
    8, seen by half the samples): 8000 / (14 × 0.5) = 1142.9. Pipelined, a plan runs at its
    slowest stage: A×2 + B×1 = min(888.9, 1142.9) beats one stage ×3 = 857.1 and
    A×1 + B×2 = min(444.4, 2285.7)."""
    p = plan(Problem(HALF, (DeviceClass("gpu", 3, table()),), 10000, 10000, 8))
    assert p.feasible
    assert shape(p) == [(0, 0, "gpu", 2), (1, 1, "gpu", 1)]
    assert p.goodput == pytest.approx(8000 / 9)
    assert [s.capacity for s in p.stages] == pytest.approx([8000 / 9, 8000 / 7])
    assert p.cuts == (0,) and p.active_ramps == (0,)
    assert p.cost == pytest.approx(3 * 1000 / (8000 / 9))  # 3.375 device-s per 1000 answers
    # fill: 7 samples at 10000/s, then 7 at 5000/s; plus 18 and 14 ms of compute
    assert p.latency_ms == pytest.approx(0.7 + 18 + 1.4 + 14)
    assert "bound by stage 0" in p.reason
    # vanilla: 18 + 14 = 32 ms a batch, 250/s a device, 3 devices
    assert (p.baseline.goodput, p.baseline.cost) == pytest.approx((750.0, 4.0))


def test_the_latency_budget_rules_out_the_split():
    # SLO 40 ms less 20 %: 32 ms. The split takes 34.1 ms, one stage 0.7 + 28 = 28.7 ms.
    p = plan(Problem(HALF, (DeviceClass("gpu", 3, table()),), 10000, 40, 8))
    assert shape(p) == [(0, 1, "gpu", 3)]
    assert p.goodput == pytest.approx(3 * 8000 / 28)
    assert p.latency_ms == pytest.approx(28.7) and p.latency_budget_ms == pytest.approx(32)


def test_the_cost_cap_rules_out_the_fastest_plan():
    """fast (cost 10/s) and slow (2x the time, cost 1/s), one device each. The most goodput:
    A on fast (444.4/s) + B on slow (8000 / (28 × 0.5) = 571.4/s): 444.4/s for 11/s, 24.75
    per 1000 answers. Vanilla on fast: 250/s at 40. At alpha 0.5 the cap is 20: one stage on
    slow (block 0 = 36, block 1 at 4 = 20 ms: 142.9/s, 7 per 1000) is what remains, since
    one stage on fast (285.7/s) costs 35."""
    classes = (DeviceClass("fast", 1, table(), 10.0), DeviceClass("slow", 1, table(2.0), 1.0))
    best = plan(Problem(HALF, classes, 10000, 10000, 8))
    assert shape(best) == [(0, 0, "fast", 1), (1, 1, "slow", 1)]
    assert best.goodput == pytest.approx(8000 / 18) and best.cost == pytest.approx(24.75)
    capped = plan(Problem(HALF, classes, 10000, 10000, 8, alpha=0.5))
    assert capped.cost_cap == pytest.approx(20.0)
    assert shape(capped) == [(0, 1, "slow", 1)]
    assert capped.goodput == pytest.approx(8000 / 56) and capped.cost == pytest.approx(7.0)


def test_the_late_stage_goes_to_the_cheap_slow_class():
    """A quarter of the samples survive the ramp. fast: cost 4/s, 4 devices; slow: 3x the
    time, cost 1/s, 2 devices. For 400 req/s: A on fast (444.4/s) + B on slow
    (8000 / (42 × 0.25) = 761.9/s) costs 5/s, 12.5 per 1000 answers; one stage on fast
    needs 2 devices (8000 / 26 = 307.7/s each): 20; slow alone reaches 2 × 102.6/s."""
    chain = ModelChain(2, (0,), (0.25,))
    classes = (DeviceClass("fast", 4, table(), 4.0), DeviceClass("slow", 2, table(3.0), 1.0))
    p = plan(Problem(chain, classes, 400, 10000, 8))
    assert shape(p) == [(0, 0, "fast", 1), (1, 1, "slow", 1)]
    assert p.goodput == pytest.approx(400) and p.cost == pytest.approx(12.5)
    assert "meets the rate" in p.reason
    assert p.baseline.device_class == "fast" and p.baseline.cost == pytest.approx(20.0)
    # fill 7 / 400 s, 18 ms, fill 7 / 100 s, 42 ms
    assert p.latency_ms == pytest.approx(17.5 + 18 + 70 + 42)


def test_a_slow_link_makes_the_split_lose():
    # survivors cost 2 ms a message + 3 ms each: a batch's 4 survivors take 14 ms, so the
    # link carries 8000 / (1 × 14) = 571.4/s, below one stage ×3 (857.1/s)
    link = Transfer((1000.0,), ms_per_byte=0.003, fixed_ms=2.0)
    p = plan(Problem(HALF, (DeviceClass("gpu", 3, table()),), 10000, 10000, 8, transfer=link))
    assert shape(p) == [(0, 1, "gpu", 3)]
    cheap = Transfer((1000.0,), ms_per_byte=0.001, fixed_ms=2.0)  # 6 ms: 1333/s, not binding
    p = plan(Problem(HALF, (DeviceClass("gpu", 3, table()),), 10000, 10000, 8, transfer=cheap))
    assert shape(p) == [(0, 0, "gpu", 2), (1, 1, "gpu", 1)]
    assert p.stages[0].transfer_ms == pytest.approx(6.0)
    assert p.latency_ms == pytest.approx(0.7 + 18 + 6 + 1.4 + 14)


def test_links_per_device_scale_with_replicas_and_overlap_compute():
    """A batch's 4 survivors take 2 + 4 x 2 = 10 ms. One channel per cut carries 8000 / 10
    = 800/s, below one stage x3 (857.1/s). A link per device overlaps with compute
    (pipelined max): stage 0 cycles in max(18, 10) ms (444.4/s a replica), stage 1 receives
    a fused 8 in 2 + 16 = 18 ms and computes in 14 (8000 / (18 x 0.5) = 888.9/s): 2 + 1."""
    shared = Transfer((1000.0,), ms_per_byte=0.002, fixed_ms=2.0)
    p = plan(Problem(HALF, (DeviceClass("gpu", 3, table()),), 10000, 10000, 8, transfer=shared))
    assert shape(p) == [(0, 1, "gpu", 3)]
    own = Transfer((1000.0,), ms_per_byte=0.002, fixed_ms=2.0, per_device=True)
    p = plan(Problem(HALF, (DeviceClass("gpu", 3, table()),), 10000, 10000, 8, transfer=own))
    assert shape(p) == [(0, 0, "gpu", 2), (1, 1, "gpu", 1)]
    assert p.goodput == pytest.approx(2 * 8000 / 18) and p.stages[0].transfer_ms == 10.0


def test_a_small_load_gets_one_device_and_one_stage():
    p = plan(Problem(HALF, (DeviceClass("gpu", 3, table()),), 100, 10000, 8))
    assert shape(p) == [(0, 1, "gpu", 1)] and p.cuts == ()
    assert p.goodput == pytest.approx(100) and p.cost == pytest.approx(10.0)


def test_a_class_without_devices_is_never_used():
    ghost = DeviceClass("ghost", 0, table(0.01), 0.001)
    p = plan(Problem(HALF, (ghost, DeviceClass("gpu", 3, table())), 10000, 10000, 8))
    assert shape(p) == [(0, 0, "gpu", 2), (1, 1, "gpu", 1)]
    none = plan(Problem(HALF, (ghost,), 10000, 10000, 8))
    assert not none.feasible and none.reason.startswith("no devices")


def test_a_stage_that_no_sample_reaches_needs_one_replica():
    # every sample exits at the ramp: block 1 never runs, one stage is just block 0
    gone = ModelChain(2, (0,), (0.0,))
    p = plan(Problem(gone, (DeviceClass("gpu", 3, table()),), 10000, 10000, 8))
    assert shape(p) == [(0, 1, "gpu", 3)]
    assert p.goodput == pytest.approx(3 * 8000 / 18) and p.latency_ms == pytest.approx(18.7)
    two = plan(Problem(gone, (DeviceClass("gpu", 2, table()),), 400, 10000, 8))
    assert shape(two) == [(0, 1, "gpu", 1)] and two.goodput == pytest.approx(400)


def test_infeasible_plans_say_why():
    gpu = (DeviceClass("gpu", 3, table()),)
    slow = plan(Problem(HALF, gpu, 10000, 30, 8))  # budget 24 ms; the fastest takes 28.7
    assert not slow.feasible and slow.reason.startswith("latency")
    assert slow.stages == () and slow.goodput == 0.0
    dear = plan(Problem(HALF, gpu, 10000, 10000, 8, alpha=0.5))  # cap 2 per 1000 answers
    assert not dear.feasible and dear.reason.startswith("cost")


def test_without_the_wrapper_every_ramp_of_a_stage_runs():
    chain = ModelChain(3, (0, 1), (0.99, 0.5))
    heavy = LatencyTable.build((1, 8), [[11, 18], [11, 18], [7, 14]], [[4, 8], [0, 0]])
    gpu = (DeviceClass("gpu", 1, heavy),)
    wrapped = plan(Problem(chain, gpu, 10, 10000, 8))
    assert wrapped.active_ramps == (1,)  # site 0 lets 1 % out for an 8 ms head
    plain = plan(Problem(chain, gpu, 10, 10000, 8, exit_wrapper=False))
    assert plain.active_ramps in ((0, 1), ())  # all, or vanilla when that is faster
    assert plain.stages[0].ms >= wrapped.stages[0].ms


# -- the dynamic program against brute force ------------------------------------------------

def _stage_time(p: Problem, cls: DeviceClass, first: int, last: int, single: bool) -> float:
    chain, n = p.chain, p.chain.n_blocks
    ends = {a: s for s, a in enumerate(chain.ramp_after)}
    cut = [ends[last]] if last < n - 1 else []
    inside = [s for s, a in enumerate(chain.ramp_after) if first <= a <= last and s not in cut]
    if p.exit_wrapper:
        subsets = [c for k in range(len(inside) + 1) for c in combinations(inside, k)]
    else:
        subsets = [tuple(inside)] + ([()] if single else [])
    return min(stage_ms(chain, cls.latency, first, last, p.batch, (*sub, *cut))
               for sub in subsets)


def _evaluate(p, bounds, classes, reps, times):
    """(goodput, cost, stages, latency) of one plan, straight from the model's definitions."""
    chain, b, r, tr = p.chain, p.batch, p.rate, p.transfer
    caps, lat = [], 0.0
    for k, ((first, last), c, m) in enumerate(zip(bounds, classes, reps)):
        s_in = chain.survival_in(first)
        t = times[(first, last, c.name)]
        fill = 0.0 if b == 1 else min((b - 1) * 1000 / (r * s_in) if s_in > 0 else math.inf,
                                      p.hold_ms)
        tx = rx = 0.0
        if last < chain.n_blocks - 1 and tr is not None:
            site = chain.ramp_after.index(last)
            alive = b * chain.survival[site] / s_in if s_in > 0 else b
            tx = tr.fixed_ms + alive * tr.bytes_per_sample[site] * tr.ms_per_byte
            if not tr.per_device:  # one channel per cut
                caps.append(1000 * b / (s_in * tx) if s_in * tx > 0 else math.inf)
        if k > 0 and tr is not None and tr.per_device:  # receiving a fused batch
            rx = tr.fixed_ms + b * tr.bytes_per_sample[chain.ramp_after.index(first - 1)] * \
                tr.ms_per_byte
        cycle = max(t, tx, rx) if tr is not None and tr.per_device else t
        caps.append(m * 1000 * b / (cycle * s_in) if cycle * s_in > 0 else math.inf)
        lat += fill + t + tx
    goodput = min(r, *caps)
    cost = 1000 * sum(m * c.cost_per_s for c, m in zip(classes, reps)) / goodput
    return goodput, cost, len(bounds), lat


def _better(a, b) -> bool:
    if b is None:
        return True
    for x, y, sign in ((a[0], b[0], -1), (a[1], b[1], 1)):
        if abs(x - y) > 1e-9 * max(abs(x), abs(y)):
            return sign * x < sign * y
    return a[2] < b[2]


def brute_force(p: Problem):
    chain, n = p.chain, p.chain.n_blocks
    cuts = [a for a in chain.ramp_after if a < n - 1]
    classes = [c for c in p.classes if c.count > 0]
    cap = p.alpha * baseline(p).cost
    times = {}
    best = None
    for k in range(len(cuts) + 1):
        for cut_set in combinations(cuts, k):
            bounds = list(zip([0] + [a + 1 for a in cut_set], [*cut_set, n - 1]))
            for c, (f, last) in product(classes, bounds):
                if (f, last, c.name) not in times:
                    times[(f, last, c.name)] = _stage_time(p, c, f, last, k == 0)
            for cls in product(classes, repeat=len(bounds)):
                for reps in product(*(range(1, c.count + 1) for c in cls)):
                    if any(sum(m for c2, m in zip(cls, reps) if c2 is c) > c.count
                           for c in classes):
                        continue
                    ev = _evaluate(p, bounds, cls, reps, times)
                    if ev[3] > p.latency_budget_ms * (1 + 1e-9) or ev[1] > cap * (1 + 1e-9):
                        continue
                    if _better(ev, best):
                        best = ev
    return best


def random_problem(seed: int) -> Problem:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(4, 6))
    sites = tuple(sorted(int(s) for s in rng.choice(n, size=3, replace=False)))
    surv = tuple(float(s) for s in np.minimum.accumulate(rng.uniform(0.05, 1.0, 3)))
    classes = []
    for name, count in (("a", int(rng.integers(0, 5))), ("b", int(rng.integers(1, 5)))):
        one = rng.uniform(0.5, 4.0, n)
        blocks = np.stack([one, one * rng.uniform(1.2, 3.0, n), one * rng.uniform(2.5, 9.0, n)], 1)
        h = rng.uniform(0.0, 1.0, 3)
        heads = np.stack([h, h * rng.uniform(1, 3), h * rng.uniform(3, 8)], 1)
        classes.append(DeviceClass(name, count, LatencyTable.build((1, 4, 16), blocks, heads),
                                   float(rng.choice([0.5, 1.0, 2.0, 3.0]))))
    transfer = None
    if rng.random() < 0.5:
        transfer = Transfer(tuple(rng.uniform(0, 2000, 3)), float(rng.uniform(0, 0.002)),
                            float(rng.uniform(0, 2)), per_device=bool(rng.random() < 0.5))
    batch = int(rng.choice([1, 4, 8, 16]))
    rate = float(rng.uniform(50, 3000))
    slo = float(rng.uniform(20, 200))
    alpha = float(rng.choice([0.4, 0.6, 0.8, 1.0, 1.5]))
    return Problem(ModelChain(n, sites, surv), tuple(classes), rate, slo, batch,
                   alpha=alpha, transfer=transfer, exit_wrapper=bool(rng.random() < 0.7))


@pytest.mark.parametrize("seed", range(40))
def test_the_dynamic_program_matches_brute_force(seed):
    p = random_problem(seed)
    got, want = plan(p), brute_force(p)
    assert got.feasible == (want is not None), got.reason
    if want is None:
        return
    assert got.goodput == pytest.approx(want[0], rel=1e-9)
    assert got.cost == pytest.approx(want[1], rel=1e-9)
    assert len(got.stages) == want[2]
    assert got.latency_ms <= p.latency_budget_ms * (1 + 1e-9)
    assert got.cost <= got.cost_cap * (1 + 1e-9)
    for c in p.classes:  # within the inventory
        assert sum(s.replicas for s in got.stages if s.device_class == c.name) <= c.count


def test_the_random_instances_exercise_every_outcome():
    outcomes = set()
    for seed in range(40):
        p = plan(random_problem(seed))
        outcomes.add(p.reason.split(":")[0] if not p.feasible else
                     ("split" if len(p.stages) > 1 else "one stage"))
    assert {"split", "one stage", "latency", "cost"} <= outcomes


# -- planning time (printed, never asserted) ------------------------------------------------

def big_problem(rate: float) -> Problem:
    rng = np.random.default_rng(7)
    n = 24
    surv = monotone_survival(1 - np.cumsum(rng.uniform(0, 0.08, n)))
    classes = []
    for name, speed, cost in (("a100", 1.0, 3.0), ("v100", 2.0, 1.5), ("t4", 3.5, 1.0)):
        one = rng.uniform(0.5, 1.5, n) * speed
        blocks = np.stack([one, one * 2.2, one * 6.5], 1)
        heads = np.stack([one * 0.1, one * 0.15, one * 0.4], 1)
        classes.append(DeviceClass(name, 16, LatencyTable.build((1, 4, 16), blocks, heads),
                                   cost))
    return Problem(ModelChain(n, tuple(range(n)), surv), tuple(classes), rate, 400.0, 16,
                   transfer=Transfer((2e5,) * n, 1e-6, 0.2))


@pytest.mark.parametrize("rate", [2000.0, 6000.0])
def test_planning_time_24_blocks_16_devices_3_classes(rate):
    p = big_problem(rate)
    start = time.perf_counter()
    result = plan(p)
    took = time.perf_counter() - start
    print(f"\nplan: 24 blocks x 16 devices x 3 classes at {rate:g} req/s: {took * 1000:.0f} ms; "
          f"{result.reason}")
    assert result.feasible

"""Threshold tuning (Apparate §3.2): replay, greedy hill climb, step rules, grid baseline."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from services.exits.exit_window import ExitWindow
from services.exits.latency_profile import LatencyProfile
from services.exits.scores import exit_score
from services.tuner.thresholds import (
    Replay,
    allowed_disagreements,
    evaluate,
    grid_gap,
    grid_search,
    meets,
    tune,
)


def synthetic(seed: int, n: int = 128, ramps: tuple[int, ...] = (1, 3, 5, 7, 9), n_sites: int = 12,
              classes: int = 10, full_ms: float = 20.0, front_loaded: bool = False
              ) -> tuple[ExitWindow, LatencyProfile]:
    """A window with realistic structure: deeper ramps agree more with the final model, and
    scores are lower (more confident) for easy samples and for agreeing predictions."""
    rng = np.random.default_rng(seed)
    final = rng.integers(0, classes, n)
    difficulty = rng.beta(2, 2, n)
    pred = np.empty((len(ramps), n), np.int64)
    score = np.empty((len(ramps), n))
    for k, site in enumerate(ramps):
        skill = (site + 1) / (n_sites + 1)
        agree = rng.random(n) < 1 / (1 + np.exp(-(skill - difficulty) * 8))
        pred[k] = np.where(agree, final, (final + rng.integers(1, classes, n)) % classes)
        score[k] = np.clip(0.5 * difficulty + 0.3 * (1 - skill) + 0.25 * ~agree
                           + rng.normal(0, 0.08, n), 0, 1)
    frac = np.arange(1, n_sites + 1) / (n_sites + 1)
    if front_loaded:  # CV-like: most latency early in the model
        frac = np.sqrt(frac)
    prefix = np.append(full_ms * frac, full_ms)
    cost = np.full(n_sites, 0.02 * full_ms / len(ramps))
    return ExitWindow.build(ramps, pred, score, final), LatencyProfile.build(prefix, cost)


# Hand-worked window: two ramps at sites 0 and 1 of a 10 ms model.
# exit latency: ramp 0 = 2 + 0.5 = 2.5, ramp 1 = 6 + 0.5 + 0.5 = 7, no exit = 10 + 1 = 11.
HAND_PROFILE = LatencyProfile.build([2.0, 6.0, 10.0], [0.5, 0.5])
S0 = [0.05, 0.15, 0.25, 0.35, 0.45, 0.55, 0.65, 0.75, 0.85, 0.95]
S1 = [0.02, 0.12, 0.22, 0.32, 0.42, 0.52, 0.62, 0.72, 0.82, 0.92]
FINAL = list(range(10))
OK0 = [True, True, True, False, True, False, False, False, False, False]
OK1 = [True] * 7 + [False] * 3


def hand_window() -> ExitWindow:
    pred0 = [f if ok else f + 100 for f, ok in zip(FINAL, OK0)]
    pred1 = [f if ok else f + 100 for f, ok in zip(FINAL, OK1)]
    return ExitWindow.build((0, 1), [pred0, pred1], [S0, S1], FINAL)


def test_evaluate_hand_worked() -> None:
    ev = evaluate(hand_window(), HAND_PROFILE, (0.3, 0.7))
    # ramp 0 answers 0,1,2 (right); ramp 1 answers 3..6 (right); 7,8,9 run to the end
    assert ev.exit_rates == (0.3, 0.4)
    assert ev.mean_latency_ms == pytest.approx((3 * 2.5 + 4 * 7 + 3 * 11) / 10)
    assert ev.savings_ms == pytest.approx(10 - 6.85)
    assert (ev.agreement, ev.disagreements, ev.samples) == (1.0, 0, 10)
    # the earliest passing ramp answers: sample 3 exits wrongly at ramp 0 once 0.35 < th0
    ev = evaluate(hand_window(), HAND_PROFILE, (0.4, 0.7))
    assert ev.exit_rates == (0.4, 0.3) and ev.disagreements == 1 and ev.agreement == 0.9


def test_evaluate_zero_never_exits_and_threshold_is_strict() -> None:
    ev = evaluate(hand_window(), HAND_PROFILE, (0.0, 0.0))
    assert ev.exit_rates == (0.0, 0.0) and ev.agreement == 1.0
    assert ev.savings_ms == pytest.approx(-1.0)  # both ramps' overhead, nothing saved
    assert evaluate(hand_window(), HAND_PROFILE, (0.05, 0.0)).exit_rates == (0.0, 0.0)
    assert evaluate(hand_window(), HAND_PROFILE, (0.0500001, 0.0)).exit_rates == (0.1, 0.0)


def test_tune_hand_worked_two_ramps() -> None:
    """Traced by hand with constraint 0.1 (one disagreement of ten allowed)."""
    res = tune(hand_window(), HAND_PROFILE, constraint=0.1, initial_step=0.1)
    assert res.thresholds == (0.55, 0.7125)
    assert res.evaluation.exit_rates == (0.5, 0.2)
    assert res.evaluation.disagreements == 1
    assert res.evaluation.mean_latency_ms == pytest.approx((5 * 2.5 + 2 * 7 + 3 * 11) / 10)
    assert [(m.round, m.ramp_id, m.threshold, m.step) for m in res.moves] == [
        (1, 0, 0.1, 0.1),      # both moves are free; ramp 0 gains more
        (2, 0, 0.3, 0.2),      # doubled step
        (3, 1, 0.1, 0.1),      # ramp 0 at 0.7 violates; the neutral move is all that is left
        (4, 0, 0.5, 0.2),      # halved after the violation; costs one disagreement
        (5, 1, 0.3, 0.2),
        (6, 1, 0.7, 0.4),      # free gain: 5 and 6 now exit at ramp 1
        (8, 0, 0.55, 0.05),    # halved in rounds 5, 6, 7
        (13, 1, 0.7125, 0.0125),
    ]
    assert res.rounds == 16 and res.steps == (0.01, 0.01)


def test_tune_hand_worked_matches_exhaustive_boundary() -> None:
    w = hand_window()
    grid = grid_search(w, HAND_PROFILE, constraint=0.1)
    assert grid.evaluation.mean_latency_ms == pytest.approx(5.95)  # the boundary's best cell
    assert grid_gap(tune(w, HAND_PROFILE, 0.1).evaluation.savings_ms,
                    grid.evaluation.savings_ms) == pytest.approx(0.0)
    # stricter constraint: no disagreement at all; best is ramp 0 < 0.35, ramp 1 < 0.7
    strict = tune(w, HAND_PROFILE, constraint=0.0)
    assert strict.evaluation.disagreements == 0
    assert strict.evaluation.exit_rates == (0.3, 0.4)
    assert strict.evaluation.savings_ms == pytest.approx(
        grid_search(w, HAND_PROFILE, 0.0).evaluation.savings_ms)


def test_allowed_disagreements_is_exact() -> None:
    assert allowed_disagreements(100, 0.01) == 1
    assert allowed_disagreements(16, 0.01) == 0
    assert allowed_disagreements(10, 0.1) == 1
    assert allowed_disagreements(128, 0.0) == 0


@pytest.mark.parametrize("seed", range(6))
def test_monotonicity_raising_one_threshold(seed: int) -> None:
    """What the search relies on: raising ramp k's threshold only moves samples to ramp k
    from later exits, so its exits grow, later exits shrink, earlier ones are untouched and
    no sample gets slower."""
    w, p = synthetic(seed, n=64)
    rp = Replay(w, p)
    rng = np.random.default_rng(seed)
    for _ in range(20):
        th = rng.uniform(0, 0.8, w.n_ramps)
        k = int(rng.integers(w.n_ramps))
        up = th.copy()
        up[k] += rng.uniform(0.001, 0.3)
        e0, e1 = rp.exit_index(np.stack([th, up]))
        assert np.all(rp.exit_lat[e1] <= rp.exit_lat[e0])
        moved = e0 != e1
        assert np.all(e1[moved] == k) and np.all(e0[moved] > k)
        c0 = np.bincount(e0, minlength=w.n_ramps + 1)
        c1 = np.bincount(e1, minlength=w.n_ramps + 1)
        assert c1[k] >= c0[k] and np.all(c1[:k] == c0[:k]) and np.all(c1[k + 1:] <= c0[k + 1:])
        ev0, ev1 = rp.evaluation(th), rp.evaluation(up)
        assert ev1.mean_latency_ms <= ev0.mean_latency_ms + 1e-12
        assert sum(ev1.exit_rates) >= sum(ev0.exit_rates)


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("constraint", [0.0, 0.01, 0.05])
def test_result_meets_constraint_and_cannot_step_further(seed: int, constraint: float) -> None:
    w, p = synthetic(seed)
    res = tune(w, p, constraint=constraint)
    assert meets(res.evaluation, constraint)
    assert res.evaluation.agreement >= 1 - constraint - 1e-12
    # the climb's own bookkeeping (bitsets) agrees with the numpy replay
    ev = evaluate(w, p, res.thresholds)
    assert ev.disagreements == res.evaluation.disagreements
    assert ev.exit_rates == res.evaluation.exit_rates
    assert ev.mean_latency_ms == pytest.approx(res.evaluation.mean_latency_ms)
    # stop condition: every movable ramp is at the floor step and a floor step violates
    for k, t in enumerate(res.thresholds):
        if t < 1.0:
            assert res.steps[k] == 0.01
            up = list(res.thresholds)
            up[k] = min(t + 0.01, 1.0)
            assert not meets(evaluate(w, p, up), constraint)


def test_each_move_stays_feasible_and_gains_or_is_neutral() -> None:
    w, p = synthetic(3)
    res = tune(w, p, initial_step=0.1)
    th = [0.0] * w.n_ramps
    prev = evaluate(w, p, th)
    for m in res.moves:
        th[w.ramp_ids.index(m.ramp_id)] = m.threshold
        ev = evaluate(w, p, th)
        assert meets(ev, 0.01)
        assert ev.mean_latency_ms <= prev.mean_latency_ms + 1e-12
        assert m.gain_ms == pytest.approx(prev.mean_latency_ms - ev.mean_latency_ms, abs=1e-9)
        prev = ev
    assert tuple(th) == res.thresholds


def test_step_doubles_on_chosen_move() -> None:
    # one ramp, every sample agrees, scores spread: every move is a free gain
    n = 50
    w = ExitWindow.build((0,), [list(range(n))], [np.linspace(0.01, 0.99, n)], list(range(n)))
    p = LatencyProfile.build([1.0, 10.0], [0.1])
    res = tune(w, p, initial_step=0.1)
    assert [m.step for m in res.moves] == [0.1, 0.2, 0.4, 0.8][: len(res.moves)]
    assert [m.threshold for m in res.moves][:3] == [0.1, 0.3, 0.7]
    assert res.thresholds == (1.0,)  # capped at the max threshold: everything exits
    assert res.evaluation.exit_rates == (1.0,)


def test_step_halves_on_violation_down_to_the_floor_then_stops() -> None:
    # every sample disagrees and is maximally confident: any threshold > 0 violates
    w = ExitWindow.build((2,), [[1, 1, 1, 1]], [[0.0, 0.0, 0.0, 0.0]], [0, 0, 0, 0])
    p = LatencyProfile.build([1.0, 2.0, 3.0, 4.0], [0.1, 0.1, 0.1])
    res = tune(w, p, initial_step=0.1)
    # 0.1 -> 0.05 -> 0.025 -> 0.0125 -> 0.01 (floor), then a violation at the floor stops it
    assert res.moves == () and res.thresholds == (0.0,)
    assert res.rounds == 5 and res.steps == (0.01,)
    res = tune(w, p, floor=0.02, initial_step=0.08)
    assert res.rounds == 3 and res.steps == (0.02,)


def test_lossy_move_waits_for_a_finer_step_of_a_violating_ramp() -> None:
    """Ramp 0 at 0.1 exits two wrong samples (violation); ramp 1 at 0.1 offers 8 ms for one
    disagreement. Spending it there would lock ramp 0 out for good; halving ramp 0 first shows
    its 0.05 step buys 48 ms for the same single disagreement."""
    far = 0.9
    s0 = [0.01, 0.03, 0.03, 0.03, 0.03, 0.03, 0.07, far, far, far]
    s1 = [far, far, far, far, far, far, far, 0.05, 0.06, far]
    ok0 = [False, True, True, True, True, True, False, False, False, False]
    ok1 = [True] * 7 + [False, True, True]
    w = ExitWindow.build((0, 1), [[f if ok else f + 100 for f, ok in zip(FINAL, oks)]
                                  for oks in (ok0, ok1)], [s0, s1], FINAL)
    p = LatencyProfile.build([2.0, 6.0, 10.0], [0.0, 0.0])
    res = tune(w, p, constraint=0.1, initial_step=0.1)
    assert (res.moves[0].round, res.moves[0].ramp_id, res.moves[0].threshold) == (2, 0, 0.05)
    assert res.evaluation.exit_rates == (0.6, 0.0)
    assert res.evaluation.savings_ms == pytest.approx(4.8)
    assert res.evaluation.savings_ms == pytest.approx(grid_search(w, p, 0.1, grid=[
        round(0.01 * i, 2) for i in range(101)]).evaluation.savings_ms)


def test_start_is_used_when_feasible_and_dropped_when_not() -> None:
    w = hand_window()
    res = tune(w, HAND_PROFILE, constraint=0.1, start=(0.3, 0.7))
    assert res.start == (0.3, 0.7)
    assert res.evaluation.savings_ms >= evaluate(w, HAND_PROFILE, (0.3, 0.7)).savings_ms
    assert res.thresholds[0] >= 0.3 and res.thresholds[1] >= 0.7
    bad = tune(w, HAND_PROFILE, constraint=0.0, start=(0.9, 0.9))  # violates: restart at 0
    assert bad.start == (0.0, 0.0) and bad.evaluation.disagreements == 0


def test_no_ramps_and_tiny_windows() -> None:
    w = ExitWindow.build((), np.zeros((0, 3), np.int64), np.zeros((0, 3)), [1, 2, 3])
    p = LatencyProfile.build([4.0], [])
    res = tune(w, p)
    assert res.thresholds == () and res.rounds == 0 and res.evaluation.savings_ms == 0.0
    assert grid_search(w, p).thresholds == ()
    one = ExitWindow.build((0,), [[7]], [[0.2]], [7])
    assert tune(one, LatencyProfile.build([1.0, 2.0], [0.0])).evaluation.exit_rates == (1.0,)


@pytest.mark.parametrize("seed", range(6))
def test_tuned_savings_within_4pct_of_grid_three_ramps(seed: int) -> None:
    w, p = synthetic(seed, ramps=(2, 5, 8), front_loaded=seed % 2 == 1)
    tuned, grid = tune(w, p), grid_search(w, p)
    assert meets(grid.evaluation, 0.01)
    assert grid.evaluation.savings_ms > 0
    assert grid_gap(tuned.evaluation.savings_ms, grid.evaluation.savings_ms) <= 0.04


@pytest.mark.parametrize("seed", [11, 12])
def test_tuned_savings_within_4pct_of_grid_four_ramps(seed: int) -> None:
    w, p = synthetic(seed, n=96, ramps=(1, 4, 7, 10))
    grid = grid_search(w, p, grid=[round(0.1 * i, 1) for i in range(11)])
    assert grid.evaluated == 11 ** 4
    assert grid_gap(tune(w, p).evaluation.savings_ms, grid.evaluation.savings_ms) <= 0.04


def test_grid_search_is_exhaustive_on_a_small_case() -> None:
    w, p = synthetic(5, n=40, ramps=(3, 8))
    values = [0.0, 0.2, 0.4, 0.6]
    res = grid_search(w, p, 0.05, grid=values)
    best = min((evaluate(w, p, c).mean_latency_ms, c) for c in itertools.product(values, repeat=2)
               if meets(evaluate(w, p, c), 0.05))
    assert res.evaluation.mean_latency_ms == pytest.approx(best[0])
    assert res.thresholds == best[1] and res.evaluated == 16


def test_grid_gap() -> None:
    assert grid_gap(9.6, 10.0) == pytest.approx(0.04)
    assert grid_gap(11.0, 10.0) == pytest.approx(-0.1)
    assert grid_gap(1.0, 0.0) == 0.0


def test_pluggable_exit_score() -> None:
    rng = np.random.default_rng(0)
    logits = [rng.normal(size=(20, 5)) * s for s in (1.0, 3.0)]
    final = rng.normal(size=(20, 5))
    w = ExitWindow.from_logits((1, 4), logits, final, score="entropy")
    assert np.allclose(w.score[1], exit_score(logits[1], "entropy"))
    assert np.array_equal(w.pred[0], logits[0].argmax(1)) and np.array_equal(w.final, final.argmax(1))
    custom = ExitWindow.from_logits((1, 4), logits, final.argmax(1), score=lambda z: np.zeros(len(z)))
    assert np.all(custom.score == 0)
    p = LatencyProfile.build([1, 2, 3, 4, 5, 6], [0.1] * 5)
    assert meets(tune(w, p).evaluation, 0.01)


def test_profile_and_window_helpers() -> None:
    p = LatencyProfile.from_blocks([1.0, 2.0, 3.0, 4.0], after_block=[0, 2], ramp_cost_ms=[0.2, 0.3])
    assert p.prefix_ms.tolist() == [1.0, 6.0, 10.0] and p.full_ms == 10.0 and p.n_sites == 2
    assert p.cost_of([0, 1]) == pytest.approx(0.5) and p.cost_of([]) == 0.0
    w, _ = synthetic(0, n=8, ramps=(1, 3, 5))
    sub = w.select([5, 1])
    assert sub.ramp_ids == (1, 5) and np.array_equal(sub.score[1], w.score[2])
    both = ExitWindow.concat([w, w])
    assert both.n_samples == 16 and both.n_ramps == 3


@pytest.mark.parametrize("kwargs, match", [
    ({"constraint": 1.0}, "constraint"),
    ({"constraint": -0.1}, "constraint"),
    ({"floor": 0.0}, "floor"),
    ({"floor": 0.2, "initial_step": 0.1}, "floor"),
    ({"start": (0.1,)}, "one threshold per active ramp"),
    ({"start": (0.1, -0.2)}, ">= 0"),
    ({"max_threshold": 0.0}, "max_threshold"),
])
def test_tune_rejects_bad_arguments(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        tune(hand_window(), HAND_PROFILE, **kwargs)


def test_bad_inputs() -> None:
    w = hand_window()
    with pytest.raises(ValueError, match="one threshold per active ramp"):
        evaluate(w, HAND_PROFILE, (0.1,))
    with pytest.raises(ValueError, match="finite"):
        evaluate(w, HAND_PROFILE, (0.1, float("nan")))
    with pytest.raises(ValueError, match="outside"):
        evaluate(w, LatencyProfile.build([1.0, 2.0], [0.1]), (0.1, 0.1))
    with pytest.raises(ValueError, match="ascending"):
        ExitWindow.build((1, 0), [S0, S1], [S0, S1], FINAL)
    with pytest.raises(ValueError, match="2x10"):
        ExitWindow.build((0, 1), [FINAL], [S0, S1], FINAL)
    with pytest.raises(ValueError, match="integer"):
        ExitWindow.build((0, 1), [S0, S1], [S0, S1], FINAL)
    with pytest.raises(ValueError, match=">= 0"):
        ExitWindow.build((0,), [FINAL], [[-0.1] * 10], FINAL)
    with pytest.raises(ValueError, match="finite"):
        ExitWindow.build((0,), [FINAL], [[float("nan")] * 10], FINAL)
    with pytest.raises(ValueError, match="non-empty"):
        ExitWindow.build((0,), np.zeros((1, 0), np.int64), np.zeros((1, 0)), [])
    with pytest.raises(ValueError, match="non-decreasing"):
        LatencyProfile.build([2.0, 1.0], [0.1])
    with pytest.raises(ValueError, match="one per site"):
        LatencyProfile.build([1.0, 2.0], [0.1, 0.1])
    with pytest.raises(ValueError, match="non-negative"):
        LatencyProfile.build([1.0, 2.0], [-0.1])
    with pytest.raises(ValueError, match="positive"):
        LatencyProfile.build([0.0], [])
    with pytest.raises(ValueError, match="R <= 4"):
        grid_search(*synthetic(0, n=8))
    with pytest.raises(ValueError, match="not in this window"):
        w.select([3])
    with pytest.raises(ValueError, match="different active ramps"):
        ExitWindow.concat([w, w.select([0])])


def test_default_climb_stays_on_the_floor_lattice_and_reaches_a_narrow_boundary() -> None:
    """Confident right answers score 0.015 and 0.018, a wrong one 0.021: the best threshold
    lies in (0.018, 0.021]. The default first step (0.08) halves to 0.04, 0.02, 0.01, so
    every threshold the climb visits is a multiple of the 0.01 floor and it lands on 0.02,
    as a grid of step 0.01 does. A first step of 0.1 halves to 0.0125, a lattice that
    steps over the boundary: it stops at 0.0125, where nothing exits."""
    scores = [0.015, 0.018, 0.021] + [0.5] * 7
    final = list(range(10))
    pred = [0, 1, 102] + final[3:]
    w = ExitWindow.build((0,), [pred], [scores], final)
    p = LatencyProfile.build([1.0, 10.0], [0.1])
    res = tune(w, p, constraint=0.0)
    assert res.thresholds == (0.02,)
    assert all(abs(m.threshold * 100 - round(m.threshold * 100)) < 1e-9 for m in res.moves)
    grid = grid_search(w, p, 0.0, tuple(round(0.01 * i, 2) for i in range(101)))
    assert res.evaluation.savings_ms == pytest.approx(grid.evaluation.savings_ms)
    coarse = tune(w, p, constraint=0.0, initial_step=0.1)
    assert coarse.thresholds == (0.0125,) and coarse.evaluation.exit_rates == (0.0,)



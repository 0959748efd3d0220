"""Ramp adjustment (Apparate §3.3, Algorithm 2, Fig. 11): utilities, candidates, budget."""

from __future__ import annotations

import numpy as np
import pytest

from services.exits.exit_window import ExitWindow
from services.exits.latency_profile import LatencyProfile
from services.tuner.ramp_adjust import (
    ACTIONS,
    AdjustInput,
    adjust,
    interval_candidates,
    upper_bound_rate,
    utilities,
)
from services.tuner.thresholds import evaluate, meets, tune
from tests.unit.test_tuner_thresholds import HAND_PROFILE, hand_window, synthetic

N = 100


def block_window(ramps: tuple[int, ...], exitable: dict[int, range], n: int = N) -> ExitWindow:
    """Ramp k agrees with the final model on ``exitable[k]`` (score 0.1) and disagrees on every
    other sample (score 0.5): under constraint 0 the best threshold of k lies in (0.1, 0.5]."""
    final = np.arange(n) % 7
    pred = np.tile(final, (len(ramps), 1))
    score = np.full((len(ramps), n), 0.5)
    for k, site in enumerate(ramps):
        mask = np.zeros(n, bool)
        mask[list(exitable.get(site, ()))] = True
        pred[k, ~mask] = (final[~mask] + 1) % 7
        score[k, mask] = 0.1
    return ExitWindow.build(ramps, pred, score, final)


def profile(cost: dict[int, float] | None = None, late: bool = True) -> LatencyProfile:
    """10 sites; site s at s + 1 ms, full model 11 ms. ``late``: sites 8 and 9 sit right before
    the end (10.8 and 10.9 ms), so exits there save next to nothing."""
    prefix = [1, 2, 3, 4, 5, 6, 7, 8, 10.8, 10.9, 11] if late else list(range(1, 12))
    costs = [0.2] * 10
    for site, c in (cost or {}).items():
        costs[site] = c
    return LatencyProfile.build(prefix, costs)


def fig11_state(m8: int = 40, **kw) -> AdjustInput:
    """Active 2 (+), 5 (-), 8 (-): ramp 2 answers 30 samples early; ramp 5 answers one; ramp 8
    answers ``m8`` but is so late it saves nothing."""
    w = block_window((2, 5, 8), {2: range(30), 5: range(30, 31), 8: range(31, 31 + m8)})
    kw.setdefault("profile", profile())
    kw.setdefault("budget", 0.1)  # 1.1 ms: the three active ramps (0.6 ms) fit
    return AdjustInput(window=w, thresholds=(0.3, 0.3, 0.3), constraint=0.0, **kw)


def test_utilities_hand_worked() -> None:
    u = utilities(hand_window(), HAND_PROFILE, (0.3, 0.7))
    # ramp 0: samples 0-2 would otherwise exit at ramp 1 (7 - 0.5 = 6.5 ms instead of 2.5);
    # the 7 samples passing it pay 0.5 each
    assert (u[0].ramp_id, u[0].exits) == (0, 3)
    assert (u[0].saved_ms, u[0].added_ms, u[0].utility_ms) == pytest.approx((12.0, 3.5, 8.5))
    # ramp 1: samples 3-6 would run to the end (11 - 0.5 = 10.5 instead of 7); 3 pass it
    assert (u[1].ramp_id, u[1].exits) == (1, 4)
    assert (u[1].saved_ms, u[1].added_ms, u[1].utility_ms) == pytest.approx((14.0, 1.5, 12.5))


@pytest.mark.parametrize("seed", range(5))
def test_utility_is_the_latency_removing_the_ramp_would_add(seed: int) -> None:
    w, p = synthetic(seed, n=64)
    th = tune(w, p).thresholds
    base = evaluate(w, p, th).mean_latency_ms
    for k, u in enumerate(utilities(w, p, th)):
        rest = [r for r in w.ramp_ids if r != u.ramp_id]
        without = evaluate(w.select(rest), p, th[:k] + th[k + 1:]).mean_latency_ms
        assert u.utility_ms == pytest.approx((without - base) * w.n_samples)
        assert u.exits == round(evaluate(w, p, th).exit_rates[k] * w.n_samples)


def test_fig11_candidates_between_deactivations() -> None:
    # P = 2; ramps 5 and 9 deactivated: intervals 3-4, 6-8, 10-11
    assert interval_candidates(12, 2, [5, 9]) == [[3, 7, 10], [4, 8, 11]]
    rates = {5: 0.1, 9: 0.2}
    assert upper_bound_rate(3, rates) == pytest.approx(0.1)   # following: 5
    assert upper_bound_rate(7, rates) == pytest.approx(0.3)   # following 9 + earlier 5
    assert upper_bound_rate(10, rates) == pytest.approx(0.3)  # no following: earlier 5 and 9
    assert upper_bound_rate(4, rates) == pytest.approx(0.1)


def test_fig11_candidates_other_shapes() -> None:
    # a negative ramp before P counts as an earlier deactivation, never as a boundary
    assert interval_candidates(12, 4, [1, 8]) == [[6, 10], [7, 11]]
    assert upper_bound_rate(6, {1: 0.05, 8: 0.1}) == pytest.approx(0.15)
    # no positive ramp left: intervals start at the model's first site
    assert interval_candidates(10, -1, [3, 7]) == [[1, 5, 8], [2, 6, 9]]
    # adjacent deactivations leave empty intervals, which yield no candidate
    assert interval_candidates(6, 2, [3, 4]) == [[5]]
    assert upper_bound_rate(5, {3: 0.1, 4: 0.2}) == pytest.approx(0.3)
    # nothing after P
    assert interval_candidates(6, 5, [1]) == []
    # a long interval is probed middle-first, then the middle of what follows
    assert interval_candidates(10, -1, []) == [[4], [7], [8], [9]]


def test_deactivate_negatives_and_trial_best_upper_bound() -> None:
    d = adjust(fig11_state())
    assert d.action == "deactivate_and_trial"
    assert [u.ramp_id for u in d.utilities if u.utility_ms < 0] == [5, 8]
    assert d.utilities[1].utility_ms == pytest.approx(5.0 - 0.2 * 69)  # saves 5 ms once
    assert d.utilities[2].utility_ms == pytest.approx(-0.2 * 29)       # saves 0 per exit
    assert d.deactivated == (5, 8) and d.added == (6,) and d.active == (2, 6)
    cand = {c.site: c for c in d.candidates}
    assert sorted(cand) == [3, 6, 9]  # round 1 found a positive one
    assert cand[3].upper_bound_rate == pytest.approx(0.01)
    assert cand[6].upper_bound_rate == pytest.approx(0.41)
    assert cand[9].upper_bound_rate == pytest.approx(0.41)
    # 70 samples reach past ramp 2; 41 of them might exit at 6
    assert cand[6].projected_utility_ms == pytest.approx(41 * (11 - 7 - 0.2) - 29 * 0.2)
    assert cand[3].projected_utility_ms == pytest.approx(1 * (11 - 4 - 0.2) - 69 * 0.2)
    assert cand[9].projected_utility_ms < 0
    # the trial starts at 0; the kept ramp still meets the constraint alone, so it keeps 0.3
    assert d.thresholds == (0.3, 0.0)


def test_later_candidates_when_the_middles_are_negative() -> None:
    d = adjust(fig11_state(profile=profile({6: 3.5}), budget=0.5))  # 6 too costly to pay off
    assert d.added == (7,)
    assert [c.site for c in d.candidates] == [3, 6, 9, 4, 7]
    assert [c.round for c in d.candidates] == [1, 1, 1, 2, 2]
    assert d.candidates[-1].projected_utility_ms == pytest.approx(41 * 2.8 - 29 * 0.2)


def test_budget_excludes_a_candidate() -> None:
    # limit 1.0 ms: the active set (0.6) fits, but ramp 2 + site 6 (0.2 + 1.0) does not
    d = adjust(fig11_state(profile=profile({6: 1.0}), budget=1.0 / 11))
    c6 = next(c for c in d.candidates if c.site == 6)
    assert c6.projected_utility_ms > 0 and not c6.eligible
    assert d.added == (7,)


def test_excluded_sites_are_not_trialed() -> None:
    d = adjust(fig11_state(exclude=frozenset({6})))
    assert d.added == (7,)


def test_no_candidate_with_positive_upper_bound() -> None:
    d = adjust(fig11_state(m8=2))
    assert d.action == "deactivate_and_trial" and d.deactivated == (5, 8)
    assert d.added == () and d.active == (2,)
    assert all(c.projected_utility_ms <= 0 for c in d.candidates)
    assert "no candidate" in d.reason


def test_quick_retune_fixes_a_fresh_trial_ramp() -> None:
    # ramp 5 was just trialed at threshold 0: pure overhead until tuned
    w = block_window((2, 5), {2: range(30), 5: range(30, 60)})
    state = AdjustInput(w, profile(late=False), thresholds=(0.3, 0.0), constraint=0.0, budget=0.1)
    assert utilities(w, state.profile, state.thresholds)[1].utility_ms < 0
    d = adjust(state)
    assert d.action == "retune" and d.active == (2, 5) and d.added == d.deactivated == ()
    assert 0.1 < d.thresholds[1] <= 0.5
    assert all(u.utility_ms >= 0 for u in utilities(w, state.profile, d.thresholds))
    assert meets(evaluate(w, state.profile, d.thresholds), 0.0)


def positive_state(**kw) -> AdjustInput:
    w = block_window((2, 5), {2: range(30), 5: range(30, 60)})
    kw.setdefault("profile", profile(late=False))
    kw.setdefault("budget", 0.1)
    return AdjustInput(w, thresholds=(0.3, 0.3), constraint=0.0, **kw)


def test_all_positive_adds_before_the_best_ramp() -> None:
    d = adjust(positive_state())
    u = {x.ramp_id: x.utility_ms for x in d.utilities}
    assert u[2] == pytest.approx(30 * 8.0 - 70 * 0.2) and u[5] == pytest.approx(30 * 4.8 - 40 * 0.2)
    assert d.action == "add_earlier" and d.added == (1,) and d.active == (1, 2, 5)
    assert d.thresholds == (0.0, 0.3, 0.3)


def test_all_positive_without_budget_shifts_the_worst_ramp() -> None:
    d = adjust(positive_state(budget=0.4 / 11))  # exactly two ramps' worth
    assert d.action == "shift_earlier" and d.deactivated == (5,) and d.added == (4,)
    assert d.active == (2, 4) and d.thresholds[1] == 0.0


def test_all_positive_adds_only_within_budget_and_free_sites() -> None:
    # site 1 is too expensive to add; the shift of ramp 5 to site 4 fits
    d = adjust(positive_state(profile=profile({1: 5.0}, late=False)))
    assert d.action == "shift_earlier" and d.added == (4,)
    # best ramp at site 0: nothing before it; worst ramp's earlier site is taken -> keep
    w = block_window((0, 1), {0: range(30), 1: range(30, 60)})
    d = adjust(AdjustInput(w, profile(late=False), (0.3, 0.3), constraint=0.0, budget=0.1))
    assert d.action == "keep" and d.active == (0, 1) and d.thresholds == (0.3, 0.3)
    # a single ramp is both best and worst: never shifted
    w = block_window((0,), {0: range(30)})
    d = adjust(AdjustInput(w, profile(late=False), (0.3,), constraint=0.0, budget=0.2 / 11))
    assert d.action == "keep"


def test_shift_retunes_kept_ramps_when_the_removal_breaks_the_constraint() -> None:
    # ramp 5 is confident (0.2) but wrong on samples 0-29, which ramp 2 answers first;
    # ramp 2 is the worse one (its exits would otherwise exit at 5 anyway)
    w = block_window((2, 5), {2: range(30), 5: range(30, 60)})
    score, pred = w.score.copy(), w.pred.copy()
    score[1, :30] = 0.2
    w = ExitWindow.build((2, 5), pred, score, w.final)
    state = AdjustInput(w, profile(late=False), (0.3, 0.3), constraint=0.0, budget=0.4 / 11)
    u = {x.ramp_id: x.utility_ms for x in utilities(w, state.profile, state.thresholds)}
    assert u[2] == pytest.approx(30 * 3.0 - 70 * 0.2) and u[2] < u[5]
    d = adjust(state)
    assert d.action == "shift_earlier" and d.active == (1, 5) and d.added == (1,)
    th5 = d.thresholds[1]
    assert 0.1 < th5 <= 0.2  # re-tuned: at 0.3 ramp 5 would now answer samples 0-29 wrongly
    assert meets(evaluate(w.select([5]), state.profile, [th5]), 0.0)


def test_shift_must_fit_the_budget() -> None:
    # site 4 is over budget: the shift passes over it to the nearest site that fits (3)
    d = adjust(positive_state(profile=profile({1: 5.0, 4: 0.5}, late=False), budget=0.5 / 11))
    assert d.action == "shift_earlier" and d.active == (2, 3) and d.added == (3,)
    # no free earlier site fits: keep
    costly = {0: 0.5, 1: 5.0, 3: 0.5, 4: 0.5}
    d = adjust(positive_state(profile=profile(costly, late=False), budget=0.5 / 11))
    assert d.action == "keep" and d.active == (2, 5)


def test_a_worst_ramp_behind_the_best_shifts_past_it() -> None:
    # every sample exits at ramp 2, so none reaches ramp 3: its utility is 0, not negative;
    # its one-earlier site is the best ramp's, so it moves before it
    w = block_window((2, 3), {2: range(N), 3: range(N)})
    state = AdjustInput(w, profile(late=False), (0.3, 0.3), constraint=0.0, budget=0.4 / 11)
    u = {x.ramp_id: x.utility_ms for x in utilities(w, state.profile, state.thresholds)}
    assert u[3] == 0 < u[2]
    d = adjust(state)
    assert d.action == "shift_earlier" and d.deactivated == (3,) and d.added == (1,)
    assert d.active == (1, 2) and d.thresholds == (0.0, 0.3)


def test_a_shift_skips_sites_no_sample_would_reach() -> None:
    # ramp 4 answers every sample: sites 5-8 lie behind it, so moving ramp 9 (or 6) there
    # shows nothing; the shift goes to the nearest free site before the best ramp (3)
    w = block_window((4, 6, 9), {4: range(N), 6: range(N), 9: range(N)})
    state = AdjustInput(w, profile(late=False), (0.3, 0.3, 0.3), constraint=0.0,
                        budget=0.6 / 11)
    d = adjust(state)
    assert d.action == "shift_earlier" and d.deactivated == (9,) and d.added == (3,)
    assert d.active == (3, 4, 6) and d.thresholds == (0.0, 0.3, 0.3)
    assert "released" not in d.reason and "releasing" not in d.reason
    # when ramp 4 answers half and ramp 6 the rest, sites 7-8 lie behind ramp 6 but site 5
    # is reached by the samples ramp 6 answers: one step earlier, as in §3.3
    w = block_window((4, 6, 9), {4: range(50), 6: range(N), 9: range(N)})
    d = adjust(AdjustInput(w, profile(late=False), (0.3, 0.3, 0.3), constraint=0.0,
                           budget=0.6 / 11))
    assert d.action == "shift_earlier" and d.deactivated == (9,) and d.added == (5,)


def test_a_shift_releases_ramps_no_sample_reached_to_fit_the_budget() -> None:
    # ramp 3 answers every sample, so none reaches ramps 4 and 6 (utility 0). Site 2 costs
    # 0.4 ms: [2, 3, 4] is over a 0.6 ms budget, [2, 3] fits once idle ramp 4 is released
    p = profile({2: 0.4}, late=False)
    w = block_window((3, 4, 6), {3: range(N), 4: range(N), 6: range(N)})
    d = adjust(AdjustInput(w, p, (0.3, 0.3, 0.3), constraint=0.0, budget=0.6 / 11))
    assert d.action == "shift_earlier" and d.active == (2, 3) and d.added == (2,)
    assert d.deactivated == (4, 6) and d.thresholds == (0.0, 0.3)
    assert "releasing ramps no sample reached [4]" in d.reason
    # a ramp that some sample reached is never released: ramp 4 answers samples 50-99 here
    w = block_window((3, 4, 6), {3: range(50), 4: range(N), 6: range(N)})
    d = adjust(AdjustInput(w, p, (0.3, 0.3, 0.3), constraint=0.0, budget=0.6 / 11))
    assert d.action == "shift_earlier" and d.active == (1, 3, 4) and d.deactivated == (6,)
    # and nothing earlier is reached when the best ramp sits at site 0: keep
    w = block_window((0, 4, 6), {0: range(N), 4: range(N), 6: range(N)})
    d = adjust(AdjustInput(w, p, (0.3, 0.3, 0.3), constraint=0.0, budget=0.6 / 11))
    assert d.action == "keep" and d.active == (0, 4, 6)


def test_over_budget_drops_lowest_utility_ramps() -> None:
    d = adjust(positive_state(budget=0.2 / 11))
    assert d.action == "deactivate_and_trial" and d.deactivated == (5,) and d.active == (2,)
    assert d.added == () and "budget" in d.reason


def test_no_active_ramps_trials_the_middle_site() -> None:
    w = ExitWindow.build((), np.zeros((0, 5), np.int64), np.zeros((0, 5)), [0, 1, 2, 3, 4])
    d = adjust(AdjustInput(w, profile(), ()))
    assert d.action == "deactivate_and_trial" and d.added == (4,) and d.thresholds == (0.0,)
    d = adjust(AdjustInput(w, profile({4: 9.0}), ()))
    assert d.added == (7,)
    assert adjust(AdjustInput(w, profile(), (), budget=0.0)).action == "keep"


@pytest.mark.parametrize("seed", range(6))
def test_decisions_are_well_formed_and_within_budget(seed: int) -> None:
    w, p = synthetic(seed, n=128)
    for th in (tune(w, p).thresholds, (0.0,) * w.n_ramps, (0.3,) * w.n_ramps):
        d = adjust(AdjustInput(w, p, th))
        assert d.action in ACTIONS
        assert list(d.active) == sorted(set(d.active)) and len(d.thresholds) == len(d.active)
        assert set(d.added) <= set(d.active) and not set(d.deactivated) & set(d.active)
        assert set(d.active) == (set(w.ramp_ids) - set(d.deactivated)) | set(d.added)
        assert p.cost_of(d.active) <= 0.02 * p.full_ms + 1e-9
        assert all(d.thresholds[d.active.index(a)] == 0.0 for a in d.added)


def test_bad_inputs() -> None:
    state = positive_state()
    with pytest.raises(ValueError, match="budget"):
        adjust(AdjustInput(state.window, state.profile, state.thresholds, budget=-0.1))
    with pytest.raises(ValueError, match="one threshold per active ramp"):
        adjust(AdjustInput(state.window, state.profile, (0.3,)))
    with pytest.raises(ValueError, match="constraint"):
        adjust(AdjustInput(state.window, state.profile, state.thresholds, constraint=1.5))
    with pytest.raises(ValueError, match="excluded"):
        adjust(AdjustInput(state.window, state.profile, state.thresholds, exclude=frozenset({99})))
    with pytest.raises(ValueError, match="outside"):
        adjust(AdjustInput(state.window, LatencyProfile.build([1, 2, 3], [0.1, 0.1]), (0.3, 0.3)))
    with pytest.raises(ValueError, match="one threshold per active ramp"):
        utilities(state.window, state.profile, (0.3, 0.3, 0.3))

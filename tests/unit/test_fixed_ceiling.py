"""The best fixed config in hindsight: feasible, optimal where brute force can check it, and
within the ramp budget."""

from __future__ import annotations

from itertools import product

import numpy as np
import pytest

from services.sim.fixed_ceiling import best_fixed, fixed_latency, held_out, judge_fixed
from services.sim.trace import Trace
from services.tuner.thresholds import Replay


def _trace(n: int = 400, seed: int = 0, cost: float = 0.01) -> Trace:
    """Three sites at 2, 5 and 8 ms of a 10 ms model. A site agrees with the final model
    more often the deeper it is, and its score is lower where it agrees (noisily)."""
    rng = np.random.default_rng(seed)
    final = rng.integers(0, 5, n)
    preds, scores = [], []
    for p_agree in (0.4, 0.7, 0.95):
        agree = rng.random(n) < p_agree
        preds.append(np.where(agree, final, (final + 1) % 5))
        scores.append(np.clip(np.where(agree, 0.3, 0.6) + rng.normal(0, 0.15, n), 0, 1))
    return Trace(np.stack(preds), np.stack(scores), final, np.array([2.0, 5.0, 8.0, 10.0]),
                 np.full(3, cost))


def _latency(tr: Trace, active: tuple[int, ...], th: tuple[float, ...]):
    """(latency, agreement, exited) per sample of one config on the trace."""
    rp = Replay(tr.window(active), tr.profile())
    return tuple(a[0] for a in fixed_latency(rp, np.asarray([th], float)))


def _best(tr: Trace, constraint: float = 0.01, budget: float = 0.02, objective: str = "p50",
          sites: tuple[int, ...] = (0, 1, 2), **kw):
    return best_fixed(tr.window(sites), tr.profile(), constraint, budget, objective, **kw)


def _brute(tr: Trace, constraint: float, site: int) -> float:
    """The lowest median of one active site over every threshold its scores allow."""
    allowed = int(np.floor(constraint * tr.n_samples + 1e-9))
    best = float(tr.prefix_ms[-1])
    for t in [0.0, *(np.unique(tr.ramp_score[site]) + 1e-9)]:
        lat, agree, _ = _latency(tr, (site,), (float(t),))
        if (~agree).sum() <= allowed:
            best = min(best, float(np.median(lat)))
    return best


def test_latency_follows_latency_mode() -> None:
    tr = _trace(cost=0.5)
    lat, agree, done = _latency(tr, (0, 2), (1.01, 1.01))  # every sample exits at site 0
    assert done.all() and np.allclose(lat, 2.0 + 0.5)
    assert agree.mean() == pytest.approx((tr.ramp_pred[0] == tr.final_pred).mean())
    lat, _, done = _latency(tr, (0, 2), (0.0, 0.0))  # nothing exits: both heads paid
    assert not done.any() and np.allclose(lat, 10.0 + 1.0)


@pytest.mark.parametrize("constraint", [0.01, 0.05, 0.2])
def test_meets_the_constraint_and_matches_brute_force_on_one_site(constraint: float) -> None:
    tr = _trace()
    c = _best(tr, constraint, budget=1.0, sites=(2,))  # one site: one threshold to search
    assert 1 - c.agreement <= constraint + 1e-12
    assert c.p50_ms <= _brute(tr, constraint, 2) + 0.02  # the grid is 48 score quantiles


def test_beats_every_coarse_grid_config() -> None:
    tr = _trace(seed=3)
    c = _best(tr, 0.05, budget=1.0, objective="mean")
    allowed = int(0.05 * tr.n_samples)
    for th in product((0.0, 0.2, 0.3, 0.4), repeat=3):
        lat, agree, _ = _latency(tr, (0, 1, 2), th)
        if (~agree).sum() <= allowed:
            assert c.mean_ms <= lat.mean() + 1e-9


def test_objective_is_what_it_minimises() -> None:
    tr = _trace(seed=1)
    p50, mean = (_best(tr, 0.05, 1.0, objective=o) for o in ("p50", "mean"))
    assert p50.p50_ms <= mean.p50_ms + 1e-9
    assert mean.mean_ms <= p50.mean_ms + 1e-9


def test_no_exit_when_no_ramp_can_answer_within_the_constraint() -> None:
    tr = _trace()
    wrong = Trace((tr.final_pred + 1)[None].repeat(3, 0) % 5, tr.ramp_score, tr.final_pred,
                  tr.prefix_ms, tr.ramp_cost_ms)
    c = _best(wrong, 0.01, 1.0)
    assert c.active == () and c.exit_rate == 0 and c.agreement == 1
    assert c.as_dict()["p50_change"] == 0


def test_active_sets_stay_within_the_ramp_budget() -> None:
    tr = _trace(cost=0.15)  # 1.5 % of the model per head
    assert len(_best(tr, 0.05, budget=0.02).active) == 1
    assert len(_best(tr, 0.05, budget=0.05).active) <= 3


def test_bad_arguments_are_refused() -> None:
    tr = _trace(n=50)
    with pytest.raises(ValueError, match="objective"):
        _best(tr, objective="p99")
    with pytest.raises(ValueError, match="constraint"):
        _best(tr, constraint=1.0)
    with pytest.raises(ValueError, match="max_active"):
        _best(tr, max_active=0)


def test_judging_on_the_same_samples_repeats_the_search_figures() -> None:
    tr = _trace(seed=2)
    c = _best(tr, 0.05, 1.0)
    again = judge_fixed(tr.window((0, 1, 2)), tr.profile(), c)
    assert again == c


def test_held_out_chooses_on_the_first_part_and_judges_on_the_rest() -> None:
    """The second half's ramps turn useless: a config chosen on the first half exits there
    and breaks the constraint on the second, whatever it got in-sample."""
    tr = _trace(n=400, seed=4)
    pred = tr.ramp_pred.copy()
    pred[:, 200:] = (tr.final_pred[200:] + 1) % 5  # every ramp wrong after sample 200
    shifted = Trace(pred, tr.ramp_score, tr.final_pred, tr.prefix_ms, tr.ramp_cost_ms)
    sites = (0, 1, 2)
    first, rest = shifted.window(sites, 0, 200), shifted.window(sites, 200)
    h = held_out(first, rest, shifted.profile(), 0.05, 1.0)
    chosen = best_fixed(first, shifted.profile(), 0.05, 1.0)
    assert (h.active, h.thresholds) == (chosen.active, chosen.thresholds) and h.active
    assert h.agreement == pytest.approx(1 - h.exit_rate) and h.exit_rate > 0.05
    assert chosen.agreement >= 0.95  # in-sample it met the constraint

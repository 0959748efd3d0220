"""Ramp adjustment from evidence over every site (services.tuner.evidence_adjust)."""

from __future__ import annotations

import numpy as np

from services.exits.exit_window import ExitWindow
from services.exits.latency_profile import LatencyProfile
from services.tuner.controller import ExitController
from services.tuner.evidence_adjust import choose_active

# 4 sites of a 10 ms model, each ramp 0.05 ms: a 1% budget (0.1 ms) fits two ramps
PROFILE = LatencyProfile.build([2.0, 4.0, 6.0, 8.0, 10.0], [0.05] * 4)


def evidence(right: list[float], n: int = 400, seed: int = 0) -> ExitWindow:
    """Every site's view of ``n`` samples: site k is right (confidently) on a ``right[k]``
    share and unsure (score 0.9) elsewhere."""
    rng = np.random.default_rng(seed)
    final = rng.integers(0, 5, n)
    pred = np.tile(final, (4, 1))
    score = np.full((4, n), 0.9)
    for k, share in enumerate(right):
        ok = rng.random(n) < share
        score[k, ok] = rng.uniform(0.01, 0.05, ok.sum())
        pred[k, ~ok] = (final[~ok] + 1) % 5
    return ExitWindow.build((0, 1, 2, 3), pred, score, final)


def test_the_sites_that_save_most_are_chosen_with_their_thresholds():
    ev = evidence([0.0, 0.9, 0.0, 0.95])          # site 1 answers most early; 3 later
    c = choose_active(ev, PROFILE, (0,), budget=0.01, constraint=0.005)
    assert c.active[0] == 1 and len(c.active) <= 2 and 0 not in c.active
    assert all(t > 0.05 for t in c.thresholds[:1])   # it exits at once, no trial at 0
    assert c.savings_ms > c.deployed_savings_ms + 0.1


def test_the_budget_bounds_the_set():
    ev = evidence([0.5, 0.5, 0.5, 0.5])
    c = choose_active(ev, PROFILE, (), budget=0.005, constraint=0.005)   # one ramp fits
    assert len(c.active) == 1


def test_a_set_no_better_than_the_deployed_is_kept():
    ev = evidence([0.0, 0.9, 0.0, 0.0])
    c = choose_active(ev, PROFILE, (1,), budget=0.01, constraint=0.005)
    assert c.active == (1,) and "no set saves" in c.reason


def test_the_controller_adjusts_from_evidence_when_it_has_some():
    ev = evidence([0.0, 0.9, 0.0, 0.95])
    c = ExitController(PROFILE, (0,), budget=0.01, slack_windows=None, adjust_every=32,
                       evidence=lambda: ev)
    w = ExitWindow.build((0,), np.zeros((1, 32), int), np.full((1, 32), 0.9),
                         np.zeros(32, int))
    adjusts = [d for d in c.observe(w) if d.kind == "adjust"]
    assert [d.action for d in adjusts] == ["evidence_switch"]
    assert c.active[0] == 1 and adjusts[0].added and adjusts[0].deactivated == (0,)
    c.evidence = lambda: None                       # none yet: Apparate's own adjustment
    assert all(d.action != "evidence_switch" for d in c.observe(w))

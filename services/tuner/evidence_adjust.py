"""Ramp adjustment from evidence (pure): choose the active set on a window that holds every
candidate site.

Apparate's adjustment (``ramp_adjust``) only sees the active ramps, so it must trial a site
to learn what it would do: one site per round, starting at threshold 0, judged a round
later. With feature feedback (``tuner/refit.py``) the tuner holds, for a sample of recent
inputs, what *every* site's current head says about them. On such a window any active set
can be tuned and priced without a trial, so the set and its thresholds are chosen together:
greedy forward selection of the site that adds the most tuned savings within the ramp
budget, kept only when it beats the deployed set's tuned savings on the same samples by
``min_gain`` of the full model's latency.
"""

from __future__ import annotations

from dataclasses import dataclass

from services.exits.exit_window import ExitWindow
from services.exits.latency_profile import LatencyProfile
from services.tuner.thresholds import Climb, tune

MIN_GAIN = 0.01  # share of the full model's latency a new set must save beyond the deployed


@dataclass(frozen=True)
class EvidenceChoice:
    active: tuple[int, ...]
    thresholds: tuple[float, ...]
    savings_ms: float           # tuned mean savings of ``active`` on the evidence
    deployed_savings_ms: float  # the deployed set's, tuned on the same samples
    reason: str


def tuned_savings(window: ExitWindow, profile: LatencyProfile, sites: tuple[int, ...],
                  constraint: float, climb: Climb | None) -> tuple[float, tuple[float, ...]]:
    """(mean savings, thresholds) of ``sites`` tuned on ``window``; no sites: (0, ())."""
    if not sites:
        return 0.0, ()
    res = tune(window.select(list(sites)), profile, constraint, climb=climb)
    return res.evaluation.savings_ms, tuple(res.thresholds)


def choose_active(window: ExitWindow, profile: LatencyProfile, deployed: tuple[int, ...],
                  budget: float, constraint: float, climb: Climb | None = None,
                  min_gain: float = MIN_GAIN) -> EvidenceChoice:
    """The active set (and its thresholds) to deploy, from a window over every site."""
    limit = budget * profile.full_ms
    base, base_th = tuned_savings(window, profile, deployed, constraint, climb)
    chosen: tuple[int, ...] = ()
    best, best_th = 0.0, ()
    while True:
        step = None
        for s in window.ramp_ids:
            cand = tuple(sorted({*chosen, s}))
            if s in chosen or profile.cost_of(cand) > limit:
                continue
            sv, th = tuned_savings(window, profile, cand, constraint, climb)
            if sv > best and (step is None or sv > step[1]):
                step = (cand, sv, th)
        if step is None:
            break
        chosen, best, best_th = step
    if best > base + min_gain * profile.full_ms:
        return EvidenceChoice(chosen, best_th, best, base,
                              f"evidence on {window.n_samples} recent samples of every site: "
                              f"ramps {list(chosen)} save {best:.2f} ms, the deployed "
                              f"{list(deployed)} {base:.2f} ms")
    return EvidenceChoice(deployed, base_th, base, base,
                          f"evidence on {window.n_samples} samples: no set saves "
                          f"{min_gain:.0%} of the model more than the deployed")

"""Latency-focused ramp adjustment (Apparate §3.3, Algorithm 2, Fig. 11), pure.

Runs every ``ADJUST_EVERY`` samples on the window recorded under the deployed config and
returns a decision as data; the tuner service applies it and writes utilities and actions
to the store.

Choices where §3.3 is vague:

- utility of an active ramp = sum over the window of the latency it changes: inputs that
  exit there save the difference to where they would otherwise have exited (the next
  active ramp their score passes, else the end of the model; the ramp's own cost counts
  against them), inputs that pass it pay its cost. So ``utility_ms`` is exactly the total
  latency that removing the ramp would add (the reference code's "next exitable ramp").
- utility >= 0 counts as positive: only strictly negative ramps are deactivated.
- the "quick re-tune" is the §3.2 climb started from the deployed thresholds (from zero
  if they violate); it is accepted when every utility becomes >= 0 and the window's savings
  do not drop (or the deployed thresholds violate the constraint).
  Otherwise the better of the two configs on this window (ties: the deployed one) is the
  reference whose negative ramps are deactivated and whose exit rates are the "profiled"
  ones of Fig. 11.
- Fig. 11 intervals lie after the latest positive ramp P (none kept: from the model's
  start) and are delimited by the ramps deactivated in this round; the middle of sites
  a..b is ``(a + b) // 2`` (the earlier one: earlier ramps save more per exit); "later
  candidates" are the middles of what lies after the previous candidate in the interval.
- upper-bound exit rate of a candidate = the profiled exit rates of the first deactivated
  ramp after it plus every deactivated ramp before it; after the last deactivated ramp
  there is no following one, so only the earlier ones count.
- projected utility of candidate c: ``u`` = upper-bound rate x N capped by the inputs no
  kept ramp answers; saved = u x (full - prefix[c] - cost[c]) (nothing active follows P);
  added = (reached - u) x cost[c].
- ramps kept after a deactivation or a shift keep their thresholds when those still meet
  the constraint on the window without the removed ramps, else they are re-tuned; added
  and shifted ramps start at threshold 0 (§3.3).
- budget: sum of ramp_cost_ms over the active ramps <= budget x full-model latency; a
  config already over budget first drops its lowest-utility ramps.
- probing: add right before the highest-utility ramp if that site is free and fits the
  budget, else shift the lowest-utility ramp one site earlier (never the highest one; the
  shifted set must fit), else keep. Ties: the earlier ramp is "best", the later one
  "worst". A shift passes over sites that are taken, held back or over budget to the
  nearest one that is free and fits: a worst ramp right behind the best one would
  otherwise sit there for good (every input it could answer exits at the best ramp first,
  so its utility never turns negative), and with a budget of two ramps nothing before the
  best ramp would ever be probed. It also passes over sites that no sample of the window
  would reach (an earlier active ramp answers every one): a ramp moved there shows nothing.
  When the shifted set does not fit the budget, ramps that no sample reached (utility 0:
  no exits, no cost paid) are released, latest first, until it does: one-site steps
  behind a ramp that answers a whole scene would never reach the sites before it.
- an empty active set trials the middle site that fits the budget (nothing else can ever
  bring ramps back).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise

import numpy as np

from services.exits.exit_window import ExitWindow
from services.exits.initial import DEFAULT_BUDGET
from services.exits.latency_profile import LatencyProfile
from services.tuner.thresholds import (
    DEFAULT_CONSTRAINT,
    Climb,
    Replay,
    as_thresholds,
    check_constraint,
    meets,
    tune,
)

ADJUST_EVERY = 128     # samples between adjustment rounds (§3.3)
ACTIONS = ("retune", "deactivate_and_trial", "add_earlier", "shift_earlier", "keep")
_TOL = 1e-9


@dataclass(frozen=True)
class RampUtility:
    ramp_id: int
    exits: int        # samples answered by this ramp
    saved_ms: float   # latency those exits saved, summed over the window
    added_ms: float   # latency the ramp added to samples that passed it, summed
    utility_ms: float


@dataclass(frozen=True)
class Candidate:
    """A Fig. 11 candidate site and its upper-bound projection."""

    site: int
    round: int                   # 1 = interval middles, 2 = later middles, ...
    upper_bound_rate: float
    projected_utility_ms: float
    eligible: bool               # fits the budget and is not excluded


@dataclass(frozen=True)
class AdjustInput:
    window: ExitWindow                # recorded under the deployed config (its active ramps)
    profile: LatencyProfile
    thresholds: tuple[float, ...]     # deployed, one per active ramp
    constraint: float = DEFAULT_CONSTRAINT
    budget: float = DEFAULT_BUDGET
    exclude: frozenset[int] = frozenset()  # sites the caller will not trial (e.g. just failed)
    climb: Climb | None = None        # tune's climb engine (None: the Python climb)


@dataclass(frozen=True)
class AdjustDecision:
    action: str
    active: tuple[int, ...]
    deactivated: tuple[int, ...]
    added: tuple[int, ...]
    reason: str
    thresholds: tuple[float, ...]            # one per ``active``; added ramps start at 0
    utilities: tuple[RampUtility, ...]       # of the deployed config on this window
    candidates: tuple[Candidate, ...] = ()


def _utilities(rp: Replay, th: np.ndarray) -> list[RampUtility]:
    r, n = rp.n_ramps, rp.n_samples
    if r == 0:
        return []
    passes = np.ones((r + 1, n), dtype=bool)  # row r: the model answers every sample
    np.less(rp.score, th[:, None], out=passes[:r])
    e = passes.argmax(axis=0)  # the answering ramp (r: the model)
    ex = np.flatnonzero(e < r)
    at = e[ex]
    # where each exiting sample would answer without its ramp: the next passing one after it
    passes[at, ex] = False
    nxt = passes.argmax(axis=0)[ex]
    saved_each = rp.exit_lat[nxt] - rp.cost[at] - rp.exit_lat[at]
    saved = np.bincount(at, weights=saved_each, minlength=r).tolist()
    counts = np.bincount(at, minlength=r)
    added = ((n - np.cumsum(counts)) * rp.cost).tolist()
    return [RampUtility(ramp_id=rid, exits=int(c), saved_ms=sv, added_ms=ad, utility_ms=sv - ad)
            for rid, c, sv, ad in zip(rp.window.ramp_ids, counts.tolist(), saved, added)]


def utilities(window: ExitWindow, profile: LatencyProfile,
              thresholds: Sequence[float]) -> list[RampUtility]:
    """Per active ramp: savings of its exits minus the overhead it adds to inputs passing it."""
    th = as_thresholds(thresholds, window.n_ramps, "thresholds")
    return _utilities(Replay(window, profile), th)


def interval_candidates(n_sites: int, latest_positive: int,
                        deactivated: Sequence[int]) -> list[list[int]]:
    """Fig. 11 candidate sites by round: round 1 holds the middle of every interval after
    ``latest_positive`` (-1: none) delimited by ``deactivated``; each later round the middle
    of what lies after the previous candidate of the same interval."""
    bounds = [latest_positive, *sorted(d for d in set(deactivated) if d > latest_positive), n_sites]
    spans = [(a + 1, b - 1) for a, b in pairwise(bounds) if a + 1 <= b - 1]
    rounds: list[list[int]] = []
    while spans:
        mids = [(lo + hi) // 2 for lo, hi in spans]
        rounds.append(mids)
        spans = [(m + 1, hi) for (_, hi), m in zip(spans, mids) if m + 1 <= hi]
    return rounds


def upper_bound_rate(site: int, deactivated_rates: Mapping[int, float]) -> float:
    """Exit-rate bound of a candidate: the following deactivated ramp's profiled rate plus
    every earlier deactivation's, whose inputs would now reach it (Fig. 11)."""
    following = min((d for d in deactivated_rates if d > site), default=None)
    return float(sum(rate for d, rate in deactivated_rates.items()
                     if d < site or d == following))


def _fits(profile: LatencyProfile, sites: Sequence[int], budget: float) -> bool:
    return profile.cost_of(sites) <= budget * profile.full_ms + _TOL


def _pick_trial(profile: LatencyProfile, kept: list[int], rates: Mapping[int, float],
                reached: int, n: int, budget: float, exclude: frozenset[int]
                ) -> tuple[list[Candidate], int | None]:
    latest = max(kept) if kept else -1
    seen: list[Candidate] = []
    for rnd, sites in enumerate(interval_candidates(profile.n_sites, latest, list(rates)), 1):
        best: Candidate | None = None
        for c in sites:
            ub = upper_bound_rate(c, rates)
            u = min(ub * n, reached)
            cost = float(profile.ramp_cost_ms[c])
            proj = u * (profile.full_ms - float(profile.prefix_ms[c]) - cost) - (reached - u) * cost
            ok = c not in exclude and _fits(profile, [*kept, c], budget)
            cand = Candidate(site=c, round=rnd, upper_bound_rate=ub, projected_utility_ms=proj,
                             eligible=ok)
            seen.append(cand)
            if ok and proj > 0 and (best is None or proj > best.projected_utility_ms):
                best = cand
        if best is not None:
            return seen, best.site
    return seen, None


def _kept_thresholds(rp: Replay, keep: Sequence[int], th: Mapping[int, float],
                     constraint: float, climb: Climb | None) -> tuple[float, ...]:
    """Thresholds for ``keep`` once the other ramps are gone: unchanged if they still meet the
    constraint on this window (samples the removed ramps answered now flow on), else re-tuned."""
    keep = sorted(keep)
    if not keep:
        return ()
    # a ramp at threshold 0 answers nothing, so zeroing the removed ones replays their removal
    masked = np.array([th[s] if s in keep else 0.0 for s in rp.window.ramp_ids])
    if meets(rp.evaluation(masked), constraint):
        return tuple(th[k] for k in keep)
    return tune(rp.window.select(keep), rp.profile, constraint, climb=climb).thresholds


def _decision(action: str, active: Sequence[int], thresholds: Mapping[int, float], reason: str,
              utils: list[RampUtility], deactivated: Sequence[int] = (), added: Sequence[int] = (),
              candidates: Sequence[Candidate] = ()) -> AdjustDecision:
    act = tuple(sorted(active))
    return AdjustDecision(action=action, active=act, deactivated=tuple(sorted(deactivated)),
                          added=tuple(sorted(added)), reason=reason,
                          thresholds=tuple(float(thresholds.get(s, 0.0)) for s in act),
                          utilities=tuple(utils), candidates=tuple(candidates))


def _check(state: AdjustInput) -> None:
    check_constraint(state.constraint)
    if not 0.0 <= state.budget:
        raise ValueError(f"budget must be >= 0, got {state.budget}")
    state.profile.check_sites(state.window.ramp_ids)
    bad = [s for s in state.exclude if not 0 <= s < state.profile.n_sites]
    if bad:
        raise ValueError(f"excluded sites {bad} outside the profile's {state.profile.n_sites}")


def adjust(state: AdjustInput) -> AdjustDecision:
    """One ramp-adjustment round (Algorithm 2)."""
    _check(state)
    w, prof, budget, cons = state.window, state.profile, state.budget, state.constraint
    active = list(w.ramp_ids)
    th_arr = as_thresholds(state.thresholds, w.n_ramps, "thresholds")
    th = dict(zip(active, th_arr.tolist()))
    rp = Replay(w, prof)
    utils = _utilities(rp, th_arr)
    by_id = {u.ramp_id: u for u in utils}

    if not active:
        for sites in interval_candidates(prof.n_sites, -1, []):
            for c in sites:
                if c not in state.exclude and _fits(prof, [c], budget):
                    return _decision("deactivate_and_trial", [c], {}, "no active ramps: trial "
                                     f"site {c}, the middle site within budget", utils, added=[c])
        return _decision("keep", [], {}, "no active ramps and no site fits the budget", utils)

    if not _fits(prof, active, budget):
        keep = sorted(active, key=lambda s: (by_id[s].utility_ms, -s), reverse=True)
        while keep and not _fits(prof, keep, budget):
            keep.pop()
        dropped = sorted(set(active) - set(keep))
        return _decision("deactivate_and_trial", keep, dict(zip(sorted(keep), _kept_thresholds(
            rp, keep, th, cons, state.climb))), f"over the {budget:.1%} ramp budget: dropped the "
            f"lowest-utility ramps {dropped}", utils, deactivated=dropped)

    if all(u.utility_ms >= 0 for u in utils):
        return _probe(state, rp, th, utils)

    cur = rp.evaluation(th_arr)
    cur_ok = meets(cur, cons)
    tuned = tune(w, prof, cons, start=th_arr, replay=rp, climb=state.climb)
    t_utils = _utilities(rp, np.asarray(tuned.thresholds))
    better = not cur_ok or tuned.evaluation.savings_ms >= cur.savings_ms - _TOL
    if better and all(u.utility_ms >= 0 for u in t_utils):
        return _decision("retune", active, dict(zip(active, tuned.thresholds)),
                         "re-tuned thresholds make every utility non-negative", utils)
    # reference for deactivation: the re-tuned config only if strictly better (less churn)
    if not cur_ok or tuned.evaluation.savings_ms > cur.savings_ms + _TOL:
        ref_th, ref_utils = dict(zip(active, tuned.thresholds)), t_utils
    else:
        ref_th, ref_utils = th, utils
    neg = [u.ramp_id for u in ref_utils if u.utility_ms < 0]
    kept = [s for s in active if s not in neg]
    n = w.n_samples
    rates = {u.ramp_id: u.exits / n for u in ref_utils if u.ramp_id in neg}
    reached = n - sum(u.exits for u in ref_utils if u.ramp_id in kept)
    cands, trial = _pick_trial(prof, kept, rates, reached, n, budget, state.exclude)
    new_th = dict(zip(sorted(kept), _kept_thresholds(rp, kept, ref_th, cons, state.climb)))
    added = [trial] if trial is not None else []
    reason = f"deactivated negative-utility ramps {sorted(neg)}; " + (
        f"trial site {trial} (best positive upper-bound utility)" if trial is not None
        else "no candidate has a positive upper-bound utility")
    return _decision("deactivate_and_trial", kept + added, new_th, reason, utils,
                     deactivated=neg, added=added, candidates=cands)


def _reach(utils: list[RampUtility], n: int, n_sites: int) -> np.ndarray:
    """Per candidate site, the window's samples that would reach it: all ``n`` but those an
    active ramp before it answers (an active site counts its own exits)."""
    answered = np.zeros(n_sites + 1, dtype=np.int64)
    for u in utils:
        answered[u.ramp_id + 1] += u.exits
    return n - np.cumsum(answered)[:n_sites]


def _probe(state: AdjustInput, rp: Replay, th: dict[int, float],
           utils: list[RampUtility]) -> AdjustDecision:
    """All utilities positive: probe earlier exits at low risk (§3.3, last paragraph)."""
    prof, budget, exclude = state.profile, state.budget, state.exclude
    active = list(rp.window.ramp_ids)
    best = max(utils, key=lambda u: (u.utility_ms, -u.ramp_id))
    worst = min(utils, key=lambda u: (u.utility_ms, -u.ramp_id))
    c = best.ramp_id - 1
    if c >= 0 and c not in active and c not in exclude and _fits(prof, [*active, c], budget):
        return _decision("add_earlier", [*active, c], th, f"all utilities positive: add site {c} "
                         f"before the best ramp {best.ramp_id}", utils, added=[c])
    s = worst.ramp_id
    if worst is not best:
        reach = _reach(utils, rp.n_samples, prof.n_sites)
        rest = [x for x in active if x != s]
        # ramps no sample reached (every one answered earlier) changed nothing on the window:
        # released, latest first, when the shifted set would not fit the budget otherwise
        idle = sorted((x for x in rest if reach[x] == 0), reverse=True)
        for to in range(s - 1, -1, -1):
            if to in active or to in exclude or reach[to] == 0:
                continue  # a site no sample would reach shows nothing
            kept = list(rest)
            spare = list(idle)
            while spare and not _fits(prof, [*kept, to], budget):
                kept.remove(spare.pop(0))
            if not _fits(prof, [*kept, to], budget):
                continue
            dropped = sorted(set(rest) - set(kept))
            new_th = dict(zip(sorted(kept), _kept_thresholds(rp, kept, th, state.constraint,
                                                                    state.climb)))
            why = f"all utilities positive, no room to add: shift the worst ramp {s} to site {to}"
            if dropped:
                why += f", releasing ramps no sample reached {dropped}"
            return _decision("shift_earlier", [*kept, to], new_th, why, utils,
                             deactivated=sorted([s, *dropped]), added=[to])
    return _decision("keep", active, th, "all utilities positive; no free earlier site within "
                     "budget", utils)

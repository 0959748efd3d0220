"""The best fixed exit config in hindsight: what any threshold policy could reach on a trace
with its heads as they are.

One active set and one threshold per ramp, chosen over the *whole* recorded stream (which no
online tuner sees) to minimise the median (or the mean) latency while agreeing with the final
model on at least ``1 - constraint`` of the samples. A live tuner sees only the past and
keeps headroom (it tunes to half the constraint): on a stream that does not drift it cannot
beat this figure with the same heads, so a target beyond it needs better heads, not better
tuning. On a drifting stream, re-tuning per window can beat any one fixed config: the replay
bench's *hindsight* policy is that counterpart.

Latency is model time as the replay counts it for one sample alone (no queueing): an exit at
active site s costs ``prefix_ms[s]`` plus the heads run so far, no exit the full model plus
every active head. Active sets hold up to ``max_active`` trained sites within the ramp budget;
thresholds come from coordinate passes over each ramp's score quantiles. Pure numpy.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from itertools import combinations
from typing import Any, Protocol

import numpy as np

OBJECTIVES = ("p50", "mean")
GRID = 48        # candidate thresholds per ramp: quantiles of its scores
PASSES = 3       # coordinate passes over the active ramps
MAX_ACTIVE = 3


class Trace(Protocol):
    """What this module reads of a replay trace (``services.sim.trace.Trace``)."""

    ramp_pred: np.ndarray     # R x N top-1 per site
    ramp_score: np.ndarray    # R x N exit score (lower = more confident)
    final_pred: np.ndarray    # N
    prefix_ms: np.ndarray     # R + 1: to each site, then the full model
    ramp_cost_ms: np.ndarray  # R
    meta: dict[str, Any]

    @property
    def n_sites(self) -> int: ...

    @property
    def n_samples(self) -> int: ...


@dataclass(frozen=True)
class Ceiling:
    objective: str
    constraint: float
    active: tuple[int, ...]
    thresholds: tuple[float, ...]
    full_ms: float        # the full model alone: what the changes below are against
    p50_ms: float
    mean_ms: float
    agreement: float
    exit_rate: float

    def as_dict(self) -> dict:
        d = asdict(self)
        d["p50_change"] = self.p50_ms / self.full_ms - 1
        d["mean_change"] = self.mean_ms / self.full_ms - 1
        return d


def fixed_latency(trace: Trace, active: tuple[int, ...], thresholds: tuple[float, ...]
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(latency ms, agrees with the final model, exited early) per sample under one config."""
    n = trace.n_samples
    lat = np.empty(n)
    agree = np.ones(n, bool)
    done = np.zeros(n, bool)
    paid = 0.0
    for s, t in zip(active, thresholds, strict=True):
        paid += float(trace.ramp_cost_ms[s])
        ex = (trace.ramp_score[s] < t) & ~done
        lat[ex] = trace.prefix_ms[s] + paid
        agree[ex] = trace.ramp_pred[s, ex] == trace.final_pred[ex]
        done |= ex
    lat[~done] = trace.prefix_ms[-1] + paid
    return lat, agree, done


def _key(lat: np.ndarray, objective: str) -> tuple[float, float]:
    med, mean = float(np.median(lat)), float(lat.mean())
    return (med, mean) if objective == "p50" else (mean, med)


def _tune(trace: Trace, active: tuple[int, ...], objective: str, allowed: int,
          grids: dict[int, np.ndarray]) -> tuple[tuple[float, float], tuple[float, ...]]:
    """Coordinate passes from all-zero thresholds (no exit: always feasible)."""
    th = [0.0] * len(active)
    best = _key(fixed_latency(trace, active, tuple(th))[0], objective)
    for _ in range(PASSES):
        moved = False
        for j, s in enumerate(active):
            for g in grids[s]:
                if g == th[j]:
                    continue
                cand = (*th[:j], float(g), *th[j + 1:])
                lat, agree, _ = fixed_latency(trace, active, cand)
                if int((~agree).sum()) > allowed:
                    continue
                key = _key(lat, objective)
                if key < best:
                    best, th, moved = key, list(cand), True
        if not moved:
            break
    return best, tuple(th)


def best_fixed(trace: Trace, constraint: float = 0.01, budget: float = 0.02,
               objective: str = "p50", max_active: int = MAX_ACTIVE) -> Ceiling:
    """The fixed config with the lowest ``objective`` latency at ``constraint`` (see module)."""
    if objective not in OBJECTIVES:
        raise ValueError(f"unknown objective {objective!r}; known: {', '.join(OBJECTIVES)}")
    if not 0 <= constraint < 1:
        raise ValueError(f"constraint must be in [0, 1), got {constraint}")
    if max_active < 1:
        raise ValueError(f"max_active must be >= 1, got {max_active}")
    full = float(trace.prefix_ms[-1])
    trained = trace.meta.get("trained") or [True] * trace.n_sites
    sites = [s for s in range(trace.n_sites) if trained[s]]
    allowed = int(np.floor(constraint * trace.n_samples + 1e-9))
    grids = {s: np.unique(np.concatenate(([0.0], np.quantile(trace.ramp_score[s],
                                                             np.linspace(0, 1, GRID))
                                          + 1e-9)))
             for s in sites}
    best_key, best = _key(np.full(trace.n_samples, full), objective), ((), ())
    for k in range(1, max_active + 1):
        for active in combinations(sites, k):
            if float(trace.ramp_cost_ms[list(active)].sum()) > budget * full:
                continue
            key, th = _tune(trace, active, objective, allowed, grids)
            if key < best_key:
                best_key, best = key, (active, th)
    lat, agree, done = fixed_latency(trace, *best)
    return Ceiling(objective, constraint, best[0], best[1], full, float(np.median(lat)),
                   float(lat.mean()), float(agree.mean()), float(done.mean()))

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
thresholds come from coordinate passes over each ramp's score quantiles, each pass scoring
a ramp's whole grid at once with the tuner's own replay (``tuner.thresholds.Replay``).

In-sample, the search overfits: with a few hundred samples it finds the thresholds that
happen to let the median sample out. ``held_out`` chooses on the first part of a stream and
judges on the rest: nearer what a tuner that learns from the past can hope for.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from itertools import combinations

import numpy as np

from services.exits.exit_window import ExitWindow
from services.exits.latency_profile import LatencyProfile
from services.tuner.thresholds import Replay, allowed_disagreements

OBJECTIVES = ("p50", "mean")
GRID = 48        # candidate thresholds per ramp: quantiles of its scores
PASSES = 3       # coordinate passes over the active ramps
MAX_ACTIVE = 3


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


def fixed_latency(rp: Replay, configs: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For C threshold vectors over ``rp``'s ramps: C x N latencies (ms), C x N agreement
    with the final model, C x N exited early."""
    e = rp.exit_index(configs)
    return rp.exit_lat[e], rp.agree[e, np.arange(rp.n_samples)], e < rp.n_ramps


def _keys(lat: np.ndarray, objective: str) -> np.ndarray:
    """C x 2 sort keys of C configs' latencies: (median, mean) or (mean, median)."""
    med, mean = np.median(lat, axis=1), lat.mean(axis=1)
    return np.stack([med, mean] if objective == "p50" else [mean, med], axis=1)


def _tune(rp: Replay, objective: str, allowed: int, grids: list[np.ndarray]
          ) -> tuple[tuple[float, float], tuple[float, ...]]:
    """Coordinate passes from all-zero thresholds (no exit: always feasible)."""
    th = np.zeros(rp.n_ramps)
    best = tuple(_keys(fixed_latency(rp, th[None])[0], objective)[0])
    for _ in range(PASSES):
        moved = False
        for j, grid in enumerate(grids):
            configs = np.repeat(th[None], len(grid), axis=0)
            configs[:, j] = grid
            lat, agree, _ = fixed_latency(rp, configs)
            keys = _keys(lat, objective)
            for c in np.flatnonzero((~agree).sum(axis=1) <= allowed):
                if tuple(keys[c]) < best:
                    best, th, moved = tuple(keys[c]), configs[c].copy(), True
        if not moved:
            break
    return best, tuple(float(t) for t in th)


def best_fixed(window: ExitWindow, profile: LatencyProfile, constraint: float = 0.01,
               budget: float = 0.02, objective: str = "p50", max_active: int = MAX_ACTIVE
               ) -> Ceiling:
    """The fixed config with the lowest ``objective`` latency at ``constraint`` (see module),
    over the sites of ``window`` (each sample seen by every candidate ramp)."""
    if objective not in OBJECTIVES:
        raise ValueError(f"unknown objective {objective!r}; known: {', '.join(OBJECTIVES)}")
    if not 0 <= constraint < 1:
        raise ValueError(f"constraint must be in [0, 1), got {constraint}")
    if max_active < 1:
        raise ValueError(f"max_active must be >= 1, got {max_active}")
    full, n = profile.full_ms, window.n_samples
    allowed = allowed_disagreements(n, constraint)
    grid = {s: np.unique(np.concatenate(([0.0], np.quantile(row, np.linspace(0, 1, GRID))
                                         + 1e-9)))
            for s, row in zip(window.ramp_ids, window.score, strict=True)}
    best_key, best = (full, full), ((), ())
    for k in range(1, max_active + 1):
        for active in combinations(window.ramp_ids, k):
            if profile.cost_of(active) > budget * full:
                continue
            rp = Replay(window.select(list(active)), profile)
            key, th = _tune(rp, objective, allowed, [grid[s] for s in active])
            if key < best_key:
                best_key, best = key, (active, th)
    return _served(window, profile, objective, constraint, *best)


def _served(window: ExitWindow, profile: LatencyProfile, objective: str, constraint: float,
            active: tuple[int, ...], thresholds: tuple[float, ...]) -> Ceiling:
    """One fixed config served on ``window``: its figures there."""
    rp = Replay(window.select(list(active)), profile)
    lat, agree, done = (a[0] for a in fixed_latency(rp, np.asarray([thresholds], float)))
    return Ceiling(objective, constraint, active, thresholds, profile.full_ms,
                   float(np.median(lat)), float(lat.mean()), float(agree.mean()),
                   float(done.mean()))


def judge_fixed(window: ExitWindow, profile: LatencyProfile, ceiling: Ceiling) -> Ceiling:
    """``ceiling``'s config (found on other samples) served on ``window``, as it fares there."""
    return _served(window, profile, ceiling.objective, ceiling.constraint, ceiling.active,
                   ceiling.thresholds)


def held_out(first: ExitWindow, rest: ExitWindow, profile: LatencyProfile,
             constraint: float = 0.01, budget: float = 0.02, objective: str = "p50") -> Ceiling:
    """The best fixed config on the samples of ``first``, judged on those of ``rest`` (the
    later part of the same stream; see module doc)."""
    return judge_fixed(rest, profile, best_fixed(first, profile, constraint, budget, objective))

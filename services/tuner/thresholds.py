"""Accuracy-aware threshold tuning (Apparate §3.2), pure and vectorised.

A threshold vector is replayed on a recorded window without new inference: each sample is
answered by the earliest active ramp whose score passes (``score < threshold``), else by the
final model; agreement is measured against the final model. Latency follows latency mode
(ramps run on the critical path until a sample exits):

- exit at active ramp k (site s_k): ``prefix_ms[s_k] + sum(ramp_cost_ms[s_0..s_k])``
- no exit: ``prefix_ms[-1] + sum(ramp_cost_ms of all active ramps)``

Savings are measured against the vanilla model (``prefix_ms[-1]``), so a config that
exits nothing has negative savings (the ramps' overhead).

Choices where §3.2 is vague (documented here once):

- initial step 0.08 (``DEFAULT_INITIAL_STEP``; §3.2's text gives 0.1, Algorithm 1 starts
  at the floor);
- thresholds are capped at ``max_threshold`` = 1.0 (every score kind in ``scores.py`` is in
  [0, 1]); a ramp at the cap has no further move;
- move ranking: feasible moves with a latency gain and no agreement loss rank first
  ("infinite ratio"; ties: larger gain), then gain / loss; moves with neither gain nor loss
  ("neutral": the threshold crosses no recorded score) are taken only when nothing better
  exists, so flat stretches of the score axis are crossed with doubling steps instead of
  ending the search early; ties go to the earlier ramp (it saves more per exit);
- a feasible move that loses agreement without any latency gain is treated like a
  violation (its step halves): it cannot help and must not stall the search;
- every ramp whose step violated the constraint in a round halves its step (floor 0.01),
  even in rounds where another ramp's move is taken; the chosen ramp doubles its step
  (capped at ``max_threshold``);
- a move that costs agreement is deferred (the round only halves steps) while a ramp whose
  step violated can still halve: the ratio rule should compare it with that ramp's finer
  step, which may buy the same loss for far more latency. Without this, a coarse step that
  overshoots lets another ramp spend the whole accuracy budget first (on our synthetic
  windows this cut the mean gap to a 0.01-step grid from 1.2% to 0.5%);
- the search stops in a round without any feasible move once every movable ramp's step is
  already at the floor (Algorithm 1, lines 8-9);
- ``start`` (a quick re-tune from the deployed thresholds) falls back to all-zero
  thresholds when it violates the constraint on this window: raising thresholds can never
  repair that in general, and all-zero always satisfies it (agreement 1).
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import islice, product
from typing import Protocol

import numpy as np

from services.common.stats import wilson_interval
from services.exits.exit_window import ExitWindow
from services.exits.latency_profile import LatencyProfile

DEFAULT_CONSTRAINT = 0.01  # at most 1% disagreement with the final model
DEFAULT_INITIAL_STEP = 0.08
DEFAULT_FLOOR = 0.01
DEFAULT_MAX_THRESHOLD = 1.0
DEFAULT_GRID = tuple(round(0.05 * i, 2) for i in range(21))
_DIGITS = 10  # thresholds are rounded so repeated +step does not drift (0.1 + 0.2 ...)


@dataclass(frozen=True)
class Evaluation:
    agreement: float               # fraction of samples answered like the final model
    mean_latency_ms: float
    exit_rates: tuple[float, ...]  # per active ramp: fraction of all samples exiting there
    savings_ms: float              # vanilla latency - mean latency (per sample)
    disagreements: int
    samples: int


@dataclass(frozen=True)
class Move:
    """One accepted hill-climbing step."""

    round: int
    ramp_id: int
    threshold: float  # the ramp's new threshold
    step: float       # the step that was added
    gain_ms: float    # mean-latency decrease it brought
    loss: float       # agreement it cost (negative: agreement improved)


@dataclass(frozen=True)
class TuneResult:
    thresholds: tuple[float, ...]
    evaluation: Evaluation
    rounds: int
    moves: tuple[Move, ...]
    steps: tuple[float, ...]  # per-ramp step sizes when the search stopped
    start: tuple[float, ...]  # where the climb actually started


@dataclass(frozen=True)
class GridResult:
    thresholds: tuple[float, ...]
    evaluation: Evaluation
    evaluated: int


def allowed_disagreements(samples: int, constraint: float) -> int:
    """Most disagreements a window may hold; integer so 0.99 never fails on a float ulp."""
    return math.floor(constraint * samples + 1e-9)


def interval_alert_limit(samples: int, constraint: float) -> int:
    """Most disagreements a window of ``samples`` may hold while the upper bound of its
    agreement's 95 % Wilson interval stays at or above ``1 - constraint``: one more and the
    window is below the constraint with confidence (compute mode's alert, where the
    feedback is a sample). At 16 samples and 1 % this is 0, Apparate's own rule."""
    return _interval_limit(samples, constraint, bound=1)


def interval_tune_limit(samples: int, constraint: float) -> int:
    """Most disagreements a window of ``samples`` may hold while the lower bound of its
    agreement's 95 % Wilson interval stays at or above ``1 - constraint``: a config tuned to
    this many is within the constraint with confidence, not just on the sample (0: none)."""
    return _interval_limit(samples, constraint, bound=0)


def _interval_limit(samples: int, constraint: float, bound: int) -> int:
    """Most disagreements whose Wilson interval's ``bound`` (0 lower, 1 upper) stays at or
    above ``1 - constraint``."""
    limit = 0
    while limit < samples:
        if wilson_interval(samples - limit - 1, samples)[bound] < 1.0 - constraint - 1e-12:
            break
        limit += 1
    return limit


def meets(evaluation: Evaluation, constraint: float) -> bool:
    return evaluation.disagreements <= allowed_disagreements(evaluation.samples, constraint)


class Replay:
    """Precomputed per-window state so many threshold vectors replay in one numpy pass."""

    def __init__(self, window: ExitWindow, profile: LatencyProfile) -> None:
        profile.check_sites(window.ramp_ids)
        r, n = window.n_ramps, window.n_samples
        sites = list(window.ramp_ids)
        self.window, self.profile = window, profile
        self.n_ramps, self.n_samples = r, n
        self.cost = profile.ramp_cost_ms[sites]
        cum = np.cumsum(self.cost)
        # exit_lat[k]: latency of a sample answered at active ramp k; exit_lat[R]: by the model
        self.exit_lat = np.empty(r + 1)
        self.exit_lat[:r] = profile.prefix_ms[sites] + cum
        self.exit_lat[r] = profile.full_ms + (cum[-1] if r else 0.0)
        self.agree = np.ones((r + 1, n), dtype=bool)
        self.agree[:r] = window.pred == window.final
        self.score = window.score
        self._cols = np.arange(n)

    def exit_index(self, configs: np.ndarray) -> np.ndarray:
        """C x N index of the answering ramp (R = the final model) for C threshold vectors."""
        configs = np.asarray(configs, dtype=np.float64)
        buf = np.ones((configs.shape[0], self.n_ramps + 1, self.n_samples), dtype=bool)
        np.less(self.score, configs[:, :, None], out=buf[:, : self.n_ramps])
        return buf.argmax(axis=1)  # first True; the all-True last row catches non-exits

    def totals(self, configs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(latency sum over samples, disagreement count) for each of C threshold vectors."""
        e = self.exit_index(configs)
        return self.exit_lat[e].sum(axis=1), self.n_samples - self.agree[e, self._cols].sum(axis=1)

    def evaluation(self, thresholds: Sequence[float]) -> Evaluation:
        e = self.exit_index(np.asarray(thresholds, dtype=np.float64)[None])[0]
        n = self.n_samples
        counts = np.bincount(e, minlength=self.n_ramps + 1)
        dis = int(n - self.agree[e, self._cols].sum())
        mean = float(self.exit_lat[e].mean())
        return Evaluation(agreement=1.0 - dis / n, mean_latency_ms=mean,
                          exit_rates=tuple(float(c) / n for c in counts[: self.n_ramps]),
                          savings_ms=self.profile.full_ms - mean, disagreements=dis, samples=n)


def as_thresholds(values: Sequence[float] | None, r: int, what: str) -> np.ndarray:
    if values is None:
        return np.zeros(r)
    th = np.asarray(values, dtype=np.float64)
    if th.shape != (r,):
        raise ValueError(f"{what} needs one threshold per active ramp ({r}), got shape {th.shape}")
    if not np.all(np.isfinite(th)) or np.any(th < 0):
        raise ValueError(f"{what} must be finite and >= 0")
    return th


def check_constraint(constraint: float) -> None:
    if not 0.0 <= constraint < 1.0:
        raise ValueError(f"constraint is the tolerated agreement loss, in [0, 1); got {constraint}")


def evaluate(window: ExitWindow, profile: LatencyProfile,
             thresholds: Sequence[float]) -> Evaluation:
    """Replay one threshold vector on the window (no inference)."""
    return Replay(window, profile).evaluation(as_thresholds(thresholds, window.n_ramps, "thresholds"))


class _Bits:
    """Bitset replay for the hill climb: a sample set is a Python int (bit n = sample n), so
    one threshold vector costs a few int ops per ramp instead of numpy calls over samples.
    A threshold enters only through its rank among the ramp's sorted scores."""

    def __init__(self, rp: Replay) -> None:
        self.r, self.n = rp.n_ramps, rp.n_samples
        order = np.argsort(rp.score, axis=1, kind="stable")
        self.sorted = np.sort(rp.score, axis=1).tolist()  # the same values as in ``order``
        # pos[k, s]: sample s's place in ramp k's score order; the j lowest-scoring samples
        # are pos[k] < j. Their sets are built on first use: a climb asks for a few dozen of
        # the R x (N + 1), and building all of them was most of a short climb's time.
        self.pos = np.empty_like(order)
        self.pos[np.arange(self.r)[:, None], order] = np.arange(self.n)
        self._sets: list[dict[int, int]] = [{} for _ in range(self.r)]
        wrong = np.packbits(~rp.agree[: self.r], axis=1, bitorder="little")
        self.wrong = [int.from_bytes(row.tobytes(), "little") for row in wrong]
        self.lat = rp.exit_lat.tolist()

    def prefix(self, k: int, j: int) -> int:
        """The set (bitset) of the j lowest-scoring samples at ramp k."""
        got = self._sets[k].get(j)
        if got is None:
            got = int.from_bytes(np.packbits(self.pos[k] < j, bitorder="little").tobytes(),
                                 "little")
            self._sets[k][j] = got
        return got

    def rank(self, k: int, threshold: float) -> int:
        return bisect_left(self.sorted[k], threshold)  # number of scores < threshold

    def run(self, ranks: list[int], k0: int, state: tuple[int, float, int],
            trace: list[tuple[int, float, int]], limit: float = math.inf) -> tuple[float, int]:
        """Latency sum and disagreements, resuming at ramp k0 from ``state`` = (exited set,
        latency, disagreements) before it; appends the state before each ramp to ``trace``.
        Stops early (latency inf, ``trace`` cut short) once disagreements exceed ``limit``:
        they only grow, and a violating vector is never taken."""
        covered, lat, dis = state
        prefix, wrong, cost, add = self.prefix, self.wrong, self.lat, trace.append
        for k in range(k0, self.r):
            add((covered, lat, dis))
            x = prefix(k, ranks[k]) & ~covered
            if x:
                lat += x.bit_count() * cost[k]
                dis += (x & wrong[k]).bit_count()
                if dis > limit:
                    return math.inf, dis
                covered |= x
        return lat + (self.n - covered.bit_count()) * cost[self.r], dis

    def evaluation(self, ranks: list[int], full_ms: float) -> Evaluation:
        covered, lat, dis, rates = 0, 0.0, 0, []
        for k in range(self.r):
            x = self.prefix(k, ranks[k]) & ~covered
            c = x.bit_count()
            lat += c * self.lat[k]
            dis += (x & self.wrong[k]).bit_count()
            covered |= x
            rates.append(c / self.n)
        mean = (lat + (self.n - covered.bit_count()) * self.lat[self.r]) / self.n
        return Evaluation(agreement=1.0 - dis / self.n, mean_latency_ms=mean,
                          exit_rates=tuple(rates), savings_ms=full_ms - mean,
                          disagreements=dis, samples=self.n)


class Climb(Protocol):
    """A climb engine: from start thresholds ``th`` (capped) to the tuned result on ``rp``."""

    def __call__(self, rp: Replay, th: list[float], allowed: int, floor: float,
                 initial_step: float, max_threshold: float, max_rounds: int) -> TuneResult: ...


def tune(window: ExitWindow, profile: LatencyProfile, constraint: float = DEFAULT_CONSTRAINT,
         start: Sequence[float] | None = None, floor: float = DEFAULT_FLOOR,
         initial_step: float = DEFAULT_INITIAL_STEP,
         max_threshold: float = DEFAULT_MAX_THRESHOLD, max_rounds: int = 10_000,
         replay: Replay | None = None, climb: Climb | None = None) -> TuneResult:
    """Greedy hill climb (§3.2, Algorithm 1) for the thresholds with the largest latency savings
    whose agreement with the final model stays >= 1 - constraint on this window
    (``replay``: the caller's ``Replay`` of this window and profile, to reuse). ``climb``: the
    engine that runs the climb, e.g. ``climb_native.compiled_climb`` (the same decisions,
    faster); None = the reference climb in Python."""
    check_constraint(constraint)
    if not 0 < floor <= initial_step:
        raise ValueError(f"need 0 < floor <= initial_step, got floor={floor}, step={initial_step}")
    if max_threshold <= 0:
        raise ValueError("max_threshold must be positive")
    rp = replay if replay is not None else Replay(window, profile)
    r, n = rp.n_ramps, rp.n_samples
    allowed = allowed_disagreements(n, constraint)
    th = [min(float(t), max_threshold) for t in as_thresholds(start, r, "start")]
    run = climb if climb is not None else _climb_python
    return run(rp, th, allowed, floor, initial_step, max_threshold, max_rounds)


def _climb_python(rp: Replay, th: list[float], allowed: int, floor: float,
                  initial_step: float, max_threshold: float, max_rounds: int) -> TuneResult:
    bits = _Bits(rp)
    r, n = rp.n_ramps, rp.n_samples
    window, profile = rp.window, rp.profile
    ranks = [bits.rank(k, t) for k, t in enumerate(th)]
    zero = (0, 0.0, 0)
    trace: list[tuple[int, float, int]] = []  # state before each ramp under ``ranks``
    lat, dis = bits.run(ranks, 0, zero, trace)
    if dis > allowed:  # deployed thresholds already violate: climb from scratch
        th, ranks, trace = [0.0] * r, [0] * r, []
        lat, dis = bits.run(ranks, 0, zero, trace)
    started = tuple(th)
    steps = [float(initial_step)] * r
    eps = 1e-9 * (abs(lat) + 1.0)  # float noise in latency sums, not a real gain
    moves: list[Move] = []
    rounds = 0
    cands: list[tuple[float, int] | None] = [None] * r  # (threshold, rank) of each ramp's move
    while rounds < max_rounds:
        movable = [i for i in range(r) if th[i] < max_threshold]
        if not movable:
            break
        rounds += 1
        best, best_key, best_out = -1, None, None
        over: list[int] = []       # steps to halve
        violated: list[int] = []   # of which: broke the constraint
        for i in movable:
            if cands[i] is None:  # only moved or re-stepped ramps need a new candidate
                c = round(min(th[i] + steps[i], max_threshold), _DIGITS)
                cands[i] = (c, bits.rank(i, c))
            cand, rank = cands[i]
            tail: list[tuple[int, float, int]] | None = None
            if rank == ranks[i]:
                new_lat, new_dis = lat, dis  # crosses no recorded score
            else:
                trial = ranks.copy()
                trial[i] = rank
                tail = []
                new_lat, new_dis = bits.run(trial, i, trace[i], tail, allowed)
            if new_dis > allowed:
                over.append(i)
                violated.append(i)
                continue
            g, loss = lat - new_lat, new_dis - dis
            if g > eps:
                key = (2, g, -loss, -i) if loss <= 0 else (1, g / loss, g, -i)
            elif loss <= 0:
                key = (0, -loss, 0.0, -i)
            else:
                over.append(i)  # costs agreement for nothing: shrink like a violation
                continue
            if best_key is None or key > best_key:
                best, best_key, best_out = i, key, (new_lat, new_dis, cand, rank, tail)
        if best < 0 and all(steps[i] <= floor + 1e-12 for i in movable):
            break  # no move stays within the constraint, even at the finest step
        if best_key is not None and best_key[0] == 1 and any(
                steps[i] > floor + 1e-12 for i in violated):
            best_out = None  # defer spending agreement until violators tried a finer step
        for i in over:
            if steps[i] > floor:
                steps[i] = max(steps[i] / 2.0, floor)
                cands[i] = None
        if best_out is None:
            continue
        new_lat, new_dis, cand, rank, tail = best_out
        moves.append(Move(round=rounds, ramp_id=window.ramp_ids[best], threshold=cand,
                          step=steps[best], gain_ms=(lat - new_lat) / n, loss=(new_dis - dis) / n))
        th[best], ranks[best] = cand, rank
        if tail is not None:
            trace = trace[:best] + tail
        steps[best] = min(steps[best] * 2.0, max_threshold)
        cands[best] = None
        lat, dis = new_lat, new_dis
    return TuneResult(thresholds=tuple(th), evaluation=bits.evaluation(ranks, profile.full_ms),
                      rounds=rounds, moves=tuple(moves), steps=tuple(steps), start=started)


def grid_search(window: ExitWindow, profile: LatencyProfile,
                constraint: float = DEFAULT_CONSTRAINT, grid: Sequence[float] = DEFAULT_GRID,
                chunk: int = 4096) -> GridResult:
    """Exhaustive baseline over grid^R (R <= 4): the best-savings feasible vector; ties go to
    the lexicographically smallest vector. Used to measure how far ``tune`` lands from it."""
    check_constraint(constraint)
    r = window.n_ramps
    if r > 4:
        raise ValueError(f"grid search is exponential in the ramps; R <= 4 supported, got {r}")
    values = np.unique(np.asarray(grid, dtype=np.float64))
    if values.size == 0 or not np.all(np.isfinite(values)) or values[0] < 0:
        raise ValueError("grid must hold finite thresholds >= 0")
    rp = Replay(window, profile)
    if r == 0:
        return GridResult(thresholds=(), evaluation=rp.evaluation(np.zeros(0)), evaluated=1)
    allowed = allowed_disagreements(rp.n_samples, constraint)
    best_lat, best_cfg, evaluated = math.inf, np.zeros(r), 0
    combos = product(range(values.size), repeat=r)
    while True:
        idx = np.array(list(islice(combos, chunk)), dtype=np.int64).reshape(-1, r)
        if idx.shape[0] == 0:
            break
        configs = values[idx]
        lats, diss = rp.totals(configs)
        evaluated += configs.shape[0]
        lats = np.where(diss <= allowed, lats, math.inf)
        i = int(np.argmin(lats))
        if lats[i] < best_lat:
            best_lat, best_cfg = float(lats[i]), configs[i]
    return GridResult(thresholds=tuple(float(t) for t in best_cfg),
                      evaluation=rp.evaluation(best_cfg), evaluated=evaluated)


def grid_gap(tuned_savings_ms: float, grid_savings_ms: float) -> float:
    """1 - tuned / grid savings (negative when tuning beats the coarse grid); 0 if the grid
    finds no positive savings to compare against."""
    return 1.0 - tuned_savings_ms / grid_savings_ms if grid_savings_ms > 0 else 0.0

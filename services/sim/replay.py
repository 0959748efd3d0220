"""Discrete-event replay of a trace through the exit policies (Apparate latency mode).

One worker serves requests FIFO at batch size 1: the paper's CV regime ("at 30 fps ... they
are able to consistently schedule jobs with batch size 1"), and the one where a trace's
batch-1 latency profile is exact. In latency mode every sample runs the whole model plus
the ramps of the config it started under, so the worker is busy for ``full + sum(active ramp
costs)``; its reply leaves at its exit point: ``prefix[site] + costs of the active ramps up to
and including its exit ramp``, or at the end. Latency = reply time - arrival (with queueing).
As in the live worker, the rest of a run whose sample already answered gives way to a sample
that arrives and is redone when the worker is idle (``feedback_backlog``, see ``event_loop``;
0 replays runs that always go to the end).

Policies, all on the same trace and arrivals:

- ``vanilla``: no ramps.
- ``static``: every ramp active, ONE threshold shared by all of them, tuned once on the first
  ``static_frac`` of the stream (the largest that meets the constraint there), like
  BranchyNet / DeeBERT's one-time tuning (Apparate §4.4).
- ``offramp``: ``services.tuner.controller.ExitController``, fed only the active ramps'
  top-1 and score of each sample when its feedback is complete; a new config applies from the next
  sample the worker starts at or after ``decision + delay`` (``DECISION_DELAY_S``, the live
  round trip, unless told otherwise).
- ``hindsight``: offramp's initial ramps with thresholds tuned on each block of samples with
  that very block (perfect foresight): the most threshold tuning can get out of these ramps,
  for telling a controller shortfall from a ramp shortfall (not a system anyone can run).
- ``oracle``: each input exits at the earliest site whose top-1 equals the final one, with no
  ramp cost (Apparate §2.2's optimal exiting).

Controller wall time is measured here around each ``step`` (never inside the policy).
A replay is deterministic, so ``timing_passes`` > 1 replays offramp again with fresh
controllers, checks that every pass made the same decisions, and keeps each call's fastest
pass (timeit's rule: on a shared machine the noise only ever adds time).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from services.exits.exit_guard import ALERT_BACKOFF, ExitGuard
from services.exits.initial import initial_active
from services.sim.refit_replay import REFIT, RefitPlan, ReplayRefits
from services.sim.trace import Trace
from services.tuner.controller import DEFAULT_TUNE_WINDOW, ExitController, TunerDecision
from services.tuner.ramp_adjust import DEFAULT_BUDGET
from services.tuner.thresholds import (
    DEFAULT_CONSTRAINT,
    Climb,
    Replay,
    allowed_disagreements,
    grid_gap,
    grid_search,
    tune,
)
from services.worker.feedback_backlog import DEFAULT_CAP as FEEDBACK_BACKLOG
from services.workloads.arrivals import stream_arrivals

POLICIES = ("vanilla", "static", "offramp", REFIT, "hindsight", "oracle")  # REFIT: traces with features
TIMING_PASSES = 3  # offramp replays per run whose per-call minimum is the reported wall time
MODE = "replay simulation"
# How late a decided config reaches the worker live: feedback coalesced for up to 50 ms,
# JetStream, the decision, the store write and the config message. A live demo's worker log
# put it at 56-177 ms (median 83 ms) after the run whose answer set it off.
DECISION_DELAY_S = 0.1
# New heads come later: the refit round fits each ramp in turn, and the worker builds the
# sessions of the new heads before it applies their config. The same kind of log put the
# first refit of a round 124-506 ms (median 395 ms) before its config was applied.
HEAD_DELAY_S = 0.4


@dataclass
class PolicyResult:
    name: str
    latency_ms: np.ndarray   # per sample, reply - arrival
    answer: np.ndarray       # per sample, the label the client got
    exit_site: np.ndarray    # per sample, candidate site it exited at (-1: the full model)
    agreement: float
    worst_window_agreement: float
    extra: dict[str, Any] = field(default_factory=dict)

    def summary(self) -> dict[str, float]:
        p25, p50, p95 = np.percentile(self.latency_ms, [25, 50, 95])
        return {"p25_ms": float(p25), "p50_ms": float(p50), "p95_ms": float(p95),
                "mean_ms": float(self.latency_ms.mean()), "agreement": self.agreement,
                "worst_window_agreement": self.worst_window_agreement,
                "exit_rate": float((self.exit_site >= 0).mean())}


def window_agreements(agree: np.ndarray, window: int = 16) -> np.ndarray:
    """Agreement of consecutive full windows (the whole stream if shorter than one)."""
    k = agree.size // window
    if k == 0:
        return np.array([agree.mean()]) if agree.size else np.ones(1)
    return agree[: k * window].reshape(k, window).mean(axis=1)


def arrivals_for(trace: Trace, spec: str | np.ndarray | None = None, seed: int = 0) -> np.ndarray:
    """The trace's own arrival times, or ``spec`` (array or e.g. "poisson:10")."""
    if spec is None:
        if trace.arrival_s is None:
            raise ValueError("the trace has no arrival_s: give an arrival spec, e.g. poisson:10")
        return trace.arrival_s
    if isinstance(spec, str):
        return stream_arrivals(spec, trace.n_samples, seed)
    a = np.asarray(spec, np.float64)
    if a.shape != (trace.n_samples,) or np.any(np.diff(a) < 0):
        raise ValueError(f"arrivals must be {trace.n_samples} sorted times")
    return a


# (reply ms after start, worker busy ms, answer, exit site) of sample i
Serve = Callable[[int], tuple[float, float, int, int]]


class _Worker:
    """The simulated worker's feedback side: the tail of the run in hand (only feedback left)
    and the runs set aside, oldest first."""

    def __init__(self, busy_s: np.ndarray, backlog: int,
                 done: Callable[[int, float], list[tuple[float, Callable[[], None]]]] | None):
        self.busy_s, self.backlog, self.done = busy_s, backlog, done
        self.free = 0.0                              # when the answer-critical work in hand ends
        self.tail: tuple[int, float] | None = None   # (sample, its run's end): feedback left
        self.aside: deque[int] = deque()             # samples whose run was stopped
        self.pending: list[tuple[float, Callable[[], None]]] = []  # sorted by effective time

    def finish(self, i: int, t: float) -> None:
        if self.done is not None:
            self.pending.extend(self.done(i, t))
            self.pending.sort(key=lambda p: p[0])

    def feedback_until(self, t: float) -> float:
        """Feedback work from ``free`` on, until a sample is due at ``t``; returns when the
        worker can start it."""
        now = self.free
        if self.tail is not None:
            j, end = self.tail
            self.tail = None
            if end <= t or len(self.aside) >= self.backlog:
                self.finish(j, end)
                now = end
            else:
                self.aside.append(j)
                return t
        while self.aside and now + self.busy_s[self.aside[0]] <= t:
            j = self.aside.popleft()
            now += self.busy_s[j]
            self.finish(j, now)
        return max(now, t)

    def apply_due(self, start: float) -> None:
        while self.pending and self.pending[0][0] <= start:
            self.pending.pop(0)[1]()


def event_loop(trace: Trace, arrivals: np.ndarray, serve: Serve,
               done: Callable[[int, float], list[tuple[float, Callable[[], None]]]] | None,
               backlog: int = FEEDBACK_BACKLOG) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One worker, FIFO, latency mode: sample i's run lasts ``busy`` ms and its reply leaves
    at ``reply`` ms. The rest of a run whose sample answered early only computes feedback
    and gives way like the live worker's (``services/worker/feedback_backlog.py``): if the
    next sample arrives before that run ends, the run stops there and is set aside (while
    fewer than ``backlog`` wait; else it runs to its end first); set-aside runs are redone
    from the start, oldest first, while the worker is idle, and a redo stops (its progress
    lost) when a sample arrives. ``backlog`` 0: every run goes to the end.

    ``done(i, t)`` runs when sample i's feedback is complete at time t (so feedback can
    arrive out of order, as live) and returns (effective time, apply) pairs; each applies
    before the first sample starting at/after it."""
    n = trace.n_samples
    lat, ans, site = np.empty(n), np.empty(n, np.int64), np.empty(n, np.int64)
    w = _Worker(np.empty(n), backlog, done)
    for i in range(n):
        start = w.feedback_until(max(float(arrivals[i]), w.free))
        w.apply_due(start)
        reply_ms, busy_ms, ans[i], site[i] = serve(i)
        w.busy_s[i] = busy_ms / 1e3
        lat[i] = (start - arrivals[i]) * 1e3 + reply_ms
        if backlog > 0 and reply_ms < busy_ms:
            w.free = start + reply_ms / 1e3
            w.tail = (i, start + w.busy_s[i])
        else:
            w.free = start + w.busy_s[i]
            w.finish(i, w.free)
    w.feedback_until(math.inf)  # the stream is over: every feedback completes
    return lat, ans, site


def _result(name: str, trace: Trace, lat: np.ndarray, ans: np.ndarray, site: np.ndarray,
            window: int, **extra: Any) -> PolicyResult:
    agree = ans == trace.final_pred
    return PolicyResult(name, lat, ans, site, float(agree.mean()),
                        float(window_agreements(agree, window).min()), extra)


def threshold_server(trace: Trace,
                      get: Callable[[int], tuple[tuple[int, ...], tuple[float, ...]]]) -> Serve:
    """Serve sample i under the config ``get(i)`` (active ramps, their thresholds)."""
    prefix, cost, full = trace.prefix_ms, trace.ramp_cost_ms, float(trace.prefix_ms[-1])

    def serve(i: int) -> tuple[float, float, int, int]:
        active, th = get(i)
        paid = 0.0
        busy = full + sum(cost[s] for s in active)
        for s, t in zip(active, th):
            paid += cost[s]
            if trace.ramp_score[s, i] < t:
                return float(prefix[s] + paid), busy, int(trace.ramp_pred[s, i]), s
        return busy, busy, int(trace.final_pred[i]), -1

    return serve


def run_vanilla(trace: Trace, arrivals: np.ndarray, window: int = 16,
                backlog: int = FEEDBACK_BACKLOG) -> PolicyResult:
    lat, ans, site = event_loop(trace, arrivals, threshold_server(trace, lambda i: ((), ())),
                                 None, backlog)
    return _result("vanilla", trace, lat, ans, site, window)


def run_oracle(trace: Trace, arrivals: np.ndarray, window: int = 16,
               backlog: int = FEEDBACK_BACKLOG) -> PolicyResult:
    right = trace.ramp_pred == trace.final_pred
    first = np.where(right.any(axis=0), right.argmax(axis=0), -1)
    full = float(trace.prefix_ms[-1])

    def serve(i: int) -> tuple[float, float, int, int]:
        s = int(first[i])
        return (float(trace.prefix_ms[s]) if s >= 0 else full), full, int(trace.final_pred[i]), s

    lat, ans, site = event_loop(trace, arrivals, serve, None, backlog)
    return _result("oracle", trace, lat, ans, site, window)


def static_threshold(trace: Trace, constraint: float = DEFAULT_CONSTRAINT,
                     frac: float = 0.1) -> float:
    """The largest threshold shared by every ramp that meets the constraint on the first
    ``frac`` of the stream (candidates: 0 and just above every recorded score)."""
    m = max(1, round(frac * trace.n_samples))
    ids = tuple(range(trace.n_sites))
    rp = Replay(trace.window(ids, 0, m), trace.profile())
    scores = np.unique(trace.ramp_score[:, :m])
    cands = np.concatenate([[0.0], np.nextafter(scores, np.inf)])
    allowed = allowed_disagreements(m, constraint)
    ok = np.zeros(cands.size, bool)
    for s in range(0, cands.size, 512):
        c = cands[s: s + 512]
        _, dis = rp.totals(np.repeat(c[:, None], len(ids), axis=1))
        ok[s: s + 512] = dis <= allowed
    return float(cands[np.flatnonzero(ok)].max())


def run_static(trace: Trace, arrivals: np.ndarray, constraint: float = DEFAULT_CONSTRAINT,
               frac: float = 0.1, window: int = 16,
               backlog: int = FEEDBACK_BACKLOG) -> PolicyResult:
    t = static_threshold(trace, constraint, frac)
    cfg = (tuple(range(trace.n_sites)), (t,) * trace.n_sites)
    lat, ans, site = event_loop(trace, arrivals, threshold_server(trace, lambda i: cfg), None,
                                 backlog)
    return _result("static", trace, lat, ans, site, window, threshold=t, tuned_on_frac=frac)


def initial_sites(trace: Trace, budget: float) -> list[int]:
    """A fresh deployment's active sites: evenly spaced within the budget, among the ramps
    the model was prepared with trained heads (``--no-bootstrap`` ramps are not)."""
    trained = trace.meta.get("trained") or [True] * trace.n_sites
    return initial_active({s: float(c) for s, c in enumerate(trace.ramp_cost_ms) if trained[s]},
                          trace.profile().full_ms, budget)


def make_controller(trace: Trace, constraint: float = DEFAULT_CONSTRAINT,
                    budget: float = DEFAULT_BUDGET, **kwargs: Any) -> ExitController:
    """A controller as a fresh deployment starts: evenly spaced ramps within the budget, all
    thresholds 0 (Apparate §3.1)."""
    prof = trace.profile()
    active = initial_sites(trace, budget)
    return ExitController(prof, active, None, constraint=constraint, budget=budget,
                          score=str(trace.meta.get("score", "max_softmax")), **kwargs)


def _decided(d: TunerDecision, i: int, t: float) -> dict[str, Any]:
    return {"sample": i, "t_s": t, "kind": d.kind, "trigger": d.trigger, "action": d.action,
            "version": d.version, "changed": d.changed, "active": list(d.active),
            "thresholds": list(d.thresholds), "est_savings_ms": d.est_savings_ms}


class _Deployed:
    """The config the simulated worker serves: the controller's latest applied one, capped
    by the worker's exit guard (``services/exits/exit_guard.py``) when it has one."""

    def __init__(self, view: Trace, active: tuple[int, ...], thresholds: tuple[float, ...],
                 guard: ExitGuard | None) -> None:
        self.view, self.guard = view, guard
        self.cfg, self.version = (active, thresholds), 0
        # sample -> (config version, active ramps, answer, exit site), until its feedback
        self.ran: dict[int, tuple[int, tuple[int, ...], int, int]] = {}

    def get(self, i: int) -> tuple[tuple[int, ...], tuple[float, ...]]:
        active, th = self.cfg
        if self.guard is None or not self.guard.caps:
            return self.cfg
        capped = self.guard.thresholds(dict(zip(active, th)))
        return active, tuple(capped[r] for r in active)

    def apply(self, cfg: tuple[tuple[int, ...], tuple[float, ...]]) -> None:
        self.cfg, self.version = cfg, self.version + 1
        if self.guard is not None:
            self.guard.clear()

    def served(self, i: int, got: tuple[float, float, int, int]
               ) -> tuple[float, float, int, int]:
        """Sample ``i`` was served ``got`` (reply, busy, answer, site); returns it."""
        self.ran[i] = (self.version, self.cfg[0], got[2], got[3])
        return got

    def caps_set(self) -> int:
        """Caps the exit guard set or lowered so far (0 without a guard)."""
        return 0 if self.guard is None else self.guard.engaged

    def feedback(self, i: int) -> tuple[int, ...]:
        """Sample ``i``'s run ended: the guard sees its early answer against the final one.
        Returns the active ramps it ran with (a newer config may apply by now)."""
        version, active, answer, site = self.ran.pop(i)
        if self.guard is not None and site >= 0 and version == self.version:
            self.guard.observe([site], np.array([[answer]]),
                               np.array([[self.view.ramp_score[site, i]]]),
                               np.array([site]), self.view.final_pred[i:i + 1])
        return active


def run_offramp(trace: Trace, arrivals: np.ndarray, controller: ExitController,
                delay_s: float = DECISION_DELAY_S, window: int = 16,
                backlog: int = FEEDBACK_BACKLOG, refits: ReplayRefits | None = None,
                exit_guard: bool = True, head_delay_s: float = HEAD_DELAY_S) -> PolicyResult:
    """The controller on the stream; with ``refits``, also its online ramp refits, whose
    heads reach the worker ``head_delay_s`` after the feedback that set off their round;
    ``exit_guard``: the worker caps a ramp that answered wrongly until the next config."""
    view = trace if refits is None else refits.view
    deployed = _Deployed(view, controller.active, controller.thresholds,
                         ExitGuard(ALERT_BACKOFF) if exit_guard else None)
    decisions: list[dict[str, Any]] = []
    raw: list[TunerDecision] = []
    wall: dict[str, list[float]] = {"tune": [], "adjust": [], "record": [], "skipped": []}
    n_active = np.empty(trace.n_samples, np.int64)
    inner = threshold_server(view, deployed.get)

    def serve(i: int) -> tuple[float, float, int, int]:
        n_active[i] = len(deployed.cfg[0])
        return deployed.served(i, inner(i) if refits is None else refits.serve(i, inner))

    def deploy_at(t: float, d: TunerDecision, heads: list | None = None) -> tuple:
        cfg = (d.active, d.thresholds)

        def apply() -> None:
            for site, head in heads or ():
                refits.apply(site, head)
            if d.changed:
                deployed.apply(cfg)
        return t + (head_delay_s if heads else delay_s), apply

    def done(i: int, t: float) -> list[tuple[float, Callable[[], None]]]:
        active = deployed.feedback(i)
        t0 = time.perf_counter()
        triggers = controller.record(view.window(active, i, i + 1))
        wall["record"].append((time.perf_counter() - t0) * 1e3)
        out = []
        for trig in triggers:
            t0 = time.perf_counter()
            d = controller.step(trig)
            ms = (time.perf_counter() - t0) * 1e3
            # calls that had nothing to compute (no feedback yet) would flatter the medians
            wall[d.kind if d.tuned_on > 0 else "skipped"].append(ms)
            raw.append(d)
            decisions.append(_decided(d, i, t))
            if d.changed:
                out.append(deploy_at(t, d))
        if heads := (refits.feedback(i, t) if refits is not None else []):
            d = controller.head_changed([site for site, _ in heads])
            raw.append(d)
            decisions.append(_decided(d, i, t))
            out.append(deploy_at(t, d, heads))
        return out

    lat, ans, site = event_loop(view, arrivals, serve, done, backlog)
    extra = {} if refits is None else refits.report()
    counts = {**controller.counts, "guard_caps": deployed.caps_set()}
    return _result(REFIT if refits is not None else "offramp", trace, lat, ans, site, window,
                   decisions=decisions, raw_decisions=raw, wall_ms=wall, n_active=n_active,
                   counts=counts, params=controller.params(), **extra)


def refit_plan(trace: Trace, feature_rate: float = 0.0, feature_boost: float | None = None
               ) -> RefitPlan:
    """The default refit plan for a trace: softmax targets where the model's ramps learn
    the final softmax (their temperature is in the trace's meta), else top-1; features fed
    back at the workers' ``feature_rate`` and ``feature_boost`` (``OFFRAMP_RAMP_FEATURE_*``;
    0 and None: the plan's defaults, the live defaults)."""
    temperature = trace.meta.get("soft_temperature")
    plan = RefitPlan(soft_temperature=None if temperature is None else float(temperature))
    if feature_rate > 0:
        plan = dataclasses.replace(plan, feature_rate=feature_rate)
    if feature_boost is not None:
        plan = dataclasses.replace(plan, feature_boost=feature_boost)
    return plan


def fastest_pass(a: PolicyResult, b: PolicyResult) -> dict[str, list[float]]:
    """Per-call minimum of two offramp replays' wall times; they must have decided alike."""
    if a.extra["decisions"] != b.extra["decisions"]:
        raise RuntimeError("offramp replays of one trace decided differently: the controller "
                           "is not deterministic, so their timings are not comparable")
    wa, wb = a.extra["wall_ms"], b.extra["wall_ms"]
    return {k: [min(x, y) for x, y in zip(wa[k], wb[k], strict=True)] for k in wa}


GRID_STEP = {1: 0.01, 2: 0.01, 3: 0.025, 4: 0.05}  # grid resolution by ramp count


def _grid(r: int) -> tuple[float, ...]:
    step = GRID_STEP.get(r, 0.05)
    return tuple(round(step * i, 4) for i in range(round(1 / step) + 1))


def grid_gaps(decisions: list[TunerDecision], trace: Trace, constraint: float = DEFAULT_CONSTRAINT,
              rounds: int = 8, max_ramps: int = 4, climb: Climb | None = None) -> dict[str, Any]:
    """How far the hill climb lands from a grid search on the same tuning windows.

    Grid search is exponential in the ramps, so on windows with more than ``max_ramps`` active
    ramps both searches run on the ``max_ramps`` ramps that answered most samples under the
    deployed thresholds (ties: earlier), and the grid is as fine as stays cheap: step 0.01 for
    1-2 ramps, 0.025 for 3, 0.05 for 4 (``tune``'s finest step is 0.01, so a coarser grid can
    lose to it: negative gaps). Both search from 0 on identical data under ``constraint``
    (pass the controller's tuning constraint), so the gap isolates the search; ``rounds``
    tune decisions are sampled evenly over the run."""
    prof = trace.profile()
    tunes = [d for d in decisions if d.kind == "tune" and d.window is not None
             and d.window.n_ramps > 0]
    if not tunes:
        return {"grid_gap": None, "rounds": 0}
    pick = sorted({round(float(x))
                   for x in np.linspace(0, len(tunes) - 1, min(rounds, len(tunes)))})
    per: list[float] = []
    ramps: list[int] = []
    tuned_sum, grid_sum = 0.0, 0.0
    for j in pick:
        d = tunes[j]
        w = d.window
        assert w is not None
        if w.n_ramps > max_ramps:
            rp = Replay(w, prof)
            e = rp.exit_index(np.asarray(d.thresholds)[None])[0]
            counts = np.bincount(e, minlength=w.n_ramps + 1)[: w.n_ramps]
            top = sorted(np.argsort(-counts, kind="stable")[:max_ramps].tolist())
            w = w.select([w.ramp_ids[k] for k in top])
        t = tune(w, prof, constraint, climb=climb).evaluation.savings_ms
        g = grid_search(w, prof, constraint, _grid(w.n_ramps)).evaluation.savings_ms
        per.append(grid_gap(t, g))
        ramps.append(w.n_ramps)
        tuned_sum, grid_sum = tuned_sum + t, grid_sum + g
    return {"grid_gap": grid_gap(tuned_sum, grid_sum), "grid_gap_median": float(np.median(per)),
            "grid_gap_max": float(np.max(per)), "rounds": len(pick), "max_ramps": max_ramps,
            "ramps_per_round": ramps, "grid_step": {str(k): v for k, v in GRID_STEP.items()},
            "tuned_savings_ms": tuned_sum / len(pick), "grid_savings_ms": grid_sum / len(pick)}


def run_hindsight(trace: Trace, arrivals: np.ndarray, constraint: float = DEFAULT_CONSTRAINT,
                  budget: float = DEFAULT_BUDGET, every: int = DEFAULT_TUNE_WINDOW,
                  window: int = 16, backlog: int = FEEDBACK_BACKLOG,
                  climb: Climb | None = None) -> PolicyResult:
    """A bound on what threshold tuning alone can do with these ramps: the initial deployment's
    ramps (offramp's starting point), thresholds tuned by the same hill climb on each block of
    ``every`` samples *with those very samples* (perfect foresight, per block). A causal tuner
    only sees the past, so offramp sits between ``static`` and this; a wide gap says the
    controller (not the ramps) leaves savings behind, a small gain here says the ramps do."""
    prof = trace.profile()
    active = initial_sites(trace, budget)
    if every < 1:
        raise ValueError("every must be >= 1")
    blocks: list[tuple[float, ...]] = []
    for start in range(0, trace.n_samples, every):
        stop = min(start + every, trace.n_samples)
        blocks.append(tuple(tune(trace.window(active, start, stop), prof, constraint,
                                 climb=climb).thresholds)
                      if active else ())
    serve = threshold_server(trace, lambda i: (active, blocks[i // every]))
    lat, ans, site = event_loop(trace, arrivals, serve, None, backlog)
    return _result("hindsight", trace, lat, ans, site, window, active=list(active), every=every)


def run_replay(trace: Trace, arrivals: np.ndarray, constraint: float = DEFAULT_CONSTRAINT,
               budget: float = DEFAULT_BUDGET, window: int = 16,
               delay_s: float = DECISION_DELAY_S, static_frac: float = 0.1,
               grid_rounds: int = 8, controller: dict[str, Any] | None = None,
               policies: tuple[str, ...] = POLICIES, timing_passes: int = TIMING_PASSES,
               feedback_backlog: int = FEEDBACK_BACKLOG,
               climb: Climb | None = None, refit: RefitPlan | None = None,
               exit_guard: bool = True, head_delay_s: float = HEAD_DELAY_S,
               ) -> dict[str, PolicyResult | dict]:
    """Every policy on the same trace and arrivals; offramp also gets its grid gap.
    ``climb``: the threshold climb's engine (``climb_native.best_climb()`` is the live
    tuner's; None = the Python climb, the same decisions). ``refit``: how ``offramp+refit``
    refits ramp heads (default: ``refit_plan(trace)``); it runs on traces with features, and
    its new heads reach the worker ``head_delay_s`` late.
    ``exit_guard``: the worker's own back-off after a wrong answer (as live, on by default);
    it matters when decisions reach the worker late (``delay_s``)."""
    if timing_passes < 1:
        raise ValueError(f"timing_passes must be >= 1, got {timing_passes}")
    if feedback_backlog < 0:
        raise ValueError(f"feedback_backlog must be >= 0, got {feedback_backlog}")
    fb = feedback_backlog
    out: dict[str, PolicyResult | dict] = {}
    for name in policies:
        if name == "vanilla":
            out[name] = run_vanilla(trace, arrivals, window, fb)
        elif name == "static":
            out[name] = run_static(trace, arrivals, constraint, static_frac, window, fb)
        elif name == "oracle":
            out[name] = run_oracle(trace, arrivals, window, fb)
        elif name == "hindsight":
            every = int((controller or {}).get("tune_window", DEFAULT_TUNE_WINDOW))
            out[name] = run_hindsight(trace, arrivals, constraint, budget, every, window, fb,
                                      climb)
        elif name == REFIT:
            if trace.features is not None:
                refits = ReplayRefits(trace, refit or refit_plan(trace))
                ctl = make_controller(trace, constraint, budget, window=window, climb=climb,
                                      evidence=refits.evidence if refits.plan.evidence else None,
                                      **(controller or {}))
                out[name] = run_offramp(trace, arrivals, ctl, delay_s, window, fb, refits,
                                        exit_guard, head_delay_s)
        elif name == "offramp":
            def fresh() -> ExitController:
                return make_controller(trace, constraint, budget, window=window, climb=climb,
                                       **(controller or {}))

            ctl = fresh()
            res = run_offramp(trace, arrivals, ctl, delay_s, window, fb, exit_guard=exit_guard)
            for _ in range(timing_passes - 1):
                again = run_offramp(trace, arrivals, fresh(), delay_s, window, fb,
                                    exit_guard=exit_guard)
                res.extra["wall_ms"] = fastest_pass(res, again)
            res.extra["timing_passes"] = timing_passes
            if grid_rounds > 0:
                res.extra["grid"] = grid_gaps(res.extra["raw_decisions"], trace,
                                              ctl.tune_constraint, grid_rounds, climb=climb)
            out[name] = res
        else:
            raise ValueError(f"unknown policy {name!r}; known: {', '.join(POLICIES)}")
    return out

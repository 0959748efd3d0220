"""The Apparate control loop (§3.2-3.3), pure: feedback in, versioned exit configs out.

The live tuner service and the replay simulator both drive this class, so a benchmark in
simulation exercises the very decisions a live run makes. No clock: time is samples seen.
``observe(batch)`` = ``record(batch)`` (bookkeeping, returns due ``Trigger``s) + ``step``
per trigger (the work; the simulator times each step on its own).

- **window** [16]: per sample, the top-1 and score of the *active* ramps and the final top-1
  (what a live system sees). The deployed config is replayed on each sample (the earliest
  active ramp whose score < threshold answers) over tumbling windows ("an average achieved
  accuracy over the past 16 samples", §3.2); a config change starts a new window.
- **alert**: "tuning is triggered any time a window's accuracy falls below the ... constraint".
  With 16 samples and 1%, one disagreement already dooms the window, so the alert fires at
  that sample instead of up to 15 samples later. Thresholds are then re-tuned from 0
  (``tune()``) on the newest ``tune_window`` samples, must also meet the constraint on the
  alert window (else the element-wise min with that window's own tune, else that tune capped
  at the deployed thresholds, else with the ramps that answer it wrongly switched off), and
  every ramp that answered wrongly there is capped at ``backoff`` x its wrong score: the
  next frames of the scene that broke it score alike, so re-tuning "just below" the
  failure fails again at the next frame. An alert never raises a threshold: it says the
  config is too eager, and just after a ramp was added only a few dozen records hold it, on
  which a tune from 0 overfits. Raising is the slack tune's job. With ``sampled_feedback``
  (compute mode, where feedback is a sample of the stream) the window alerts once the upper
  bound of its agreement's 95 % Wilson interval falls below ``1 - constraint``
  (``interval_alert_limit``): at 16 samples and 1 % that is the same single disagreement.
- **sampled feedback**: a tune on a sample of the stream picks, among many threshold vectors,
  the one with the most savings whose *sample* agreement fits, so its agreement on the
  stream is lower than on the sample. With ``sampled_feedback`` a tune on n samples leaves
  no more disagreements than keep the lower bound of the agreement's 95 % Wilson interval at
  ``1 - constraint`` (``interval_tune_limit``: none up to 512 samples, 3 of 1,024, 11 of
  2,048 at 1 %), and compute mode tunes on ``COMPUTE_TUNE_WINDOW`` samples. In replay of
  compute mode (docs/benchmarks.md) the point-estimate tune on 512 samples let 6,000-request
  windows fall to 97.5 % at 5 % feedback; this held 99 % in them in 143 of 144 runs.
- **slack**: "the goal of tuning is to identify a new set of thresholds that maximizes latency
  savings" and "trialed ramps start with threshold=0 ... but are soon updated in the next
  round of threshold tuning" (§3.2-3.3), yet tuning is only *triggered* by violations, so from
  all-zero thresholds nothing would ever exit. After ``slack_windows`` [8] clean windows (128
  samples: one adjust period) the controller tunes for savings, climbing from the deployed
  thresholds on the same ``tune_window`` samples; it waits until ``min_tune_samples``
  [tune_window / 2] samples hold every active ramp.
- **headroom**: tunes target ``tune_constraint`` [constraint / 2]. A climb stops on the
  boundary of what the *past* window allows ("maximum latency savings must fall on that
  boundary"); the next frames land beyond it, and each miss costs a disagreement.
- **adjust**: every ``adjust_every`` [128] samples ("every 128 samples by default", §3.3)
  ``ramp_adjust.adjust()`` runs on the last ``adjust_window`` [2 x adjust_every = 256]
  samples holding every active ramp. Not the last 128: its re-tunes target the headroom,
  and 0.5% of 128 samples allows no disagreement at all, so one confident mistake in the
  round would retune a ramp to 0 and drop it.
  A deactivated site is not trialled again for ``cooldown_rounds`` [2] rounds, doubled
  for each further deactivation in a row (at most ``MAX_COOLDOWN_ROUNDS``): a stream whose
  ramps cannot meet the constraint would otherwise trial and drop the same sites every
  round, each trial paying its serving cost on every sample and a session build in the
  worker. A site that keeps a non-negative utility through a round starts afresh.
  Trials as a whole back off too: after a trialled site is dropped, no site is added for
  ``cooldown_rounds`` rounds, doubled for each further failed trial in a row (any site), so a
  stream where no ramp pays stops cycling through sites. A trial that survives a round ends
  the streak.
- Records served before a ramp was activated never tune or judge it: windows are built from
  the newest records that hold every active ramp (older supersets still count).

The defaults maximise savings subject to >= 99% agreement on every recorded EfficientNet
video trace in replay; docs/design/tuner.md gives the measurements behind each of them.
Scores follow ``services.exits.scores`` (lower = more confident, exit iff score < threshold).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from services.exits.exit_guard import ALERT_BACKOFF
from services.exits.exit_window import ExitWindow
from services.exits.latency_profile import LatencyProfile
from services.tuner.evidence_adjust import EvidenceChoice, choose_active
from services.tuner.ramp_adjust import ADJUST_EVERY, DEFAULT_BUDGET, AdjustInput, adjust
from services.tuner.thresholds import (
    DEFAULT_CONSTRAINT,
    Climb,
    Replay,
    allowed_disagreements,
    check_constraint,
    evaluate,
    interval_alert_limit,
    interval_tune_limit,
    meets,
    tune,
)

DEFAULT_WINDOW = 16          # samples per agreement window (§3.2)
DEFAULT_TUNE_WINDOW = 512    # samples tuned on (chosen in the replay simulator, module doc)
COMPUTE_TUNE_WINDOW = 2048   # sampled feedback: a tune allows a few misses only on thousands
DEFAULT_SLACK_WINDOWS = 8    # clean windows before a savings tune
DEFAULT_TUNE_SHARE = 0.5     # tune to this share of the constraint: headroom for drift
DEFAULT_BACKOFF = ALERT_BACKOFF  # after an alert, failing ramps' thresholds <= this x wrong score
DEFAULT_COOLDOWN_ROUNDS = 2  # adjust rounds a deactivated site is not trialled again
MAX_COOLDOWN_ROUNDS = 32     # the longest wait after repeated failures (4096 samples)
MIN_EVIDENCE = 128          # sampled inputs an evidence window needs to choose the active set
NEVER = 2**62               # adjust_every of a compute-mode controller: no adjustment rounds


@dataclass(frozen=True)
class Trigger:
    """Something ``record`` found due; ``step`` turns it into a decision."""

    kind: str                    # "alert" | "slack" | "adjust" | "refit"
    at_sample: int               # samples observed when it became due
    window_agreement: float | None = None
    window: ExitWindow | None = field(default=None, compare=False, repr=False)  # alert window


@dataclass(frozen=True)
class TunerDecision:
    """A (possibly unchanged) exit config and why; ``version`` grows only when it changed."""

    version: int
    kind: str                       # "tune" | "adjust"
    trigger: str                    # "alert" | "slack" | "adjust"
    action: str                     # "tune", "keep", or a ramp_adjust action
    reason: str
    active: tuple[int, ...]
    thresholds: tuple[float, ...]   # one per active ramp
    changed: bool
    at_sample: int
    tuned_on: int = 0               # samples the decision was computed on
    est_savings_ms: float | None = None  # tune: mean savings of the new config on those samples
    window_agreement: float | None = None
    utilities: tuple[Any, ...] = ()  # ramp_adjust.RampUtility per active ramp (adjust only)
    deactivated: tuple[int, ...] = ()
    added: tuple[int, ...] = ()
    window: ExitWindow | None = field(default=None, compare=False, repr=False)

    def to_dict(self) -> dict[str, Any]:
        """Plain data for the store / the wire (without the window)."""
        d = {k: v for k, v in asdict(self).items() if k not in ("window", "utilities")}
        d["utilities"] = [asdict(u) for u in self.utilities]
        return {k: list(v) if isinstance(v, tuple) else v for k, v in d.items()}


class ExitController:
    """State of one model's exit config and its feedback history (serialisable)."""

    def __init__(self, profile: LatencyProfile, active: list[int] | tuple[int, ...],
                 thresholds: list[float] | tuple[float, ...] | None = None, *,
                 constraint: float = DEFAULT_CONSTRAINT, window: int = DEFAULT_WINDOW,
                 tune_window: int = DEFAULT_TUNE_WINDOW, adjust_every: int = ADJUST_EVERY,
                 budget: float = DEFAULT_BUDGET, score: str = "max_softmax",
                 slack_windows: int | None = DEFAULT_SLACK_WINDOWS,
                 cooldown_rounds: int = DEFAULT_COOLDOWN_ROUNDS,
                 min_tune_samples: int | None = None,
                 tune_constraint: float | None = None, adjust_window: int | None = None,
                 backoff: float = DEFAULT_BACKOFF, version: int = 0,
                 climb: Climb | None = None, sampled_feedback: bool = False,
                 evidence: Callable[[], ExitWindow | None] | None = None) -> None:
        check_constraint(constraint)
        self.climb = climb
        self.evidence = evidence  # recent samples seen by every site (feature feedback)
        if min(window, tune_window, adjust_every) < 1:
            raise ValueError("window, tune_window and adjust_every must be >= 1")
        if slack_windows is not None and slack_windows < 1:
            raise ValueError("slack_windows must be >= 1 (or None: no savings tunes)")
        ids = tuple(sorted(int(r) for r in active))
        profile.check_sites(ids)
        th = tuple(float(t) for t in (thresholds if thresholds is not None else [0.0] * len(ids)))
        if len(th) != len(ids) or any(not t >= 0 for t in th):
            raise ValueError("need one threshold >= 0 per active ramp")
        self.profile, self.score = profile, score
        self.tune_constraint = (DEFAULT_TUNE_SHARE * constraint if tune_constraint is None
                                else float(tune_constraint))
        self.adjust_window = 2 * adjust_every if adjust_window is None else int(adjust_window)
        if not 0.0 <= backoff <= 1.0:
            raise ValueError(f"backoff must be in [0, 1], got {backoff}")
        self.backoff = float(backoff)
        check_constraint(self.tune_constraint)
        self.sampled_feedback = bool(sampled_feedback)
        self.alert_limit = (interval_alert_limit(window, constraint) if sampled_feedback
                            else allowed_disagreements(window, constraint))
        self.constraint, self.window, self.tune_window = constraint, window, tune_window
        self.adjust_every, self.budget = adjust_every, budget
        self.slack_windows, self.cooldown_rounds = slack_windows, cooldown_rounds
        self.min_tune_samples = (max(window, tune_window // 2) if min_tune_samples is None
                                 else int(min_tune_samples))
        self.active, self.thresholds, self.version = ids, th, version
        self.seen = 0            # samples observed
        self.win_n = 0           # samples in the open window
        self.win_dis = 0         # their disagreements under the deployed config
        self.clean = 0           # consecutive clean windows since the last tune
        self.since_adjust = 0
        self.rounds = 0          # adjust rounds run
        self.deactivated_at: dict[int, int] = {}  # site -> round it was deactivated
        self.failures: dict[int, int] = {}        # site -> deactivations in a row
        self.trials: set[int] = set()             # added sites not yet judged by a round
        self.trial_streak = 0                     # trials dropped in a row (any site)
        self.trial_hold_until = 0                 # no site is added before this round
        self.counts = {"alerts": 0, "tunes": 0, "adjusts": 0, "changes": 0}
        self._segs: list[tuple[tuple[int, ...], np.ndarray, np.ndarray, np.ndarray]] = []

    # ------------------------------------------------------------------ feedback
    @property
    def capacity(self) -> int:
        """Samples remembered: what the windows, tunes and adjust rounds read (a round reads
        ``adjust_window``, however rarely it comes: compute mode has none)."""
        return max(self.window, self.tune_window, self.adjust_window)

    def observe(self, batch: ExitWindow) -> list[TunerDecision]:
        """Record a batch and act on whatever became due (what the live tuner calls)."""
        return [self.step(t) for t in self.record(batch)]

    def record(self, batch: ExitWindow) -> list[Trigger]:
        """Add feedback; return the due triggers (at most one tune and one adjust per batch)."""
        due: dict[str, Trigger] = {}
        n, pos = batch.n_samples, 0
        while pos < n:
            take = min(n - pos, self.window - self.win_n, self.adjust_every - self.since_adjust)
            sl = slice(pos, pos + take)
            pred, score, final = batch.pred[:, sl], batch.score[:, sl], batch.final[sl]
            self.win_dis += self._disagreements(batch.ramp_ids, pred, score, final)
            self._remember(batch.ramp_ids, pred, score, final)
            self.win_n += take
            self.since_adjust += take
            self.seen += take
            pos += take
            early = self.win_dis > self.alert_limit
            if early or self.win_n >= self.window:
                t = self._close_window()
                if t is not None and not (t.kind == "slack" and "alert" in due):
                    due.pop("slack", None)
                    due[t.kind] = t
            if self.since_adjust >= self.adjust_every:
                self.since_adjust = 0
                due["adjust"] = Trigger("adjust", self.seen)
        return [due[k] for k in ("alert", "slack", "adjust") if k in due]

    def _disagreements(self, ids: tuple[int, ...], pred: np.ndarray, score: np.ndarray,
                       final: np.ndarray) -> int:
        deployed = dict(zip(self.active, self.thresholds))
        th = np.array([deployed.get(r, 0.0) for r in ids])  # inactive / unknown: never exits
        answer = final.copy()
        open_ = np.ones(final.size, dtype=bool)
        for k in range(len(ids)):
            hit = open_ & (score[k] < th[k])
            answer[hit] = pred[k][hit]
            open_ &= ~hit
        return int((answer != final).sum())

    def _remember(self, ids: tuple[int, ...], pred: np.ndarray, score: np.ndarray,
                  final: np.ndarray) -> None:
        if self._segs and self._segs[-1][0] == ids:
            _, p, s, f = self._segs[-1]
            self._segs[-1] = (ids, np.concatenate([p, pred], axis=1),
                              np.concatenate([s, score], axis=1), np.concatenate([f, final]))
        else:
            self._segs.append((ids, pred.copy(), score.copy(), final.copy()))
        extra = sum(s[3].size for s in self._segs) - self.capacity
        while extra > 0:
            ids0, p, s, f = self._segs[0]
            if f.size <= extra:
                self._segs.pop(0)
                extra -= f.size
            else:
                self._segs[0] = (ids0, p[:, extra:], s[:, extra:], f[extra:])
                extra = 0

    def recent(self, limit: int, ids: tuple[int, ...] | None = None) -> ExitWindow | None:
        """The newest ``limit`` samples whose records hold every ramp of ``ids`` (default: the
        active set), seen by those ramps; None when there is none."""
        ids = self.active if ids is None else ids
        parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        got = 0
        for seg_ids, p, s, f in reversed(self._segs):
            if got >= limit:
                break
            if not set(ids) <= set(seg_ids):
                continue
            rows = [seg_ids.index(r) for r in ids]
            take = min(limit - got, f.size)
            parts.append((p[rows, -take:], s[rows, -take:], f[-take:]))
            got += take
        if not parts:
            return None
        parts.reverse()
        # cut from recorded (validated) batches
        return ExitWindow.unchecked(tuple(ids), np.concatenate([x[0] for x in parts], axis=1),
                                    np.concatenate([x[1] for x in parts], axis=1),
                                    np.concatenate([x[2] for x in parts]))

    def _close_window(self) -> Trigger | None:
        n, dis = self.win_n, self.win_dis
        self.win_n = self.win_dis = 0
        agreement = 1.0 - dis / n
        if dis > self.alert_limit:
            self.clean = 0
            self.counts["alerts"] += 1
            return Trigger("alert", self.seen, agreement, self.recent(n))
        self.clean += 1
        if self.slack_windows is not None and self.clean >= self.slack_windows:
            self.clean = 0
            return Trigger("slack", self.seen, agreement)
        return None

    # ------------------------------------------------------------------ decisions
    def head_changed(self, sites: Iterable[int]) -> TunerDecision:
        """Ramps ``sites`` now serve new heads (one refit round): their scores moved, so what
        was recorded of them no longer says what they will do. Their records are dropped and
        sites held back by failures of their old heads get a fresh chance. With evidence
        (recent inputs every site's current head scored) the active set and its thresholds
        are chosen on it at once, as an adjust round would, instead of a round later;
        without, a changed active ramp restarts at threshold 0 (it exits nothing until a
        tune has seen its new head). Either way a changed active ramp is judged like a
        trial by the next adjust round."""
        sites = sorted({int(s) for s in sites})
        self.profile.check_sites(sites)
        for site in sites:
            self._segs = [_without(seg, site) for seg in self._segs]
            self.deactivated_at.pop(site, None)
            self.failures.pop(site, None)
        trigger = Trigger("refit", self.seen)
        ev = self.evidence() if self.evidence is not None else None
        if ev is not None and ev.n_samples >= MIN_EVIDENCE:
            c = choose_active(ev, self.profile, self.active, self.budget, self.tune_constraint,
                              self.climb)
            self.trials |= set(sites) & set(c.active)
            return self._chosen("refit", trigger, "refit",
                                f"ramps {sites} serve refitted heads; {c.reason}", c, ev)
        self.trials |= set(sites) & set(self.active)
        th = tuple(0.0 if r in sites else t for r, t in zip(self.active, self.thresholds))
        return self._decision("refit", trigger, "refit", f"ramps {sites} serve refitted "
                              "heads: their thresholds restart at 0", self.active, th, 0, None)

    def step(self, trigger: Trigger) -> TunerDecision:
        """Run one due trigger and deploy its result."""
        if trigger.kind == "adjust":
            return self._adjust(trigger)
        return self._tune(trigger)

    def _deploy(self, active: tuple[int, ...], thresholds: tuple[float, ...]) -> bool:
        changed = active != self.active or thresholds != self.thresholds
        if changed:
            self.active, self.thresholds = active, thresholds
            self.version += 1
            self.counts["changes"] += 1
            self.win_n = self.win_dis = 0  # a window measures one config only
        return changed

    def _tune(self, trigger: Trigger) -> TunerDecision:
        self.counts["tunes"] += 1
        self.clean = 0
        alert = trigger.kind == "alert"
        w = self.recent(self.tune_window)
        old = self.thresholds
        if w is None or w.n_ramps == 0:
            return self._decision("tune", trigger, "tune", "no feedback holds every active ramp",
                                  self.active, old, 0, None)
        if not alert and w.n_samples < self.min_tune_samples:
            return self._decision("tune", trigger, "tune", f"only {w.n_samples} samples hold "
                                  f"every active ramp (< {self.min_tune_samples}): wait",
                                  self.active, old, 0, None)
        res = tune(w, self.profile, self.tune_constraint_on(w.n_samples),
                   start=None if alert else old,
                   climb=self.climb)
        th, how = res.thresholds, f"tuned on the last {w.n_samples} samples"
        if alert:
            th = tuple(min(a, b) for a, b in zip(th, old))  # see the module doc: alert
            how += ", no threshold raised"
        aw = trigger.window
        if alert and aw is not None and aw.ramp_ids == self.active:
            th, how = self._guard(aw, th, how)
            th, how = self._back_off(aw, old, th, how)
        th = tuple(float(t) for t in th)
        est = (res.evaluation.savings_ms if th == tuple(res.thresholds)
               else evaluate(w, self.profile, th).savings_ms)
        why = (f"window agreement {trigger.window_agreement:.3f} < {1 - self.constraint:.3f}: "
               if alert else f"{self.slack_windows} clean windows: tune for savings, ")
        return self._decision("tune", trigger, "tune", why + how, self.active, th,
                              w.n_samples, est, window=w)

    def tune_constraint_on(self, n: int) -> float:
        """The disagreement share a tune on ``n`` samples may leave: the headroom's, and with
        ``sampled_feedback`` no more than keeps the agreement's lower bound at the constraint
        (see the module doc: sampled feedback)."""
        if not self.sampled_feedback or n < 1:
            return self.tune_constraint
        return min(self.tune_constraint, interval_tune_limit(n, self.constraint) / n)

    def _guard(self, aw: ExitWindow, th: tuple[float, ...], how: str
               ) -> tuple[tuple[float, ...], str]:
        """Thresholds that also meet the constraint on the alert window (see module doc)."""
        if meets(evaluate(aw, self.profile, th), self.constraint):
            return th, how
        short = tune(aw, self.profile, self.constraint, climb=self.climb).thresholds
        low = tuple(min(a, b) for a, b in zip(th, short))
        if meets(evaluate(aw, self.profile, low), self.constraint):
            return low, how + ", capped by the alert window's tune"
        short = tuple(min(a, b) for a, b in zip(short, self.thresholds))  # never raised
        if meets(evaluate(aw, self.profile, short), self.constraint):
            return short, f"tuned on the {aw.n_samples}-sample alert window"
        return self._switch_off_failing(aw, th, how)

    def _switch_off_failing(self, aw: ExitWindow, th: tuple[float, ...], how: str
                            ) -> tuple[tuple[float, ...], str]:
        """``th`` with every ramp that answers the alert window wrongly under it set to 0,
        repeated while the samples it let go answer wrongly further on. An element-wise min
        of safe vectors can be unsafe (a sample kept from one ramp exits wrongly at the
        next), and switching every ramp off would cost all savings until a tune for
        savings, which in compute mode waits for ``COMPUTE_TUNE_WINDOW`` shadow samples
        (minutes): the ramps that did not fail keep their thresholds."""
        rp = Replay(aw, self.profile)
        allowed = allowed_disagreements(aw.n_samples, self.constraint)
        cur, off = list(th), []
        while True:
            e = rp.exit_index(np.asarray(cur)[None])[0]
            wrong = ~rp.agree[e, np.arange(aw.n_samples)]  # the final model always agrees
            if wrong.sum() <= allowed:
                return tuple(cur), how + f", ramps {off} off: they answered the alert window wrongly"
            failing = sorted({int(k) for k in e[wrong] if cur[k] > 0})
            if not failing:  # a score below 0 exits at 0 too: nothing but no exits is safe
                return (0.0,) * len(th), "nothing safe on the alert window: no exits until re-tuned"
            for k in failing:
                cur[k] = 0.0
                off.append(self.active[k])

    def _back_off(self, aw: ExitWindow, old: tuple[float, ...], th: tuple[float, ...],
                  how: str) -> tuple[tuple[float, ...], str]:
        """Cap each ramp that answered wrongly in the alert window at ``backoff`` x its lowest
        wrong score there: the next frames of the scene that broke it score alike."""
        rp = Replay(aw, self.profile)
        e = rp.exit_index(np.asarray(old)[None])[0]
        cap = list(th)
        hit = False
        for j in np.flatnonzero((e < aw.n_ramps) & ~rp.agree[e, np.arange(aw.n_samples)]):
            k = int(e[j])
            limit = self.backoff * float(aw.score[k, j])
            if limit < cap[k]:
                cap[k], hit = limit, True
        return tuple(cap), how + (f"; backed off the failing ramps x{self.backoff:g}" if hit
                                  else "")

    def _adjust(self, trigger: Trigger) -> TunerDecision:
        self.counts["adjusts"] += 1
        self.rounds += 1
        ev = self.evidence() if self.evidence is not None else None
        if ev is not None and ev.n_samples >= MIN_EVIDENCE:
            c = choose_active(ev, self.profile, self.active, self.budget, self.tune_constraint,
                              self.climb)
            if c.active == self.active:
                return self._decision("adjust", trigger, "keep", c.reason, self.active,
                                      self.thresholds, ev.n_samples, None)
            return self._chosen("adjust", trigger, "evidence_switch", c.reason, c, ev)
        w = self.recent(self.adjust_window)
        if w is None:
            return self._decision("adjust", trigger, "keep", "no feedback holds every active "
                                  "ramp yet", self.active, self.thresholds, 0, None)
        exclude = frozenset(s for s, r in self.deactivated_at.items()
                            if self.rounds - r <= self.cooldown(s) and s not in self.active)
        if self.rounds < self.trial_hold_until:  # trials as a whole are backing off
            exclude = frozenset(range(self.profile.n_sites)) - frozenset(self.active)
        d = adjust(AdjustInput(w, self.profile, self.thresholds, self.tune_constraint,
                               self.budget, exclude, self.climb))
        for u in d.utilities:  # paid its way this round: a later failure waits the base time
            if u.utility_ms >= 0 and u.ramp_id in d.active:
                self.failures.pop(u.ramp_id, None)
                if u.ramp_id in self.trials:
                    self.trials.discard(u.ramp_id)
                    self.trial_streak = 0
        for s in d.deactivated:
            self.deactivated_at[s] = self.rounds
            self.failures[s] = self.failures.get(s, 0) + 1
            if s in self.trials:
                self.trials.discard(s)
                self.trial_streak += 1
                self.trial_hold_until = self.rounds + 1 + self.trial_cooldown()
        self.trials |= set(d.added)
        self.deactivated_at = {s: r for s, r in self.deactivated_at.items()
                               if self.rounds - r <= self.cooldown(s)}
        return self._decision("adjust", trigger, d.action, d.reason, d.active, d.thresholds,
                              w.n_samples, None, utilities=d.utilities,
                              deactivated=d.deactivated, added=d.added, window=w)

    def _chosen(self, kind: str, trigger: Trigger, action: str, reason: str,
                c: EvidenceChoice, ev: ExitWindow) -> TunerDecision:
        """Deploy an active set and thresholds chosen on the evidence window ``ev``."""
        return self._decision(kind, trigger, action, reason, c.active, c.thresholds,
                              ev.n_samples, c.savings_ms,
                              deactivated=tuple(sorted(set(self.active) - set(c.active))),
                              added=tuple(sorted(set(c.active) - set(self.active))))

    def trial_cooldown(self) -> int:
        """Adjust rounds with no new trial after the latest failed one (see module doc)."""
        return self._doubled(self.trial_streak)

    def cooldown(self, site: int) -> int:
        """Adjust rounds ``site`` waits after its latest deactivation before a new trial."""
        return self._doubled(self.failures.get(site, 1))

    def _doubled(self, failures: int) -> int:
        """``cooldown_rounds``, doubled for each failure in a row after the first, capped."""
        k = max(failures, 1)
        return min(self.cooldown_rounds * 2 ** (k - 1),
                   max(MAX_COOLDOWN_ROUNDS, self.cooldown_rounds))

    def _decision(self, kind: str, trigger: Trigger, action: str, reason: str,
                  active: tuple[int, ...], thresholds: tuple[float, ...], tuned_on: int,
                  est: float | None, **extra: Any) -> TunerDecision:
        changed = self._deploy(tuple(active), tuple(float(t) for t in thresholds))
        return TunerDecision(version=self.version, kind=kind, trigger=trigger.kind, action=action,
                        reason=reason, active=self.active, thresholds=self.thresholds,
                        changed=changed, at_sample=trigger.at_sample, tuned_on=tuned_on,
                        est_savings_ms=est, window_agreement=trigger.window_agreement, **extra)

    # ------------------------------------------------------------------ state
    def params(self) -> dict[str, Any]:
        """The knobs (constructor keyword arguments) this controller runs with."""
        return {"constraint": self.constraint, "window": self.window,
                "tune_window": self.tune_window, "adjust_every": self.adjust_every,
                "budget": self.budget, "score": self.score, "slack_windows": self.slack_windows,
                "cooldown_rounds": self.cooldown_rounds, "min_tune_samples": self.min_tune_samples,
                "tune_constraint": self.tune_constraint, "adjust_window": self.adjust_window,
                "backoff": self.backoff, "sampled_feedback": self.sampled_feedback}

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe state (params, config, counters, feedback buffer) for the store."""
        return {
            "profile": {"prefix_ms": self.profile.prefix_ms.tolist(),
                        "ramp_cost_ms": self.profile.ramp_cost_ms.tolist()},
            "params": self.params(),
            "active": list(self.active), "thresholds": list(self.thresholds),
            "version": self.version, "seen": self.seen, "win_n": self.win_n,
            "win_dis": self.win_dis, "clean": self.clean, "since_adjust": self.since_adjust,
            "rounds": self.rounds, "counts": dict(self.counts),
            "deactivated_at": {str(s): r for s, r in self.deactivated_at.items()},
            "failures": {str(s): k for s, k in self.failures.items()},
            "trials": sorted(self.trials), "trial_streak": self.trial_streak,
            "trial_hold_until": self.trial_hold_until,
            "records": [{"ramp_ids": list(i), "pred": p.tolist(), "score": s.tolist(),
                         "final": f.tolist()} for i, p, s, f in self._segs],
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ExitController:
        prof = LatencyProfile.build(d["profile"]["prefix_ms"], d["profile"]["ramp_cost_ms"])
        c = cls(prof, d["active"], d["thresholds"], version=int(d["version"]), **d["params"])
        for k in ("seen", "win_n", "win_dis", "clean", "since_adjust", "rounds"):
            setattr(c, k, int(d[k]))
        c.counts = {k: int(v) for k, v in d["counts"].items()}
        c.deactivated_at = {int(s): int(r) for s, r in d["deactivated_at"].items()}
        c.failures = {int(s): int(k) for s, k in d.get("failures", {}).items()}
        c.trials = {int(s) for s in d.get("trials", [])}
        c.trial_streak = int(d.get("trial_streak", 0))
        c.trial_hold_until = int(d.get("trial_hold_until", 0))
        for rec in d["records"]:
            ids = tuple(int(r) for r in rec["ramp_ids"])
            n = len(rec["final"])
            c._segs.append((ids, np.array(rec["pred"], np.int64).reshape(len(ids), n),
                            np.array(rec["score"], np.float64).reshape(len(ids), n),
                            np.array(rec["final"], np.int64)))
        return c


def _without(seg: tuple[tuple[int, ...], np.ndarray, np.ndarray, np.ndarray], site: int
             ) -> tuple[tuple[int, ...], np.ndarray, np.ndarray, np.ndarray]:
    """A feedback segment without the records of ramp ``site``."""
    ids, pred, score, final = seg
    if site not in ids:
        return seg
    keep = [k for k, r in enumerate(ids) if r != site]
    return tuple(ids[k] for k in keep), pred[keep], score[keep], final


def mode_controller(profile: LatencyProfile, active: Iterable[int], thresholds: Iterable[float],
                    *, compute: bool, constraint: float = DEFAULT_CONSTRAINT,
                    budget: float = DEFAULT_BUDGET, climb: Climb | None = None) -> ExitController:
    """The controller the tuner runs for an exit mode (the replay of compute mode runs the
    same). Compute mode tunes thresholds only: which ramps run is the deployment plan's call
    (E3 §3.4), and the ramp budget is a latency-mode notion. Its feedback is a sample of the
    stream, so it alerts on the agreement interval's upper bound and tunes to its lower bound,
    on more samples."""
    return ExitController(profile, list(active), list(thresholds), constraint=constraint,
                          budget=budget, climb=climb,
                          adjust_every=NEVER if compute else ADJUST_EVERY,
                          tune_window=COMPUTE_TUNE_WINDOW if compute else DEFAULT_TUNE_WINDOW,
                          sampled_feedback=compute, adjust_window=2 * ADJUST_EVERY)

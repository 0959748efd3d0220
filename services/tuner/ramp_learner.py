"""The refit role's state for one model (pure): every ramp's serving head, a buffer of its
recent feature feedback, its version, and when a refit round is due.

The tuner service and the replay's ``offramp+refit`` policy both drive this class: sampled
feedback goes in with :meth:`RampLearner.feed`, which says when a round is due (every
``every`` sampled samples); the caller then asks :meth:`RampLearner.propose` for each ramp
(timing it: this module reads no clock) and, for a head it deploys, calls
:meth:`RampLearner.adopt`. Pooled features do not depend on the head that will read them,
so a buffer stays valid across head versions.

A head fitted to one scene forgets the others: when the stream returns to what an earlier
head (the prepared one, or a recent version) knew, a refit from the serving head needs
hundreds of samples of the new scene to win back what that head already had. So every
round first judges the heads the ramp served before (``keep`` most recent versions and the
one it started with) against the serving head on the samples fed since the last round;
one that beats it comes back as it was, under its old version.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from services.exits.exit_window import ExitWindow
from services.exits.linear_head import LinearHead
from services.exits.scores import exit_score, softmax
from services.tuner.refit import RampBuffer, RefitConfig, Verdict, judge, propose, top1


@dataclass(frozen=True)
class LearnerConfig:
    refit: RefitConfig = field(default_factory=RefitConfig)
    every: int = 64                        # sampled samples between refit rounds
    soft_temperature: float | None = None  # softmax targets at this temperature (else top-1)
    evidence: int = 256                    # newest samples the ramp adjustment chooses on
    keep: int = 3                          # earlier versions a ramp may return to (+ its first)


class Proposal(NamedTuple):
    """A round's outcome for one ramp: the head to deploy (None: keep serving), the verdict
    (None: buffer too small), samples trained and judged on, and ``version`` when the head
    is one the ramp served before (None: a new refit)."""

    head: LinearHead | None
    verdict: Verdict | None
    trained: int
    judged: int
    version: int | None = None


def soft_temperature(recipe: str) -> float | None:
    """The temperature of a model's soft ramp targets, from its preparation recipe
    (``...|targets=softmax@0.5|...``), or None when its ramps learned the top-1."""
    for part in str(recipe).split("|"):
        key, _, value = part.partition("=")
        if key == "targets" and value.startswith("softmax@"):
            return float(value.split("@")[1])
    return None


class RampLearner:
    """Per ramp (keyed by ramp index): serving head, feedback buffer, version."""

    def __init__(self, heads: dict[int, LinearHead], cfg: LearnerConfig = LearnerConfig(),
                 classes: int = 0, versions: dict[int, int] | None = None,
                 prepared: dict[int, LinearHead] | None = None) -> None:
        if cfg.every < 1:
            raise ValueError("a refit round needs every >= 1 sampled samples")
        self.cfg = cfg
        self.heads = dict(sorted(heads.items()))
        self.versions = {r: (versions or {}).get(r, 0) for r in self.heads}
        # what a ramp can always return to: its prepared head (version 0) when given (a
        # resumed tuner serves refitted ones), else the head it starts with
        self.first = {r: (0, prepared[r]) if prepared and r in prepared else (self.versions[r], h)
                      for r, h in self.heads.items()}
        self.earlier: dict[int, dict[int, LinearHead]] = {r: {} for r in self.heads}
        # soft targets need the temperature and the final logits' width
        self.soft = cfg.soft_temperature is not None and classes > 0
        self.buffers = {r: RampBuffer(cfg.refit.capacity, h.weight.shape[1],
                                      classes if self.soft else 0)
                        for r, h in self.heads.items()}
        self.fed = 0    # sampled samples since the last round
        self.seen = 0   # sampled samples ever

    def targets(self, final_pred: np.ndarray, final_logits: np.ndarray | None
                ) -> np.ndarray | None:
        """What the buffers learn: the final softmax at the configured temperature (None
        when the logits did not come), else the final top-1."""
        if not self.soft:
            return np.asarray(final_pred, np.int64)
        if final_logits is None:
            return None
        return softmax(np.asarray(final_logits, np.float32) / self.cfg.soft_temperature)

    def feed(self, features: dict[int, np.ndarray], final_pred: np.ndarray,
             final_logits: np.ndarray | None = None) -> bool:
        """Add feedback for N samples (``features``: ramp -> N x C); True when a refit round
        is due. Ramps this learner does not know are ignored; a ramp whose features have the
        wrong width raises ValueError."""
        y = self.targets(final_pred, final_logits)
        if y is None:
            return False  # soft buffers and no logits: nothing to learn from here
        n = 0
        for r, x in features.items():
            if r in self.buffers:
                self.buffers[r].add(x, y)
                n = len(x)
        self.fed += n
        self.seen += n
        if self.fed < self.cfg.every:
            return False
        self.fed = self.fed % self.cfg.every  # a batch's surplus counts towards the next round
        return True

    def propose(self, ramp: int) -> Proposal:
        """The head ``ramp`` should serve next, if not its serving one: a head it served
        before that beats the serving head on the newest samples (a scene it knew is back),
        else a refit that beats it on the held-back samples."""
        buf = self.buffers[ramp]
        if len(buf) < self.cfg.refit.min_samples:
            return Proposal(None, None, 0, 0)
        serving = self.heads[ramp]
        x, y = buf.arrays()
        recent = min(len(buf), self.cfg.every)  # fed since the last round: what is on now
        best: Proposal | None = None
        for version, head in self.returnable(ramp).items():
            v = judge(serving, head, x[-recent:], y[-recent:], self.cfg.refit)
            if v.accept and (best is None or
                             v.candidate_agreement > best.verdict.candidate_agreement):
                best = Proposal(head, v, 0, recent, version)
        if best is not None:
            return best
        candidate, verdict = propose(serving, buf, self.cfg.refit)
        return Proposal(candidate, verdict, len(buf) - verdict.judged_on, verdict.judged_on)

    def returnable(self, ramp: int) -> dict[int, LinearHead]:
        """Heads ``ramp`` served before (its first and the newest ``keep``), by version."""
        out = dict(self.earlier[ramp])
        out.setdefault(*self.first[ramp])
        out.pop(self.versions[ramp], None)
        return out

    def adopt(self, ramp: int, head: LinearHead, version: int | None = None) -> int:
        """``ramp`` serves ``head`` from now on, as ``version`` (default: the next); returns it."""
        old = self.versions[ramp]
        if old != self.first[ramp][0]:
            self.earlier[ramp][old] = self.heads[ramp]
            for v in sorted(self.earlier[ramp])[:-self.cfg.keep or None]:
                del self.earlier[ramp][v]
        self.heads[ramp] = head
        self.versions[ramp] = (max([old, *self.earlier[ramp]]) + 1 if version is None
                               else int(version))
        return self.versions[ramp]

    def evidence(self, score_kind: str) -> ExitWindow | None:
        """The newest samples every ramp has feedback for, as each ramp's serving head scores
        them: what the ramp adjustment chooses the active set on; None before any."""
        n = min([self.cfg.evidence] + [len(b) for b in self.buffers.values()])
        if n == 0 or not self.buffers:
            return None
        preds, scores, y = [], [], None
        for r, head in self.heads.items():
            x, y = self.buffers[r].arrays()
            logits = head.logits(x[-n:])
            preds.append(logits.argmax(axis=1))
            scores.append(exit_score(logits, score_kind))
        return ExitWindow.build(tuple(self.heads), np.stack(preds), np.stack(scores),
                                top1(y[-n:]))

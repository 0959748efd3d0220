"""The tuner's refit role in replay (the ``offramp+refit`` policy): sampled feature feedback
into per-ramp buffers, a refit round every ``every`` sampled samples, and deployed heads that
re-score the samples still to be served.

A trace recorded with ``--features`` holds what every site's head read and the prepared
heads, so any other head can be scored on the same samples without new inference. Until
the first refit is deployed, the replay serves the recorded answers: ``offramp+refit``
decides exactly as ``offramp`` does up to that point.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from services.exits.exit_window import ExitWindow
from services.exits.linear_head import LinearHead
from services.exits.scores import exit_score
from services.sim.trace import Trace, TraceError
from services.tuner.ramp_learner import LearnerConfig, RampLearner
from services.tuner.refit import RefitConfig
from services.worker.feature_sampling import FeatureSampler

REFIT = "offramp+refit"


@dataclass(frozen=True)
class RefitPlan:
    """How the replay feeds and runs refits."""

    cfg: RefitConfig = field(default_factory=RefitConfig)
    feature_rate: float = 0.25         # share of samples whose features come back (as live)
    feature_boost: float = 2.0         # ... boosted while few exit (as live, FeatureSampler)
    every: int = 64                    # sampled samples between refit rounds
    soft_temperature: float | None = None  # softmax targets at this temperature (else top-1)
    seed: int = 0                      # which samples are sampled
    evidence: int = 256                # newest sampled inputs the adjustment chooses on (0: off)
    feature_share: float | None = None  # a sampled run's extra time / the model's (None: the
    # trace's meta["feature_share"], measured while recording; absent there: not charged)


class ReplayRefits:
    """Mutable copy of a trace's ramp answers that refitted heads re-score (sites are the
    trace's ramp rows, 0..R-1)."""

    def __init__(self, trace: Trace, plan: RefitPlan = RefitPlan()) -> None:
        f = trace.features
        if f is None:
            raise TraceError(f"{REFIT} needs a trace recorded with --features")
        if not 0.0 < plan.feature_rate <= 1.0 or plan.every < 1 or plan.feature_boost < 1:
            raise ValueError("feature_rate must be in (0, 1], feature_boost >= 1 and every >= 1")
        self.plan, self.features = plan, f
        self.score_kind = str(trace.meta.get("score", "max_softmax"))
        self.view = dataclasses.replace(trace, ramp_pred=trace.ramp_pred.copy(),
                                        ramp_score=trace.ramp_score.copy())
        soft = plan.soft_temperature is not None and f.final_logits is not None
        self.learner = RampLearner(
            {k: LinearHead(w, b) for k, (w, b) in enumerate(zip(f.weight, f.bias, strict=True))},
            LearnerConfig(plan.cfg, plan.every, plan.soft_temperature, plan.evidence),
            classes=f.final_logits.shape[1] if soft else 0)
        self.final_pred, self.final_logits = trace.final_pred, f.final_logits if soft else None
        # the worker's sampler, one sample a batch (no per-second limit: replay has no clock)
        self.sampler = FeatureSampler(plan.feature_rate, 1e12, plan.seed,
                                      plan.feature_boost)
        self.sampled = np.zeros(trace.n_samples, bool)
        share = plan.feature_share if plan.feature_share is not None \
            else float(trace.meta.get("feature_share", 0.0))
        self.feature_ms = share * float(trace.prefix_ms[-1])  # what a sampled run pays
        self.next_serve = 0    # samples below this were served: their answers stay
        self.log: list[dict[str, Any]] = []
        self.refit_ms: list[float] = []

    def report(self) -> dict[str, Any]:
        """What the refits did, for the policy's result."""
        return {"refits": self.log, "refit_ms": self.refit_ms, "head_versions": self.versions,
                "feature_ms": self.feature_ms, "sampled": int(self.sampled.sum())}

    @property
    def versions(self) -> list[int]:
        return [self.learner.versions[k] for k in sorted(self.learner.versions)]

    def served(self, i: int) -> None:
        """Sample ``i`` is being served: whether its features will come back is decided
        now, as a worker decides before it runs a batch."""
        self.next_serve = max(self.next_serve, i + 1)
        self.sampled[i] = len(self.sampler.rows(str(i), 1, 0.0)) > 0

    def serve(self, i: int, inner: Callable[[int], tuple]) -> tuple:
        """Serve sample ``i`` with ``inner`` (a replay server: reply, busy, answer, exit
        site), its sampling decided first and its exit fed to the sampler. A sampled
        sample's run pays the features' cost, spread along the model as its time is: its
        answer at the end pays all of it, an early answer the share before its site."""
        self.served(i)
        reply, busy, answer, site = inner(i)
        self.sampler.exited(1, int(site >= 0))
        if self.sampled[i] and self.feature_ms > 0:
            full = float(self.view.prefix_ms[-1])
            share = 1.0 if site < 0 else float(self.view.prefix_ms[site]) / full
            reply, busy = reply + self.feature_ms * share, busy + self.feature_ms
        return reply, busy, answer, site

    def feedback(self, i: int, t: float) -> list[tuple[int, LinearHead]]:
        """Sample ``i``'s feedback arrived at ``t``: the heads a refit round accepted, if one
        was due."""
        if not self.sampled[i]:
            return []
        rows = slice(i, i + 1)
        due = self.learner.feed({k: x[rows] for k, x in enumerate(self.features.by_site)},
                                self.final_pred[rows],
                                None if self.final_logits is None else self.final_logits[rows])
        if not due:
            return []
        return [(k, head) for k in sorted(self.learner.heads)
                if (head := self._round(k, i, t)) is not None]

    def _round(self, k: int, i: int, t: float) -> LinearHead | None:
        """A refit of site ``k``; an accepted head is the learner's at once (as in the tuner,
        which adopts it before the controller restarts the ramp), the view's on ``apply``."""
        t0 = time.perf_counter()
        got = self.learner.propose(k)
        if got.verdict is None:
            return None
        if got.head is not None:
            self.learner.adopt(k, got.head, got.version)
        self.refit_ms.append((time.perf_counter() - t0) * 1e3)
        self.log.append({"sample": i, "t_s": t, "site": k, "accepted": got.head is not None,
                         "returned_to": got.version,
                         "serving_agreement": got.verdict.serving_agreement,
                         "candidate_agreement": got.verdict.candidate_agreement,
                         "reason": got.verdict.reason})
        return got.head

    def evidence(self) -> ExitWindow | None:
        """The newest sampled inputs as every site's current head sees them (what the
        adjustment chooses the active set on), or None when there are none."""
        return self.learner.evidence(self.score_kind)

    def apply(self, site: int, head: LinearHead) -> None:
        """Deploy ``head`` at ``site``: the samples not served yet get its answers."""
        start = self.next_serve
        logits = head.logits(self.features.by_site[site][start:])
        self.view.ramp_pred[site, start:] = logits.argmax(axis=1)
        self.view.ramp_score[site, start:] = exit_score(logits, self.score_kind)
        self.log.append({"sample": start, "site": site,
                         "deployed_version": self.learner.versions[site]})

"""Replay of compute mode's accuracy loop (pure): the tuner's controller fed only the shadow
sample of a recorded stream, and what its configs do to every request of that stream.

In compute mode an exited sample leaves the batch, so the final model's answer is known
only for the samples the shadow sampler keeps (``OFFRAMP_SHADOW_RATE`` of the requests,
chosen by a seeded hash of the request id). This replays that loop without a stack:

- the stream: trace sample indices in arrival order (e.g. an easy/hard mix);
- requests are served in batches under the config deployed when the batch starts;
- after each batch the selected requests (``ShadowSampler`` over ids ``{prefix}-{i}``) reach
  the controller as telemetry, with every active ramp's top-1 and score and the final top-1;
- the controller is the tuner's own (``controller.mode_controller(compute=True)``).

Per request it records whether the answer agreed with the final model and whether it
exited; per batch the latency savings of the deployed config on that batch (the trace's
batch-1 profile), so a run says what accuracy and what savings a shadow rate buys.
No clock: time is requests served. Decisions apply from the next batch (a live worker
applies a config between batches)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from services.exits.exit_window import ExitWindow
from services.exits.latency_profile import LatencyProfile
from services.exits.shadow import ShadowSampler
from services.tuner.controller import ExitController
from services.tuner.thresholds import Replay, evaluate

BATCH = 16  # requests per served batch (the live bench's batch size)


@dataclass(frozen=True)
class FeedbackRun:
    """One replayed stream: per request agreement and exit, per batch the savings."""

    agree: np.ndarray        # bool per request: answered like the final model
    exited: np.ndarray       # bool per request: answered at a ramp
    savings_ms: np.ndarray   # per request: the deployed config's mean savings on its batch
    shadow: np.ndarray       # bool per request: in the feedback sample
    shadow_ms: np.ndarray    # per request: the model time shadow work adds (exited and kept)
    counts: dict[str, int]   # the controller's alerts, tunes, changes

    def worst_window(self, size: int) -> float:
        """The lowest agreement over consecutive windows of ``size`` requests."""
        n = self.agree.size // size
        if n == 0:
            return float(self.agree.mean()) if self.agree.size else 1.0
        return float(self.agree[:n * size].reshape(n, size).mean(axis=1).min())


def replay_compute(pred: np.ndarray, score: np.ndarray, final: np.ndarray,
                   ramp_ids: Sequence[int], stream: np.ndarray, profile: LatencyProfile,
                   controller: ExitController, sampler: ShadowSampler,
                   id_prefix: str = "req", batch: int = BATCH) -> FeedbackRun:
    """Serve ``stream`` (indices into the trace arrays ``pred``/``score`` [ramp, sample] of
    ``ramp_ids`` and ``final``) under ``controller``'s configs, feeding it the shadow sample."""
    ids = tuple(int(r) for r in ramp_ids)
    if pred.shape[0] != len(ids) or score.shape != pred.shape:
        raise ValueError("pred and score need one row per ramp of ramp_ids")
    n = int(stream.size)
    shadow = sampler.selected([f"{id_prefix}-{i}" for i in range(n)])
    agree, exited = np.zeros(n, dtype=bool), np.zeros(n, dtype=bool)
    savings, shadow_ms = np.zeros(n), np.zeros(n)
    rest = profile.full_ms - np.asarray(profile.prefix_ms)[list(ids)]  # model time after a ramp
    for b0 in range(0, n, batch):
        sl = stream[b0:b0 + batch]
        deployed = dict(zip(controller.active, controller.thresholds))
        th = np.array([deployed.get(r, 0.0) for r in ids])  # not active: never exits
        p, s, f = pred[:, sl], score[:, sl], final[sl]
        rp = Replay(ExitWindow(ids, p, s, f), profile)
        row = rp.exit_index(th[None])[0]          # the answering ramp; len(ids): the final
        out = row < len(ids)
        keep = shadow[b0:b0 + sl.size]
        agree[b0:b0 + sl.size] = rp.agree[row, np.arange(sl.size)]
        exited[b0:b0 + sl.size] = out
        shadow_ms[b0:b0 + sl.size][keep & out] = rest[row[keep & out]]
        savings[b0:b0 + sl.size] = rp.evaluation(th).savings_ms
        if keep.any():
            controller.observe(ExitWindow(ids, p[:, keep], s[:, keep], f[keep]))
    return FeedbackRun(agree, exited, savings, shadow, shadow_ms,
                       {k: int(v) for k, v in controller.counts.items()})


def scaled_to_savings(pred: np.ndarray, score: np.ndarray, final: np.ndarray,
                      ramp_ids: Sequence[int], stream: np.ndarray, profile: LatencyProfile,
                      thresholds: np.ndarray, target_ms: float,
                      rounds: int = 40) -> tuple[float, float, float]:
    """Static thresholds at the same savings: ``thresholds`` x the factor in [0, 1] whose
    savings on ``stream`` come closest to ``target_ms`` (bisection; savings grow with the
    factor). Returns (factor, agreement, savings_ms)."""
    w = ExitWindow(tuple(int(r) for r in ramp_ids), pred[:, stream], score[:, stream],
                   final[stream])

    def at(k: float):
        return evaluate(w, profile, tuple(k * np.asarray(thresholds, dtype=np.float64)))

    lo, hi = 0.0, 1.0
    for _ in range(rounds):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if at(mid).savings_ms < target_ms else (lo, mid)
    k = 0.5 * (lo + hi)
    e = at(k)
    return k, e.agreement, e.savings_ms


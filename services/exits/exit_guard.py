"""The worker's own accuracy guard in latency mode (pure; no clock, no I/O).

A worker that runs every sample to the final layer knows, as each run ends, whether an
early answer agreed with the final model. The tuner learns it from telemetry, decides, and
its new config reaches the worker a round trip later (telemetry coalescing, JetStream, the
decision, the store write, the config message). Over that time a ramp that has started to
fail, typically on the first frames of a new scene, keeps answering the frames that follow
just as wrongly (docs/benchmarks.md measures what such a delay costs in replay).

So the worker applies the tuner's alert back-off itself, at once: a ramp that answered a
sample wrongly is capped at ``backoff`` x the exit score of that wrong answer (the
controller's alert back-off, ``ALERT_BACKOFF``) for the batches that follow. The caps only
ever lower thresholds, and the next exit config clears them: that config is the tuner's
answer, made on feedback that includes the failure or soon followed by one more cap if it
does not.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

ALERT_BACKOFF = 0.25  # after a wrong answer, its ramp's threshold <= this x its score


class ExitGuard:
    """Threshold caps of the ramps that answered wrongly since the config was applied."""

    def __init__(self, backoff: float) -> None:
        if not 0.0 <= backoff <= 1.0:
            raise ValueError(f"the exit guard's backoff must be in [0, 1], got {backoff}")
        self.backoff = float(backoff)
        self.caps: dict[int, float] = {}
        self.engaged = 0  # caps set or lowered since this guard was made

    def clear(self) -> None:
        """A new exit config applies: it supersedes every cap."""
        self.caps.clear()

    def thresholds(self, thresholds: Mapping[int, float]) -> dict[int, float]:
        """The thresholds to serve: the config's, capped where a ramp answered wrongly."""
        return {r: min(t, self.caps[r]) if r in self.caps else t for r, t in thresholds.items()}

    def observe(self, ramp_ids: Sequence[int], ramp_pred: np.ndarray, ramp_score: np.ndarray,
                exit_at: np.ndarray, final_pred: np.ndarray) -> dict[int, float]:
        """One finished run: ``exit_at`` per sample is the ramp that answered it (-1: the
        final model); ``ramp_pred``/``ramp_score`` are R x N over ``ramp_ids``. Returns the
        caps this run set or lowered (ramp -> cap)."""
        new: dict[int, float] = {}
        rows = {int(r): k for k, r in enumerate(ramp_ids)}
        for j in np.flatnonzero(np.asarray(exit_at) >= 0):
            ramp = int(exit_at[j])
            k = rows.get(ramp)
            if k is None or ramp_pred[k, j] == final_pred[j]:
                continue
            cap = self.backoff * float(ramp_score[k, j])
            if cap < min(self.caps.get(ramp, np.inf), new.get(ramp, np.inf)):
                new[ramp] = cap
        self.caps.update(new)
        self.engaged += len(new)
        return new

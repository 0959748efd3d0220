"""Coalescing of per-batch sample telemetry (pure; no clocks: the caller passes times).

At light load every batch holds one sample, and one telemetry message per request would
cost a JetStream write plus monitor and tuner work per request, all competing with
serving for the same cores. Batches that share a config (version and evaluated ramps) are
merged into one message of up to ``max_samples`` samples, or whatever is there after
``max_age_s``; the merged message is a :class:`SampleTelemetry` like a single batch's, so
consumers need not care (``batch_ids``/``batch_sizes``/``stage_ms`` list the merged batches).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from schemas.telemetry import SampleTelemetry


def merge(parts: list[SampleTelemetry]) -> SampleTelemetry:
    """One message for consecutive parts run under the same config, samples in order."""
    if len(parts) == 1:
        return parts[0]
    first, last = parts[0], parts[-1]
    return dataclasses.replace(
        first, batch_id=last.batch_id, batch_ids=[b for p in parts for b in p.batch_ids],
        batch_sizes=[s for p in parts for s in p.batch_sizes],
        ids=[i for p in parts for i in p.ids],
        ramp_pred=np.concatenate([p.ramp_pred for p in parts], axis=1),
        ramp_score=np.concatenate([p.ramp_score for p in parts], axis=1),
        exit_at=np.concatenate([p.exit_at for p in parts]),
        final_pred=np.concatenate([p.final_pred for p in parts]),
        final_score=np.concatenate([p.final_score for p in parts]),
        batch_size=sum(p.batch_size for p in parts),
        stage_ms=[run for p in parts for run in p.stage_ms], t=last.t)


class TelemetryBuffer:
    def __init__(self, max_samples: int = 64, max_age_s: float = 0.05) -> None:
        self.max_samples = max_samples
        self.max_age_s = max_age_s
        self.parts: list[SampleTelemetry] = []
        self.first_t = 0.0
        self.key: tuple = ()
        self.samples = 0

    @staticmethod
    def _key(part: SampleTelemetry) -> tuple:
        # A config version names one config (thresholds, active set, mode, score).
        return (part.model, part.worker, part.config_version, part.mode, part.score,
                tuple(part.ramp_ids))

    def add(self, part: SampleTelemetry, now: float) -> list[SampleTelemetry]:
        """Buffer one batch's telemetry; return the messages now due (in order)."""
        out = []
        key = self._key(part)
        if self.parts and key != self.key:
            out.append(self.take())
        if not self.parts:
            self.first_t = now
            self.key = key
        self.parts.append(part)
        self.samples += len(part.ids)
        if self.samples >= self.max_samples:
            out.append(self.take())
        return out

    def due(self, now: float) -> SampleTelemetry | None:
        """The buffered message once its oldest part has waited ``max_age_s``."""
        if self.parts and now - self.first_t >= self.max_age_s:
            return self.take()
        return None

    def take(self) -> SampleTelemetry:
        parts, self.parts, self.samples = self.parts, [], 0
        return merge(parts)

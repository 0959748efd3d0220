"""Coalescing of per-batch sample telemetry (pure; no clocks: the caller passes times).

At light load every batch holds one sample, and one telemetry message per request would
cost a JetStream write plus monitor and tuner work per request, all competing with
serving for the same cores. Batches that share a config (version and evaluated ramps) are
merged into one message of up to ``max_samples`` samples, or whatever is there after
``max_age_s``; the merged message has the same fields as a single batch's, so consumers
need not care (``batch_ids``/``batch_sizes``/``stage_ms`` list the merged batches).
"""

from __future__ import annotations

from typing import Any

import numpy as np

_SAME = ("model", "worker", "config_version", "mode", "score", "thresholds", "active")
_SAMPLES = ("exit_at", "final_pred", "final_score")


class TelemetryBuffer:
    def __init__(self, max_samples: int = 64, max_age_s: float = 0.05) -> None:
        self.max_samples = max_samples
        self.max_age_s = max_age_s
        self.parts: list[dict[str, Any]] = []
        self.first_t = 0.0
        self.key: tuple = ()
        self.samples = 0

    @staticmethod
    def _key(part: dict[str, Any]) -> tuple:
        # A config version names one config (thresholds, active set, mode, score).
        return (part["model"], part["worker"], part["config_version"], part["mode"],
                part["score"], tuple(part["ramp_ids"]))

    def add(self, part: dict[str, Any], now: float) -> list[dict[str, Any]]:
        """Buffer one batch's telemetry; return the messages now due (in order)."""
        out = []
        key = self._key(part)
        if self.parts and key != self.key:
            out.append(self.take())
        if not self.parts:
            self.first_t = now
            self.key = key
        self.parts.append(part)
        self.samples += len(part["ids"])
        if self.samples >= self.max_samples:
            out.append(self.take())
        return out

    def due(self, now: float) -> dict[str, Any] | None:
        """The buffered message once its oldest part has waited ``max_age_s``."""
        if self.parts and now - self.first_t >= self.max_age_s:
            return self.take()
        return None

    def take(self) -> dict[str, Any]:
        parts, self.parts, self.samples = self.parts, [], 0
        if len(parts) == 1:
            one = dict(parts[0])
            one["batch_ids"], one["batch_sizes"] = [one["batch_id"]], [one["batch_size"]]
            one["stage_ms"] = [one["stage_ms"]]
            return one
        msg = {k: parts[0][k] for k in _SAME}
        msg["ramp_ids"] = list(parts[0]["ramp_ids"])
        msg["ids"] = [i for p in parts for i in p["ids"]]
        for k in _SAMPLES:
            msg[k] = np.concatenate([np.asarray(p[k]) for p in parts])
        for k in ("ramp_pred", "ramp_score"):
            msg[k] = np.concatenate([np.asarray(p[k]) for p in parts], axis=1)
        msg["batch_id"] = parts[-1]["batch_id"]
        msg["batch_ids"] = [p["batch_id"] for p in parts]
        msg["batch_sizes"] = [p["batch_size"] for p in parts]
        msg["batch_size"] = sum(msg["batch_sizes"])
        msg["stage_ms"] = [p["stage_ms"] for p in parts]
        msg["t"] = parts[-1]["t"]
        return msg

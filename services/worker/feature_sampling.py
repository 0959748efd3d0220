"""Which samples' ramp features a worker publishes (pure): a share ``rate`` of samples,
chosen by a hash of the request id (the same request is sampled on every worker and in
every retry), at most ``max_per_s`` per second (a token bucket), so feature feedback
never grows with load beyond what the tuner's refits use."""

from __future__ import annotations

import zlib

import numpy as np


class FeatureSampler:
    def __init__(self, rate: float, max_per_s: float, salt: int = 0) -> None:
        if not 0.0 <= rate <= 1.0 or max_per_s < 0:
            raise ValueError("rate must be in [0, 1] and max_per_s >= 0")
        self.rate, self.max_per_s = rate, max_per_s
        self.cut = int(rate * 2**32)          # a hash below this is sampled
        self.salt = salt.to_bytes(4, "little")
        self.tokens = max(1.0, max_per_s)     # one second's worth to start with
        self.last: float | None = None
        self.dropped = 0                      # sampled but over the rate limit

    @property
    def enabled(self) -> bool:
        return self.rate > 0 and self.max_per_s > 0

    def rows(self, ids: list[str], now: float) -> np.ndarray:
        """Indices of the rows of a batch (request ``ids``) to publish at time ``now`` (s)."""
        if not self.enabled:
            return np.zeros(0, np.int64)
        if self.last is not None:
            self.tokens = min(max(1.0, self.max_per_s),
                              self.tokens + (now - self.last) * self.max_per_s)
        self.last = now
        picked = [i for i, rid in enumerate(ids)
                  if zlib.crc32(self.salt + rid.encode()) < self.cut]
        room = int(self.tokens)
        if len(picked) > room:
            self.dropped += len(picked) - room
            picked = picked[:room]
        self.tokens -= len(picked)
        return np.asarray(picked, np.int64)

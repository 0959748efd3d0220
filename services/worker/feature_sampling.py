"""Which samples' ramp features a worker publishes (pure): every sample of a share ``rate``
of batches, chosen by a hash of the batch id, at most ``max_per_s`` samples per second (a
token bucket). Batches, not samples: a batch computes the feature outputs for all its rows
or for none (about 6 % of EfficientNet's stage), so the cost stays at ``rate`` of that
whatever the batch size, and feedback never grows with load beyond what refits use."""

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

    def rows(self, batch_id: str, n: int, now: float) -> np.ndarray:
        """Indices of the rows of a batch (``batch_id``, ``n`` rows) to publish at time
        ``now`` (s)."""
        if not self.enabled:
            return np.zeros(0, np.int64)
        if self.last is not None:
            self.tokens = min(max(1.0, self.max_per_s),
                              self.tokens + (now - self.last) * self.max_per_s)
        self.last = now
        if zlib.crc32(self.salt + batch_id.encode()) >= self.cut:
            return np.zeros(0, np.int64)
        picked = list(range(n))
        room = int(self.tokens)
        if len(picked) > room:
            self.dropped += len(picked) - room
            picked = picked[:room]
        self.tokens -= len(picked)
        return np.asarray(picked, np.int64)

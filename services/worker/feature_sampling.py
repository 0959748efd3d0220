"""Which samples' ramp features a worker publishes (pure): every sample of a share of
batches, chosen by a hash of the batch id, at most ``max_per_s`` samples per second (a
token bucket). Batches, not samples: a batch computes the feature outputs for all its rows
or for none (about 6 % of EfficientNet's stage), so the cost stays at the share of that
whatever the batch size, and feedback never grows with load beyond what refits use.

``rate`` is a budget, the long-run share of samples. Features pay most where the ramps
serve worst: a scene no head knows exits nothing until refits have learned it, and the first
refit waits for ``min_samples`` of it. So with ``boost`` > 1, while fewer than half of the
recent rows exited early (:meth:`FeatureSampler.exited`), batches are sampled at ``boost``
times the rate, and while most exit at ``1 / boost`` of it (a rate of 1 samples every
batch). A credit keeps the budget: it grows by ``rate`` per row served and shrinks by every
sampled row, starts at :data:`START_CREDIT` and holds at most :data:`MAX_CREDIT`; a batch is
judged at the boosted share only when the credit covers it, else at the rate, so the
long-run share stays the rate and a batch of any size can be sampled. ``boost`` = 1
samples at the rate throughout.
"""

from __future__ import annotations

import zlib

import numpy as np

START_CREDIT = 128.0  # rows: a refit's first round (RefitConfig.min_samples) at once
MAX_CREDIT = 512.0    # rows a quiet spell may bank for the next scene
EXIT_LEVEL = 0.5      # the share of recent rows exiting early below which features boost
RECENT_ROWS = 64      # time constant of that share (rows)


class FeatureSampler:
    def __init__(self, rate: float, max_per_s: float, salt: int = 0,
                 boost: float = 1.0) -> None:
        if not 0.0 <= rate <= 1.0 or max_per_s < 0:
            raise ValueError("rate must be in [0, 1] and max_per_s >= 0")
        if boost < 1.0:
            raise ValueError(f"boost must be >= 1, got {boost}")
        self.rate, self.max_per_s, self.boost = rate, max_per_s, boost
        self.salt = salt.to_bytes(4, "little")
        self.tokens = max(1.0, max_per_s)     # one second's worth to start with
        self.last: float | None = None
        self.dropped = 0                      # sampled but over the rate limit
        self.credit = START_CREDIT
        self.exit_share = 0.0                 # of recent rows, answered at a ramp

    @property
    def enabled(self) -> bool:
        return self.rate > 0 and self.max_per_s > 0

    @property
    def share_now(self) -> float:
        """The share of batches sampled at this moment."""
        if self.boost == 1.0 or self.rate >= 1.0:  # every batch leaves nothing to bank
            return self.rate
        factor = self.boost if self.exit_share < EXIT_LEVEL else 1.0 / self.boost
        return min(1.0, self.rate * factor)

    def exited(self, rows: int, early: int) -> None:
        """A served batch of ``rows`` rows, ``early`` of them answered at a ramp."""
        if rows > 0:
            keep = (1.0 - 1.0 / RECENT_ROWS) ** rows
            self.exit_share = keep * self.exit_share + (1.0 - keep) * early / rows

    def rows(self, batch_id: str, n: int, now: float) -> np.ndarray:
        """Indices of the rows of a batch (``batch_id``, ``n`` rows) to publish at time
        ``now`` (s)."""
        if not self.enabled:
            return np.zeros(0, np.int64)
        if self.last is not None:
            self.tokens = min(max(1.0, self.max_per_s),
                              self.tokens + (now - self.last) * self.max_per_s)
        self.last = now
        self.credit = min(MAX_CREDIT, self.credit + self.rate * n)
        share = self.share_now
        if share > self.rate and self.credit < n:  # a boost spends only banked credit
            share = self.rate
        if zlib.crc32(self.salt + batch_id.encode()) >= int(share * 2**32):
            return np.zeros(0, np.int64)
        picked = list(range(n))
        room = int(self.tokens)
        if len(picked) > room:
            self.dropped += len(picked) - room
            picked = picked[:room]
        self.tokens -= len(picked)
        self.credit -= len(picked)
        return np.asarray(picked, np.int64)

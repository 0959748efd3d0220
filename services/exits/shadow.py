"""Which exited samples keep running to the final layer as shadow work in compute mode
(pure). Shadow samples are the compute-mode feedback: their final-model answers are what
the monitor's agreement and the tuner's alerts rest on once exits leave the batch.

The choice is a seeded hash of the request id, not a random draw: every worker and every
replay picks the same samples (a sample re-run after a worker loss stays shadow or not),
and no coordination is needed. BLAKE2b rather than the CRC the feature sampler uses for
batch ids: request ids are client-chosen and often sequential (``job-1``, ``job-2``, ...),
and a CRC's linearity would make its low-rate picks depend on that pattern."""

from __future__ import annotations

import hashlib

import numpy as np

SCALE = 2**64


class ShadowSampler:
    def __init__(self, rate: float, seed: int = 0) -> None:
        if not 0.0 <= rate <= 1.0:
            raise ValueError(f"shadow rate must be in [0, 1], got {rate}")
        self.rate = rate
        self.cut = int(rate * SCALE)          # a hash below this is shadow
        self.key = seed.to_bytes(8, "little", signed=False)

    def picks(self, request_id: str) -> bool:
        if self.cut <= 0:
            return False
        if self.cut >= SCALE:
            return True
        digest = hashlib.blake2b(request_id.encode(), digest_size=8, key=self.key).digest()
        return int.from_bytes(digest, "little") < self.cut

    def selected(self, request_ids: list[str]) -> np.ndarray:
        """Boolean mask over a batch: the samples in the feedback sample, exited or not.
        An exited one runs on as shadow work; all of them are what compute-mode telemetry
        reports, an unbiased sample of the stream with every record complete."""
        return np.fromiter((self.picks(r) for r in request_ids), dtype=bool,
                           count=len(request_ids))

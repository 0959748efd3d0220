"""The router's table of variants (SuperServe §4.2, offline phase): for each variant a
model offers (a supernet's subnet, or an early-exit model's depth cap), its accuracy and
its latency per batch size on one device class.

Latency is measured at a few batch sizes and interpolated linearly in between (batch time
is close to affine in the batch on one device). ``pareto`` keeps the variants no other
variant beats on both accuracy and latency, the set SlackFit decides over.

Pure: numpy only, no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class VariantProfile:
    key: str                      # what the batch message carries (subnet key, depth cap)
    accuracy: float               # agreement with the full model, or labelled accuracy
    batches: tuple[int, ...]      # measured batch sizes, ascending
    latency_ms: tuple[float, ...]  # batch time at each measured size

    def __post_init__(self) -> None:
        if not self.batches or len(self.batches) != len(self.latency_ms):
            raise ValueError(f"variant {self.key}: one latency per measured batch size")
        if list(self.batches) != sorted(set(self.batches)) or self.batches[0] < 1:
            raise ValueError(f"variant {self.key}: batch sizes must be distinct, ascending "
                             f"and >= 1, got {self.batches}")
        if not all(np.isfinite(self.latency_ms)) or min(self.latency_ms) <= 0:
            raise ValueError(f"variant {self.key}: latencies must be positive, got "
                             f"{self.latency_ms}")

    @property
    def max_batch(self) -> int:
        return self.batches[-1]

    def latency(self, batch: int) -> float:
        """Batch time at ``batch`` (interpolated; the largest measured size's time per
        sample, times ``batch``, beyond it)."""
        if batch > self.batches[-1]:
            return self.latency_ms[-1] * batch / self.batches[-1]
        return float(np.interp(batch, self.batches, self.latency_ms))

    def curve(self, max_batch: int) -> np.ndarray:
        """Latency at batch sizes 1..max_batch (index b-1)."""
        return np.array([self.latency(b) for b in range(1, max_batch + 1)])


def pareto(variants: Iterable[VariantProfile], batch: int = 1) -> list[VariantProfile]:
    """The variants on the accuracy/latency frontier at ``batch``, fastest first: each is
    strictly more accurate than every faster one (a slower variant that is no more
    accurate than a faster one is never worth serving)."""
    best: list[VariantProfile] = []
    for v in sorted(variants, key=lambda v: (v.latency(batch), -v.accuracy)):
        if not best or v.accuracy > best[-1].accuracy:
            best.append(v)
    return best


@dataclass(frozen=True, slots=True)
class Choice:
    variant: str
    batch: int
    latency_ms: float
    accuracy: float


def choices(variants: Sequence[VariantProfile], max_batch: int) -> list[Choice]:
    """Every (variant, batch) control tuple up to ``max_batch``."""
    return [Choice(v.key, b, v.latency(b), v.accuracy)
            for v in variants for b in range(1, max_batch + 1)]

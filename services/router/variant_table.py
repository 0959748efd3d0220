"""The router's table of variants (SuperServe §4.2, offline phase): for each variant a
model offers (a supernet's subnet, or an early-exit model's depth cap), its accuracy and
its latency per batch size on one device class.

Latency is measured at a few batch sizes and interpolated linearly in between (batch time
is close to affine in the batch on one device); a larger batch never runs faster than a
smaller one: a measured dip is noise and is read as flat. ``pareto`` keeps the variants no
other variant beats on accuracy at no more latency at any batch size, the set SlackFit
decides over.

Pure: numpy only, no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property

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

    @classmethod
    def from_table(cls, key: str, accuracy: float,
                   latency_ms: Mapping[int | str, float]) -> VariantProfile:
        """A variant from its ``{batch: ms}`` table (keys may be JSON strings)."""
        table = sorted((int(b), float(ms)) for b, ms in latency_ms.items())
        return cls(key, float(accuracy), tuple(b for b, _ in table),
                   tuple(ms for _, ms in table))

    @property
    def max_batch(self) -> int:
        return self.batches[-1]

    @cached_property
    def rising(self) -> np.ndarray:
        """The measured latencies, each at least the one before (dips read as flat)."""
        return np.maximum.accumulate(np.asarray(self.latency_ms, dtype=np.float64))

    @cached_property
    def _per_batch(self) -> list[float]:
        """Latency at batch 0..largest measured (index b; 0 is unused), computed once: the
        router asks for it on every decision."""
        sizes = np.arange(0, self.batches[-1] + 1)
        return [float(x) for x in np.interp(sizes, self.batches, self.rising)]

    def latency(self, batch: int) -> float:
        """Batch time at ``batch`` (interpolated; the largest measured size's time per
        sample, times ``batch``, beyond it)."""
        if batch > self.batches[-1]:
            return float(self.rising[-1] * batch / self.batches[-1])
        return self._per_batch[max(1, batch)]

    @cached_property
    def _curves(self) -> dict[int, list[float]]:
        return {}

    def latencies(self, max_batch: int) -> list[float]:
        """Latency at batch sizes 1..max_batch (index b-1), computed once per size."""
        c = self._curves.get(max_batch)
        if c is None:
            c = self._curves[max_batch] = [self.latency(b) for b in range(1, max_batch + 1)]
        return c

    def curve(self, max_batch: int) -> np.ndarray:
        """``latencies`` as an array."""
        return np.array(self.latencies(max_batch))


def dominates(a: VariantProfile, b: VariantProfile, max_batch: int) -> bool:
    """``a`` is at least as accurate as ``b`` and no slower at any batch up to
    ``max_batch``, and better on one of the two somewhere."""
    ca, cb = a.curve(max_batch), b.curve(max_batch)
    return (a.accuracy >= b.accuracy and bool(np.all(ca <= cb))
            and (a.accuracy > b.accuracy or bool(np.any(ca < cb))))


def pareto(variants: Iterable[VariantProfile], max_batch: int = 16) -> list[VariantProfile]:
    """The variants no other dominates (see ``dominates``), fastest at batch 1 first: a
    variant another beats on accuracy at no more latency at every batch is never worth
    serving. Of identical profiles the first is kept."""
    vs = list(variants)
    keep = [v for i, v in enumerate(vs)
            if not any(dominates(w, v, max_batch) or (j < i and _same(w, v, max_batch))
                       for j, w in enumerate(vs) if j != i)]
    return sorted(keep, key=lambda v: (v.latency(1), -v.accuracy))


def _same(a: VariantProfile, b: VariantProfile, max_batch: int) -> bool:
    return a.accuracy == b.accuracy and bool(np.all(a.curve(max_batch) == b.curve(max_batch)))


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

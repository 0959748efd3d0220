"""The one-time latency profile of a model (Apparate §3.3): what reaching each ramp site
costs, what each active ramp adds, and the full model's latency savings are measured against."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np


def isotonic(values: Sequence[float]) -> np.ndarray:
    """The non-decreasing sequence closest to ``values`` in squared error (pool adjacent
    violators): a run that breaks the order is replaced by its mean. Prefix latencies
    are timed one by one, so one slow spell can put a site after a later one; a running
    maximum would then drag every later site up to the outlier (MiniLM once: ramps 5-8
    all priced at ramp 5's 7.83 ms where the next read 5.34), the pooled mean moves them
    least."""
    blocks: list[list[float]] = []  # [mean, count]
    for v in values:
        blocks.append([float(v), 1.0])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            (m2, c2), (m1, c1) = blocks.pop(), blocks.pop()
            blocks.append([(m1 * c1 + m2 * c2) / (c1 + c2), c1 + c2])
    return np.array([m for m, c in blocks for _ in range(int(c))], dtype=np.float64)


@dataclass(frozen=True, eq=False)
class LatencyProfile:
    """One-time latency profile of a model with S candidate ramp sites (§3.3 bootstrapping).

    ``prefix_ms[s]`` is the latency from the input to site ``s`` without any ramp;
    ``prefix_ms[S]`` is the full model. ``ramp_cost_ms[s]`` is the latency the ramp at site
    ``s`` adds to every sample that reaches it (ramps sit on the critical path).
    """

    prefix_ms: np.ndarray
    ramp_cost_ms: np.ndarray

    def __post_init__(self) -> None:
        prefix = np.array(self.prefix_ms, dtype=np.float64)
        cost = np.array(self.ramp_cost_ms, dtype=np.float64)
        if prefix.ndim != 1 or prefix.size < 1:
            raise ValueError("prefix_ms must be a 1-D sequence: one entry per site plus the full model")
        if cost.ndim != 1 or cost.size != prefix.size - 1:
            raise ValueError(f"ramp_cost_ms needs {prefix.size - 1} entries (one per site), "
                             f"got shape {cost.shape}")
        if not (np.all(np.isfinite(prefix)) and np.all(np.isfinite(cost))):
            raise ValueError("latency profile entries must be finite")
        if np.any(prefix < 0) or np.any(cost < 0):
            raise ValueError("latencies must be non-negative")
        if np.any(np.diff(prefix) < 0):
            raise ValueError("prefix_ms must be non-decreasing (a later site is never reached sooner)")
        if prefix[-1] <= 0:
            raise ValueError("full-model latency prefix_ms[-1] must be positive")
        prefix.flags.writeable = False
        cost.flags.writeable = False
        object.__setattr__(self, "prefix_ms", prefix)
        object.__setattr__(self, "ramp_cost_ms", cost)

    @property
    def n_sites(self) -> int:
        return int(self.ramp_cost_ms.size)

    @property
    def full_ms(self) -> float:
        """Latency of the vanilla model (no ramps): the baseline savings are measured against."""
        return float(self.prefix_ms[-1])

    @classmethod
    def build(cls, prefix_ms: Sequence[float], ramp_cost_ms: Sequence[float]) -> LatencyProfile:
        return cls(np.asarray(prefix_ms, dtype=np.float64), np.asarray(ramp_cost_ms, dtype=np.float64))

    @classmethod
    def from_blocks(cls, block_ms: Sequence[float], after_block: Sequence[int],
                    ramp_cost_ms: Sequence[float]) -> LatencyProfile:
        """From a model manifest: per-block latencies and, per site, the block a ramp follows."""
        blocks = np.asarray(block_ms, dtype=np.float64)
        after = np.asarray(after_block, dtype=np.int64)
        if blocks.ndim != 1 or blocks.size == 0:
            raise ValueError("block_ms must be a non-empty 1-D sequence")
        if after.ndim != 1 or np.any(after < 0) or np.any(after >= blocks.size):
            raise ValueError(f"after_block entries must lie in [0, {blocks.size - 1}]")
        cum = np.cumsum(blocks)
        return cls.build(np.append(cum[after], cum[-1]), ramp_cost_ms)

    @classmethod
    def from_manifest(cls, manifest: Any) -> LatencyProfile:
        """What a worker pays, ramps in index order (sites follow the model): prefix = the
        merged block range up to each site, full = the unsplit range, ramp cost = activating
        the ramp (the stage splits there, and its head runs fused), all measured by
        ``offramp prepare``. A ramp's serving cost is several times its head's: ONNX Runtime
        pays per call and converts the activation's layout at both ends of a split.
        Manifests prepared before those were measured fall back to summed block costs and
        head costs."""
        ramps = sorted(manifest.ramps, key=lambda r: r.index)
        full = float(manifest.meta.get("range_ms") or 0.0)
        if full > 0 and all(r.prefix_ms > 0 and r.serve_ms > 0 for r in ramps):
            # separate timings: keep the order the model imposes, at least disturbance
            prefix = np.minimum(isotonic([r.prefix_ms for r in ramps]), full)
            return cls.build([*prefix, full], [r.serve_ms for r in ramps])
        return cls.from_blocks([b.cost_ms for b in manifest.blocks],
                               [r.after_block for r in ramps], [r.cost_ms for r in ramps])

    def check_sites(self, ramp_ids: Sequence[int]) -> None:
        """Raise if any ramp id is not a site of this profile."""
        bad = [r for r in ramp_ids if not 0 <= r < self.n_sites]
        if bad:
            raise ValueError(f"ramp ids {bad} outside the profile's {self.n_sites} sites")

    def cost_of(self, ramp_ids: Sequence[int]) -> float:
        """Worst-case latency a set of active ramps adds (a sample that never exits pays all)."""
        return float(self.ramp_cost_ms[list(ramp_ids)].sum()) if len(ramp_ids) else 0.0

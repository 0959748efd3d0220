"""Inputs of the tuner's policy code (pure): a recorded feedback window and a latency profile.

Apparate §3.2 records, for every sample and every *active* ramp, the ramp's top-1 and its
exit score, whatever the deployed thresholds were (inputs always run to the end), plus the
final model's top-1. That is enough to replay any threshold vector without new inference.
Scores follow ``services.models.scores``: lower = more confident, a sample exits when
``score < threshold`` strictly, so a threshold of 0 never exits.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

import numpy as np

from services.models.scores import exit_score

ScoreFn = Callable[[np.ndarray], np.ndarray]


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


@dataclass(frozen=True, eq=False)
class ExitWindow:
    """Feedback for N samples over R active ramps (candidate-site indices, ascending)."""

    ramp_ids: tuple[int, ...]
    pred: np.ndarray   # R x N int: each active ramp's top-1
    score: np.ndarray  # R x N float: exit score (lower = more confident, >= 0)
    final: np.ndarray  # N int: the final model's top-1

    def __post_init__(self) -> None:
        ids = tuple(int(r) for r in self.ramp_ids)
        if any(r < 0 for r in ids) or any(b <= a for a, b in pairwise(ids)):
            raise ValueError(f"ramp_ids must be non-negative and strictly ascending, got {ids}")
        final = np.asarray(self.final)
        if final.ndim != 1 or final.size == 0:
            raise ValueError("final must be a non-empty 1-D array of labels")
        n, r = final.size, len(ids)
        pred = np.asarray(self.pred)
        score = np.asarray(self.score, dtype=np.float64)
        if pred.shape != (r, n) or score.shape != (r, n):
            raise ValueError(f"pred and score must be {r}x{n} (ramps x samples), got "
                             f"{np.shape(self.pred)} and {score.shape}")
        if not ((pred.size == 0 or np.issubdtype(pred.dtype, np.integer))
                and np.issubdtype(final.dtype, np.integer)):
            raise ValueError("pred and final must hold integer labels")
        if not np.all(np.isfinite(score)) or np.any(score < 0):
            raise ValueError("scores must be finite and >= 0 (threshold 0 must mean 'never exits')")
        pred = pred.astype(np.int64)
        final = final.astype(np.int64)
        for a in (pred, score, final):
            a.flags.writeable = False
        object.__setattr__(self, "ramp_ids", ids)
        object.__setattr__(self, "pred", pred)
        object.__setattr__(self, "score", score)
        object.__setattr__(self, "final", final)

    @classmethod
    def unchecked(cls, ramp_ids: tuple[int, ...], pred: np.ndarray, score: np.ndarray,
                 final: np.ndarray) -> ExitWindow:
        """A window cut or joined from validated windows: skips the checks (the tuner
        builds one per decision, and validation was a sizeable share of a 0.5 ms round)."""
        w = object.__new__(cls)
        for name, a in (("pred", pred), ("score", score), ("final", final)):
            a.flags.writeable = False
            object.__setattr__(w, name, a)
        object.__setattr__(w, "ramp_ids", ramp_ids)
        return w

    @property
    def n_ramps(self) -> int:
        return len(self.ramp_ids)

    @property
    def n_samples(self) -> int:
        return int(self.final.size)

    @classmethod
    def build(cls, ramp_ids: Sequence[int], pred: np.ndarray | Sequence[Sequence[int]],
              score: np.ndarray | Sequence[Sequence[float]],
              final: np.ndarray | Sequence[int]) -> ExitWindow:
        return cls(tuple(ramp_ids), np.asarray(pred), np.asarray(score), np.asarray(final))

    @classmethod
    def from_logits(cls, ramp_ids: Sequence[int], ramp_logits: Sequence[np.ndarray],
                    final: np.ndarray, score: str | ScoreFn = "max_softmax") -> ExitWindow:
        """From per-ramp N x classes logits; ``score`` is a kind of ``exit_score`` or any function
        of logits returning lower-is-more-confident scores (the exit score is pluggable)."""
        if len(ramp_logits) != len(ramp_ids):
            raise ValueError("need one logits array per ramp id")
        final = np.asarray(final)
        if final.ndim == 2:  # final logits given: take the top-1
            final = final.argmax(axis=1)
        fn: ScoreFn = (lambda z: exit_score(z, score)) if isinstance(score, str) else score
        n = final.size
        pred = np.empty((len(ramp_ids), n), dtype=np.int64)
        scores = np.empty((len(ramp_ids), n), dtype=np.float64)
        for row, logits in enumerate(ramp_logits):
            logits = np.asarray(logits)
            if logits.ndim != 2 or logits.shape[0] != n:
                raise ValueError(f"ramp {ramp_ids[row]} logits must be {n} x classes, got {logits.shape}")
            pred[row] = logits.argmax(axis=1)
            scores[row] = fn(logits)
        return cls(tuple(ramp_ids), pred, scores, final)

    @classmethod
    def concat(cls, windows: Sequence[ExitWindow]) -> ExitWindow:
        """Join consecutive windows recorded under the same active ramps."""
        if not windows:
            raise ValueError("nothing to concatenate")
        ids = windows[0].ramp_ids
        if any(w.ramp_ids != ids for w in windows):
            raise ValueError("windows over different active ramps cannot be joined")
        return cls.unchecked(ids, np.concatenate([w.pred for w in windows], axis=1),
                             np.concatenate([w.score for w in windows], axis=1),
                             np.concatenate([w.final for w in windows]))

    def select(self, ramp_ids: Sequence[int]) -> ExitWindow:
        """The same samples seen by a subset of the active ramps (what deactivation leaves)."""
        ids = tuple(sorted(int(r) for r in ramp_ids))
        missing = set(ids) - set(self.ramp_ids)
        if missing:
            raise ValueError(f"ramps {sorted(missing)} are not in this window")
        rows = [self.ramp_ids.index(r) for r in ids]
        return ExitWindow.unchecked(ids, self.pred[rows], self.score[rows], self.final)

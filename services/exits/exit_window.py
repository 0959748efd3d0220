"""A recorded feedback window: the input of the tuner's policy code (pure).

Apparate §3.2 records, for every sample and every *active* ramp, the ramp's top-1 and its
exit score, whatever the deployed thresholds were (inputs always run to the end), plus the
final model's top-1. That is enough to replay any threshold vector without new inference.
Scores follow ``services.exits.scores``: lower = more confident, a sample exits when
``score < threshold`` strictly, so a threshold of 0 never exits.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import pairwise

import numpy as np

from services.exits.scores import exit_score

ScoreFn = Callable[[np.ndarray], np.ndarray]


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

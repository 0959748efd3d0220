"""Exit decisions at a ramp (pure): which samples answer early under an exit config."""

from __future__ import annotations

import numpy as np

from schemas.messages import ExitConfig
from services.exits.scores import exit_score


def ramp_outcome(logits: np.ndarray, score_kind: str) -> tuple[np.ndarray, np.ndarray]:
    """Top-1 label and exit score (lower = more confident) for each row of ``logits``."""
    return logits.argmax(axis=1).astype(np.int32), exit_score(logits, score_kind).astype(np.float32)


def exits_at(ramp: int, scores: np.ndarray, exit_at: np.ndarray, config: ExitConfig) -> np.ndarray:
    """Boolean mask of samples that exit at ``ramp`` now: not exited yet and score below threshold.

    A threshold of 0 never exits (scores are >= 0), which is the initial deployment.
    """
    threshold = config.thresholds.get(ramp, 0.0)
    if threshold <= 0.0 or ramp not in config.active:
        return np.zeros(scores.shape[0], dtype=bool)
    return (exit_at < 0) & (scores < threshold)

"""Exit decisions at a ramp (pure): which samples answer early under an exit config."""

from __future__ import annotations

import numpy as np

from schemas.messages import ExitConfig
from services.models.scores import exit_score
from services.tuner.initial import DEFAULT_BUDGET, initial_active


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


def initial_config(model: str, ramp_ids: list[int]) -> ExitConfig:
    """Version 0 with ``ramp_ids`` active and nothing exiting (what a worker runs before any
    config exists); see ``services.tuner.initial`` for which ramps start active."""
    return ExitConfig(model=model, version=0, thresholds={r: 0.0 for r in ramp_ids},
                      active=list(ramp_ids))


def initial_ramps(manifest, budget: float = DEFAULT_BUDGET) -> list[int]:
    """The initial deployment's active ramps: evenly spaced within the ramp budget, costed
    as a worker pays them (``LatencyProfile.from_manifest``)."""
    from services.tuner.window import LatencyProfile

    prof = LatencyProfile.from_manifest(manifest)
    ids = sorted(r.index for r in manifest.ramps)
    return initial_active({r: float(prof.ramp_cost_ms[k]) for k, r in enumerate(ids)},
                          prof.full_ms, budget)

"""Exit scores from ramp logits. Pure numpy; LOWER score = MORE confident.

A sample exits at a ramp when its score is strictly below the ramp's threshold, so every
score kind is oriented the same way and thresholds stay comparable across kinds.
"""

from __future__ import annotations

import numpy as np

from schemas.messages import SCORE_KINDS  # the kinds an exit config may name

__all__ = ["SCORE_KINDS", "exit_score", "softmax"]


def softmax(logits: np.ndarray) -> np.ndarray:
    """Row-wise softmax over the last axis, stable for large logits."""
    z = np.asarray(logits, dtype=np.float32)
    z = z - z.max(axis=-1, keepdims=True)  # shift so exp never overflows
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True)


def softmax_top1(logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(labels int64[N], max_prob float32[N]) of N×classes logits."""
    p = softmax(logits)
    labels = p.argmax(axis=-1).astype(np.int64)
    return labels, np.take_along_axis(p, labels[..., None], axis=-1)[..., 0].astype(np.float32)


def exit_score(logits: np.ndarray, kind: str = "max_softmax") -> np.ndarray:
    """float32[N] exit scores in [0, 1]; lower means more confident.

    - ``max_softmax``: 1 - max softmax probability
    - ``entropy``: entropy of the softmax divided by log(classes)
    - ``margin``: 1 - (top1 - top2) of the softmax
    """
    p = softmax(logits)
    if kind == "max_softmax":
        s = 1.0 - p.max(axis=-1)
    elif kind == "entropy":
        k = p.shape[-1]
        # p*log(p) -> 0 as p -> 0; clip avoids log(0) without changing the sum.
        h = -(p * np.log(np.clip(p, 1e-30, None))).sum(axis=-1)
        s = h / np.log(k) if k > 1 else np.zeros_like(h)
    elif kind == "margin":
        if p.shape[-1] < 2:
            s = np.zeros(p.shape[:-1], dtype=np.float32)
        else:
            top2 = np.partition(p, -2, axis=-1)[..., -2:]
            s = 1.0 - (top2[..., 1] - top2[..., 0])
    else:
        raise ValueError(f"unknown score kind {kind!r}; known: {', '.join(SCORE_KINDS)}")
    return np.clip(s, 0.0, 1.0).astype(np.float32)

"""A ramp's head as numbers: the linear layer its pooled features feed (pure), shared by
the runtime that loads and saves heads, the tuner that refits them and the replay."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, eq=False)
class LinearHead:
    """``logits = features @ weight.T + bias`` on the ramp's pooled features."""

    weight: np.ndarray   # float32 classes x C
    bias: np.ndarray     # float32 classes
    pool: str = "gap"    # how the features were pooled (services.runtime.pooling.POOLS)

    def logits(self, features: np.ndarray) -> np.ndarray:
        return np.asarray(features, np.float32) @ self.weight.T + self.bias

"""How often a stream's full-model answer changes from one sample to the next.

A ramp may answer only where it agrees with the full model within the accuracy constraint,
so on a video stream it must follow every change of the full model's answer. Changes that
come from what the camera sees (a new scene, an object leaving the frame) a ramp can follow;
a full model whose answer flickers between two classes from frame to frame, on sensor noise,
leaves a shallow ramp nothing stable to match. Printed beside a stream's savings so a stream
that saves little says why (docs/benchmarks.md, the demo's streams).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class AnswerChanges:
    changes: int  # consecutive pairs whose answers differ
    pairs: int    # consecutive pairs in the stream

    @property
    def share(self) -> float:
        return self.changes / self.pairs if self.pairs else 0.0

    def describe(self) -> str:
        every = f", once every {self.pairs / self.changes:.1f}" if self.changes else ""
        return (f"the full model's answer changes between consecutive samples {self.changes} "
                f"times in {self.pairs} ({self.share:.1%}{every})")

    def to_dict(self) -> dict[str, float | int]:
        return {"changes": self.changes, "pairs": self.pairs, "share": self.share}

    @classmethod
    def from_dict(cls, d: dict) -> AnswerChanges:
        return cls(int(d["changes"]), int(d["pairs"]))


def answer_changes(answers: Sequence[int] | np.ndarray) -> AnswerChanges:
    """Count the consecutive pairs of ``answers`` (the full model's top-1 per sample, in
    stream order) that differ."""
    a = np.asarray(answers)
    if a.ndim != 1:
        raise ValueError(f"answers must be one label per sample, got shape {a.shape}")
    pairs = max(a.size - 1, 0)
    return AnswerChanges(int(np.count_nonzero(a[1:] != a[:-1])) if pairs else 0, pairs)

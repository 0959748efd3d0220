"""Workloads as timed streams: what each request carries, paired with when it arrives.

A benchmark, the simulator and the demo all need the same two things: a sequence of
inputs with temporal locality (video frames, text in topic runs) and arrival times.
:func:`make_stream` joins the generators in ``workloads`` / ``text_streams`` with an
arrival process from ``arrivals``, all derived from one seed. Video frames are rendered
lazily chunk by chunk, so a long stream costs the memory of one chunk.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from services.workloads import arrivals as arr
from services.workloads import text_corpus, text_streams
from services.workloads.frames import iter_video_frames

KINDS = ("video", "text")


@dataclass(frozen=True)
class VideoFrame:
    """One video request: a (3, size, size) frame (float32 normalised, or uint8 pixels)
    and its scene id."""

    index: int
    frame: np.ndarray
    scene: int


@dataclass(frozen=True, eq=False)
class Stream:
    """n items with arrival timestamps (seconds from the stream's start, sorted).

    ``source`` is either a sequence (text samples) or a factory returning a fresh
    iterator (lazy video frames), so a stream can be iterated more than once.
    """

    name: str
    kind: str
    seed: int
    arrival_s: np.ndarray
    source: Sequence[Any] | Callable[[], Iterator[Any]]
    meta: dict[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.arrival_s)

    def items(self) -> Iterator[Any]:
        """The items in stream order (a fresh iterator each call)."""
        return iter(self.source) if not callable(self.source) else self.source()

    def __iter__(self) -> Iterator[tuple[float, Any]]:
        """(arrival time in s, item) pairs."""
        yield from zip(self.arrival_s.tolist(), self.items())

    @property
    def duration_s(self) -> float:
        return float(self.arrival_s[-1]) if len(self.arrival_s) else 0.0

    @property
    def mean_rate(self) -> float:
        return len(self) / self.duration_s if self.duration_s > 0 else 0.0


def _video_source(n: int, seed: int, size: int, chunk: int, dtype: str
                  ) -> Callable[[], Iterator[VideoFrame]]:
    def frames() -> Iterator[VideoFrame]:
        i = 0
        for block, scenes in iter_video_frames(n, seed, size, chunk, dtype=dtype):
            for frame, scene in zip(block, scenes.tolist()):
                yield VideoFrame(i, frame, scene)
                i += 1

    return frames


def make_stream(
    kind: str,
    n: int,
    seed: int = 0,
    arrivals_spec: str | arr.ArrivalSpec = "poisson:100",
    *,
    size: int = 224,
    chunk: int = 64,
    corpus: Any = None,
    mean_run: float = 8.0,
    drift: float = 0.6,
    dtype: str = "float32",
) -> Stream:
    """A ``kind`` ("video" or "text") stream of n items arriving per ``arrivals_spec``.

    Items and arrival times use independent generators derived from ``seed``, so
    changing the arrival process leaves the inputs unchanged. Video frames come as
    ``dtype`` ("float32" normalised or "uint8" pixels). For text, ``corpus``
    defaults to :func:`text_corpus.load_corpus` (downloads Debian's fortunes once).
    """
    if kind not in KINDS:
        raise ValueError(f"unknown stream kind {kind!r}; expected one of {KINDS}")
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    spec = arr.parse_spec(arrivals_spec) if isinstance(arrivals_spec, str) else arrivals_spec
    times = arr.stream_arrivals(spec, n, seed)
    spec_text = arrivals_spec if isinstance(arrivals_spec, str) else repr(arrivals_spec)
    meta: dict[str, Any] = {"arrivals": spec_text, "n": n}
    source: Sequence[Any] | Callable[[], Iterator[Any]]
    if kind == "video":
        source = _video_source(n, seed, size, chunk, dtype)
        meta.update(size=size, dtype=dtype)
    else:
        corpus = corpus if corpus is not None else text_corpus.load_corpus()
        source = text_streams.text_stream(corpus, n, seed, mean_run=mean_run, drift=drift)
        meta.update(corpus=corpus.source, categories=list(corpus.categories),
                    mean_run=mean_run, drift=drift)
    return Stream(f"{kind}-{spec_text}-s{seed}", kind, seed, times, source, meta)

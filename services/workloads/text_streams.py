"""Text request streams with temporal locality and drift, deterministic from a seed.

Early exits pay off on streams where nearby requests look alike and thresholds tuned on
the recent past still hold (the paper's traffic videos); a shuffled corpus has neither.
A text stream therefore comes in *runs* of one category (geometric lengths with mean
``mean_run``, each run switching to a different category, like a scene cut), and the
category mix itself drifts: every category's share rises and falls once per ``period``
items, with its own phase, so the dominant topics change slowly over the stream.

The stream is drawn item by item from one generator and the mix depends on the item
index only, so any prefix of a longer stream equals the shorter stream for a seed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from services.workloads.text_corpus import TextCorpus

DRIFT_LOGIT = 3.0  # at drift=1 a category's weight swings by e^(±3): ~400× peak/trough


@dataclass(frozen=True)
class TextSample:
    """One request of a text stream."""

    index: int  # position in the stream
    text: str
    label: int  # index into the corpus's categories
    category: str
    corpus_index: int  # row of the corpus the text came from


def category_mix(
    n_categories: int, positions: np.ndarray, seed: int = 0, drift: float = 0.6,
    period: float = 2000.0,
) -> np.ndarray:
    """Category probabilities (len(positions), n_categories) at the given stream positions.

    Logit of category c at position t: ``drift · 3 · cos(2π (t/period − φ_c))`` with
    phases φ_c spread evenly (in a seeded random order), so at any time a few categories
    dominate and the dominant ones hand over to others as the stream goes on.
    """
    if n_categories < 1:
        raise ValueError("need at least one category")
    if not 0.0 <= drift <= 1.0:
        raise ValueError(f"drift must be in [0, 1], got {drift}")
    if period <= 0:
        raise ValueError(f"period must be > 0, got {period}")
    rng = np.random.default_rng((seed, 0x4D1C))
    phase = (rng.permutation(n_categories) + rng.random()) / n_categories
    t = np.asarray(positions, np.float64)[:, None]
    logits = drift * DRIFT_LOGIT * np.cos(2.0 * np.pi * (t / period - phase[None, :]))
    w = np.exp(logits - logits.max(axis=1, keepdims=True))
    return w / w.sum(axis=1, keepdims=True)


def text_stream(
    corpus: TextCorpus,
    n: int,
    seed: int = 0,
    mean_run: float = 8.0,
    drift: float = 0.6,
    period: float = 2000.0,
) -> list[TextSample]:
    """n samples of ``corpus`` in category runs whose mix drifts (see module doc).

    Within a category texts are drawn without replacement (a fresh seeded permutation
    each time the category is used up), so a text repeats only after its whole category
    has been seen. ``mean_run=1`` switches category at every item; ``drift=0`` keeps the
    mix uniform.
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if mean_run < 1:
        raise ValueError(f"mean_run must be >= 1, got {mean_run}")
    n_cat = len(corpus.categories)
    pools = [np.flatnonzero(corpus.labels == c) for c in range(n_cat)]
    live = np.array([len(p) > 0 for p in pools])
    if not live.any():
        raise ValueError("the corpus has no texts")
    rng = np.random.default_rng(seed)
    order: list[np.ndarray] = [np.zeros(0, np.int64)] * n_cat
    cursor = [0] * n_cat
    out: list[TextSample] = []
    prev = -1
    while len(out) < n:
        p = category_mix(n_cat, np.array([len(out)]), seed, drift, period)[0] * live
        if prev >= 0 and np.count_nonzero(p) > 1:
            p[prev] = 0.0  # a run boundary is a topic change, like a scene cut
        cdf = np.cumsum(p)
        cat = min(int(np.searchsorted(cdf, rng.random() * cdf[-1], side="right")), n_cat - 1)
        length = int(rng.geometric(1.0 / mean_run))
        for _ in range(min(length, n - len(out))):
            if cursor[cat] >= len(order[cat]):
                order[cat] = pools[cat][rng.permutation(len(pools[cat]))]
                cursor[cat] = 0
            row = int(order[cat][cursor[cat]])
            cursor[cat] += 1
            out.append(TextSample(len(out), corpus.texts[row], cat, corpus.categories[cat], row))
        prev = cat
    return out


def stream_labels(samples: list[TextSample]) -> np.ndarray:
    """int64 labels of a stream, e.g. to measure locality or per-window accuracy."""
    return np.fromiter((s.label for s in samples), np.int64, len(samples))

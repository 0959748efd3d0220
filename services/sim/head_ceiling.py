"""What learning could make of the ramps on a trace: every head refitted in hindsight.

The fixed ceiling (``fixed_ceiling.py``) bounds any threshold policy over the heads as they
were recorded; a target beyond it needs better heads. This module asks how much better a
linear head on the same pooled features gets from the stream itself, under conditions no
live learning loop has. Each site's head is refitted with the tuner's own fit
(``tuner.refit.refit``, warm-started from the prepared head) in one of two ways:

- :func:`causal`: an online learner ideal in labels and cadence. Every sample's label comes
  back ``delay`` samples late (live: a quarter of them, after about a tenth of a second), and
  every ``every`` samples the prepared head is refitted on the newest ``window`` labels, at
  no cost and with no judgement of the candidate (``offramp+refit``: a quarter of the
  labels, a round every 64 of them, each candidate judged first). It remembers nothing
  older than its window, so on a model whose ramps never trained it forgets every scene
  that has passed; there ``offramp+refit``, which keeps earlier heads, can do better.
- :func:`crossfit`: more than any online learner can know. Blocks of ``block`` consecutive
  samples alternate between two folds, and each fold is answered by the head fitted on the
  other: no sample by a head that learned it, but every one by a head that learned its
  neighbours on both sides and half of the rest of the stream, the future included.

The trace with those answers goes through the same fixed-config search, with thresholds
chosen in hindsight too. No clock and no I/O: a trace in, a trace out.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from services.exits.linear_head import LinearHead
from services.exits.scores import exit_score, softmax
from services.sim.trace import Trace, TraceError
from services.tuner.refit import RefitConfig, refit

BLOCK = 50  # samples per fold block: a few seconds of a stream, shorter than most scenes
# Longer and pulled harder to the prepared head than the online refit (40 steps, l2 1e-3):
# what ranked a head's answers best on the fixed-camera and default video traces
HINDSIGHT_FIT = RefitConfig(steps=100, l2=1e-2)
WINDOW, DELAY, EVERY = 256, 4, 8  # the ideal online learner's (see :func:`causal`)
MIN_LABELS = 16  # labels a causal head needs before it replaces the prepared one


def folds(n: int, block: int = BLOCK) -> np.ndarray:
    """Fold (0 or 1) of each of ``n`` samples: blocks of ``block`` alternate."""
    if block < 1:
        raise ValueError(f"a fold block needs >= 1 sample, got {block}")
    return (np.arange(n) // block) % 2


def hindsight_targets(trace: Trace) -> np.ndarray:
    """What the heads learn: the final softmax at the trace's soft temperature where the
    model's ramps learned it (and the logits were recorded), else the final top-1."""
    temperature = trace.meta.get("soft_temperature")
    logits = trace.features.final_logits if trace.features is not None else None
    if temperature is None or logits is None:
        return np.asarray(trace.final_pred, np.int64)
    return softmax(np.asarray(logits, np.float32) / float(temperature))


def _refitted(trace: Trace, fits: list[tuple[slice | np.ndarray, slice | np.ndarray]],
              cfg: RefitConfig) -> Trace:
    """``trace`` with each site answering the samples of every (fit on, answer) pair of
    ``fits`` by its prepared head refitted on the former."""
    f = trace.features
    if f is None:
        raise TraceError("refitted heads in hindsight need a trace recorded with --features")
    y = hindsight_targets(trace)
    kind = str(trace.meta.get("score", "max_softmax"))
    pred, score = trace.ramp_pred.copy(), trace.ramp_score.copy()
    for k, (x, w, b) in enumerate(zip(f.by_site, f.weight, f.bias, strict=True)):
        prepared = LinearHead(w, b)
        for fit_on, answer in fits:
            logits = refit(prepared, x[fit_on], y[fit_on], cfg).logits(x[answer])
            pred[k, answer] = logits.argmax(axis=1)
            score[k, answer] = exit_score(logits, kind)
    # a --no-bootstrap trace's untrained sites have learned now
    return dataclasses.replace(trace, ramp_pred=pred, ramp_score=score,
                               meta={**trace.meta, "trained": [True] * trace.n_sites})


def crossfit(trace: Trace, block: int = BLOCK, cfg: RefitConfig = HINDSIGHT_FIT) -> Trace:
    """``trace`` answered by cross-fitted heads (see module)."""
    fold = folds(trace.n_samples, block)
    if fold.min() == fold.max():
        raise TraceError(f"a cross-fit needs more than one block of {block} samples, the "
                         f"trace has {trace.n_samples}")
    return _refitted(trace, [(fold != held, fold == held) for held in (0, 1)], cfg)


def causal(trace: Trace, window: int = WINDOW, delay: int = DELAY, every: int = EVERY,
           cfg: RefitConfig = HINDSIGHT_FIT) -> Trace:
    """``trace`` answered by an ideal online learner's heads (see module): samples
    ``[s, s + every)`` by the prepared head refitted on samples ``[s - delay - window,
    s - delay)``; the first ones, before ``MIN_LABELS`` labels came back, by the prepared
    head as recorded."""
    if window < 1 or delay < 0 or every < 1:
        raise ValueError(f"need window >= 1, delay >= 0 and every >= 1, got {window}, "
                         f"{delay}, {every}")
    fits = []
    for start in range(0, trace.n_samples, every):
        stop = start - delay
        if stop >= MIN_LABELS:
            fits.append((slice(max(0, stop - window), stop), slice(start, start + every)))
    return _refitted(trace, fits, cfg)

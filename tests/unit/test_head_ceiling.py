"""Heads refitted in hindsight (services.sim.head_ceiling): the ideal online learner sees
only labels that came back, the cross-fit sees both sides of a sample but never the sample."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from services.exits.scores import exit_score
from services.sim import head_ceiling as hc
from services.sim.fixed_ceiling import best_fixed
from services.sim.trace import Trace, TraceError, TraceFeatures
from tests.unit.test_sim_refit_replay import shifted_trace

C = 8


def new_class_every(scene: int, n: int, seed: int = 0) -> Trace:
    """One ramp on a stream whose class changes every ``scene`` samples and never comes back;
    the features name the class plainly, the prepared head is untrained (zeros: it says class
    0, which no scene shows)."""
    rng = np.random.default_rng(seed)
    y = np.arange(n) // scene + 1
    k = int(y.max()) + 1
    centres = rng.normal(0, 3.0, (k, C))
    x = (centres[y] + rng.normal(0, 0.1, (n, C))).astype(np.float32)
    w, b = np.zeros((k, C), np.float32), np.zeros(k, np.float32)
    logits = x @ w.T + b
    return Trace(logits.argmax(1)[None], exit_score(logits).astype(np.float64)[None], y,
                 np.array([2.0, 10.0]), np.array([0.05]), None,
                 {"score": "max_softmax", "trained": [False]}, TraceFeatures([x], [w], [b]))


def test_folds_alternate_blocks() -> None:
    assert hc.folds(7, 2).tolist() == [0, 0, 1, 1, 0, 0, 1]
    assert hc.folds(3, 1).tolist() == [0, 1, 0]
    with pytest.raises(ValueError, match="block"):
        hc.folds(10, 0)


def test_the_online_learner_never_answers_with_a_label_that_has_not_come_back() -> None:
    tr = new_class_every(scene=8, n=400)
    # refits every 8 samples, at each scene's start: the labels back are all of past scenes
    ideal = hc.causal(tr, window=64, delay=0, every=8)
    assert ideal.agreement_by_site()[0] == 0.0
    # the same learner a little out of step with the scenes learns each from its own start
    late = hc.causal(tr, window=64, delay=0, every=4)
    assert late.agreement_by_site()[0] == pytest.approx(0.5, abs=0.03)
    # ... unless the labels come back later than the scene lasts
    assert hc.causal(tr, window=64, delay=8, every=4).agreement_by_site()[0] == 0.0
    # the cross-fit learns every scene from the other half of it
    assert hc.crossfit(tr, block=4).agreement_by_site()[0] >= 0.99
    assert ideal.meta["trained"] == [True]  # a cold ramp has learned now
    assert tr.meta["trained"] == [False] and (tr.ramp_pred == 0).all()  # the input is left as is


def test_refitted_heads_lift_the_fixed_ceiling_of_stale_heads() -> None:
    tr = shifted_trace()  # heads prepared on another stream; the features still separate
    before = tr.agreement_by_site()
    for refitted in (hc.causal(tr), hc.crossfit(tr)):
        after = refitted.agreement_by_site()
        assert all(a > b + 0.2 for a, b in zip(after, before, strict=True))
        sites = tuple(range(tr.n_sites))
        old = best_fixed(tr.window(sites), tr.profile(), 0.01, 1.0, "mean")
        new = best_fixed(refitted.window(sites), refitted.profile(), 0.01, 1.0, "mean")
        assert new.mean_ms < old.mean_ms - 1.0 and new.agreement >= 0.99
        # only the answers change: the stream, its latencies and its features stay
        assert (refitted.final_pred == tr.final_pred).all()
        assert refitted.features is tr.features and (refitted.prefix_ms == tr.prefix_ms).all()


def test_heads_learn_the_final_softmax_where_the_ramps_did() -> None:
    tr = shifted_trace()
    assert hc.hindsight_targets(tr).tolist() == tr.final_pred.tolist()
    k = tr.features.weight[0].shape[0]
    logits = np.eye(k, dtype=np.float32)[tr.final_pred] * 4.0
    soft = dataclasses.replace(
        tr, meta={**tr.meta, "soft_temperature": 2.0},
        features=dataclasses.replace(tr.features, final_logits=logits))
    y = hc.hindsight_targets(soft)
    assert y.shape == (tr.n_samples, k) and np.allclose(y.sum(axis=1), 1.0)
    assert y[0, tr.final_pred[0]] == pytest.approx(np.e ** 2 / (np.e ** 2 + k - 1), rel=1e-5)
    # no logits recorded: the top-1
    no_logits = dataclasses.replace(soft, features=tr.features)
    assert hc.hindsight_targets(no_logits).ndim == 1


def test_what_cannot_be_refitted_is_named() -> None:
    tr = shifted_trace()
    with pytest.raises(TraceError, match="--features"):
        hc.causal(dataclasses.replace(tr, features=None))
    short = new_class_every(scene=8, n=40)
    with pytest.raises(TraceError, match="more than one block of 50"):
        hc.crossfit(short)
    for bad in ({"window": 0}, {"delay": -1}, {"every": 0}):
        with pytest.raises(ValueError, match="window >= 1"):
            hc.causal(tr, **bad)

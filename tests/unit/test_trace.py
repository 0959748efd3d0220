"""The replay trace format: what a saved trace keeps (services.sim.trace)."""

from __future__ import annotations

import numpy as np
import pytest

from services.sim.trace import Trace, TraceError, TraceFeatures


def test_round_trip_keeps_float64_scores(tmp_path) -> None:
    score = np.array([[0.1, 0.123456789012345]])
    tr = Trace(np.zeros((1, 2), int), score, np.zeros(2, int), np.array([1.0, 2.0]),
               np.array([0.1]), None, {"k": 1})
    back = Trace.load(tr.save(tmp_path / "t.npz"))
    assert np.array_equal(back.ramp_score, score) and back.arrival_s is None
    assert back.meta == {"k": 1}




def _featured(n: int = 5, final_logits: bool = True) -> Trace:
    rng = np.random.default_rng(0)
    feats = TraceFeatures([rng.random((n, 3), np.float32), rng.random((n, 4), np.float32)],
                          [rng.random((6, 3), np.float32), rng.random((6, 4), np.float32)],
                          [rng.random(6, np.float32), rng.random(6, np.float32)],
                          rng.random((n, 6), np.float32) if final_logits else None)
    return Trace(np.zeros((2, n), int), np.full((2, n), 0.5), np.zeros(n, int),
                 np.array([1.0, 2.0, 3.0]), np.array([0.1, 0.1]), None, {}, feats)


@pytest.mark.parametrize("final_logits", [True, False])
def test_round_trip_keeps_features_heads_and_final_logits(tmp_path, final_logits) -> None:
    tr = _featured(final_logits=final_logits)
    back = Trace.load(tr.save(tmp_path / "t.npz")).features
    assert back is not None
    for got, want in zip(back.by_site + back.weight + back.bias,
                         tr.features.by_site + tr.features.weight + tr.features.bias, strict=True):
        assert got.dtype == np.float32 and np.array_equal(got, want)
    assert (back.final_logits is None) == (not final_logits)
    if final_logits:
        assert np.array_equal(back.final_logits, tr.features.final_logits)


def test_a_trace_without_features_loads_without(tmp_path) -> None:
    tr = Trace(np.zeros((1, 2), int), np.zeros((1, 2)), np.zeros(2, int), np.array([1.0, 2.0]),
               np.array([0.1]))
    assert Trace.load(tr.save(tmp_path / "t.npz")).features is None


def test_features_must_match_the_trace() -> None:
    good = _featured()
    with pytest.raises(TraceError, match="one array, weight and bias per site"):
        TraceFeatures(good.features.by_site[:1], good.features.weight[:1],
                      good.features.bias[:1]).validate(2, 5)
    with pytest.raises(TraceError, match="features_1 must be N x C"):
        TraceFeatures([good.features.by_site[0], good.features.by_site[1][:3]],
                      good.features.weight, good.features.bias).validate(2, 5)
    with pytest.raises(TraceError, match="head_weight_0"):
        TraceFeatures(good.features.by_site, [good.features.weight[1], good.features.weight[1]],
                      good.features.bias).validate(2, 5)

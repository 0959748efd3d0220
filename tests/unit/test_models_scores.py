"""Exit scores: lower = more confident, hand-computed values."""

import math

import numpy as np
import pytest

from services.exits.scores import exit_score, softmax, softmax_top1


def test_softmax_top1_hand_computed():
    logits = np.array([[0.0, math.log(3.0)], [2.0, 2.0]], np.float32)
    labels, p = softmax_top1(logits)
    assert labels.dtype == np.int64 and p.dtype == np.float32
    assert labels.tolist() == [1, 0]  # ties go to the first class
    np.testing.assert_allclose(p, [0.75, 0.5], atol=1e-6)


def test_softmax_is_stable_for_huge_logits():
    p = softmax(np.array([[1e4, 1e4 - math.log(3.0)], [-1e4, -1e4]], np.float32))
    assert np.isfinite(p).all()
    np.testing.assert_allclose(p[1], [0.5, 0.5], atol=1e-6)


def test_max_softmax_score():
    s = exit_score(np.array([[0.0, math.log(3.0)], [0.0, 0.0]]))
    np.testing.assert_allclose(s, [0.25, 0.5], atol=1e-6)


def test_entropy_score_is_normalised():
    # Uniform over 4 classes: entropy log 4 -> 1. One-hot-ish: ~0.
    s = exit_score(np.array([[1.0, 1.0, 1.0, 1.0], [100.0, 0.0, 0.0, 0.0]]), "entropy")
    np.testing.assert_allclose(s, [1.0, 0.0], atol=1e-5)
    # p = (0.5, 0.5, 0, 0)-ish: entropy log 2 / log 4 = 0.5
    s = exit_score(np.array([[50.0, 50.0, -50.0, -50.0]]), "entropy")
    np.testing.assert_allclose(s, [0.5], atol=1e-5)


def test_margin_score():
    # softmax of [log 6, log 3, log 1] = (0.6, 0.3, 0.1): margin 0.3 -> score 0.7
    s = exit_score(np.log(np.array([[6.0, 3.0, 1.0]])), "margin")
    np.testing.assert_allclose(s, [0.7], atol=1e-6)


@pytest.mark.parametrize("kind", ["max_softmax", "entropy", "margin"])
def test_more_peaked_logits_score_lower(kind):
    logits = np.array([[0.0, 0.0, 0.0], [1.0, 0.0, 0.0], [3.0, 0.0, 0.0], [9.0, 0.0, 0.0]])
    s = exit_score(logits, kind)
    assert s.dtype == np.float32 and s.shape == (4,)
    assert (np.diff(s) < 0).all(), s
    assert ((s >= 0) & (s <= 1)).all()


def test_unknown_kind():
    with pytest.raises(ValueError, match="max_softmax"):
        exit_score(np.zeros((1, 3)), "nope")

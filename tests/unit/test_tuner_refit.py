"""Online ramp refits (services.tuner.refit): buffer, warm start, judged deployment."""

from __future__ import annotations

import numpy as np
import pytest

from services.exits.linear_head import LinearHead
from services.exits.scores import exit_score
from services.tuner.refit import (
    RampBuffer,
    RefitConfig,
    calibration_error,
    fold_temperature,
    judge,
    overconfidence_error,
    propose,
    refit,
    softened,
)

K, C = 20, 8


def _stream(rng: np.random.Generator, means: np.ndarray, n: int, classes: np.ndarray
            ) -> tuple[np.ndarray, np.ndarray]:
    """Features of ``n`` samples whose final answer is one of ``classes``."""
    y = rng.choice(classes, n)
    return (means[y] + rng.normal(0, 0.6, (n, C))).astype(np.float32), y


def _head_for(means: np.ndarray) -> LinearHead:
    """A nearest-mean linear head: right on the stream it was built for."""
    w = 2.0 * means
    return LinearHead(w.astype(np.float32), (-(means ** 2).sum(axis=1)).astype(np.float32))


@pytest.fixture
def shift():
    rng = np.random.default_rng(0)
    old = rng.normal(0, 2.0, (K, C))
    new = old + rng.normal(0, 2.0, (K, C))      # the served stream drifted away from bootstrap
    return rng, old, new


def _agreement(head: LinearHead, x: np.ndarray, y: np.ndarray) -> float:
    return float((head.logits(x).argmax(axis=1) == y).mean())


def test_a_refit_on_a_shifted_stream_recovers_agreement_and_is_deployed(shift):
    rng, old, new = shift
    serving = _head_for(old)
    classes = np.arange(6)                       # a scene shows a few classes
    buf = RampBuffer(1024, C)
    buf.add(*_stream(rng, new, 1024, classes))
    x_test, y_test = _stream(rng, new, 2000, classes)
    before = _agreement(serving, x_test, y_test)
    candidate, verdict = propose(serving, buf)
    assert verdict is not None and verdict.accept, verdict
    assert candidate is not None
    assert before < 0.8 and _agreement(candidate, x_test, y_test) > before + 0.15
    assert verdict.candidate_agreement >= verdict.serving_agreement + RefitConfig().margin


def test_a_refit_that_gains_nothing_is_refused(shift):
    rng, old, _ = shift
    serving = _head_for(old)                     # already right on this stream
    buf = RampBuffer(1024, C)
    buf.add(*_stream(rng, old, 1024, np.arange(6)))
    candidate, verdict = propose(serving, buf)
    assert candidate is None and verdict is not None and not verdict.accept
    assert "does not beat" in verdict.reason


def test_a_worse_calibrated_candidate_is_refused():
    # serving: 80 % sure of class 0 and right 80 % of the time (calibrated); the candidate
    # answers the same but is all but certain: as accurate, worse calibrated
    x = np.tile(np.log(np.array([0.8, 0.1, 0.1], np.float32)), (100, 1))
    labels = np.array([0] * 80 + [1] * 20)
    serving = LinearHead(np.eye(3, dtype=np.float32), np.zeros(3, np.float32))
    overconfident = LinearHead(10 * np.eye(3, dtype=np.float32), np.zeros(3, np.float32))
    assert calibration_error(serving.logits(x), labels) == pytest.approx(0.0, abs=1e-5)
    verdict = judge(serving, overconfident, x, labels, RefitConfig(margin=-1.0))
    assert not verdict.accept and "over-confidence" in verdict.reason
    assert verdict.candidate_agreement == verdict.serving_agreement == 0.8


def test_an_under_confident_candidate_that_gains_is_accepted():
    # serving: 80 % sure and right 80 % of the time; the candidate is right every time but
    # only 40 % sure: far worse calibrated, never over-confident. Its thresholds are chosen
    # again on its own scores, so being unsure costs exits, not agreement.
    x = np.tile(np.log(np.array([0.8, 0.1, 0.1], np.float32)), (100, 1))
    labels = np.array([0] * 80 + [1] * 20)
    x2 = np.concatenate([x, np.eye(3, dtype=np.float32)[labels]], axis=1)
    unsure = np.log(np.array([0.4, 0.3, 0.3], np.float32)) - np.log(0.3)  # 40 % on the label
    candidate = LinearHead(np.concatenate([np.zeros((3, 3), np.float32),
                                           unsure[0] * np.eye(3, dtype=np.float32)], axis=1),
                           np.zeros(3, np.float32))
    serving = LinearHead(np.concatenate([np.eye(3, dtype=np.float32), np.zeros((3, 3), np.float32)],
                                     axis=1), np.zeros(3, np.float32))
    verdict = judge(serving, candidate, x2, labels)
    assert verdict.candidate_agreement == 1.0 and verdict.serving_agreement == 0.8
    assert verdict.candidate_calibration > verdict.serving_calibration + 0.5  # stored ECE
    assert overconfidence_error(candidate.logits(x2), labels) == pytest.approx(0.0, abs=1e-6)
    assert verdict.accept, verdict.reason


def test_the_refit_starts_from_the_serving_head(shift):
    rng, old, new = shift
    serving = _head_for(old)
    x, y = _stream(rng, old, 300, np.arange(6))            # where the serving head is right
    unchanged = refit(serving, x, y, RefitConfig(steps=0))
    assert np.allclose(unchanged.logits(x), serving.logits(x), atol=1e-3)
    x, y = _stream(rng, new, 300, np.arange(6))
    moved = refit(serving, x, y, RefitConfig(steps=5))
    untouched = np.setdiff1d(np.arange(K), np.union1d(y, serving.logits(x).argmax(1)))
    assert len(untouched) and np.array_equal(moved.weight[untouched], serving.weight[untouched])
    assert not np.allclose(moved.weight, serving.weight)


def test_a_class_the_head_never_learned_starts_level_with_its_answers(shift):
    rng, old, _ = shift
    head = _head_for(old)
    # prepare floors a class no bootstrap sample showed far below every answer
    floored = LinearHead(head.weight, (head.bias - 200.0 * (np.arange(K) == 7)).astype(np.float32))
    x, _ = _stream(rng, old, 200, np.array([7]))
    y = np.full(len(x), 7)
    z = refit(floored, x, y, RefitConfig(steps=0)).logits(x)
    gap = (z.max(axis=1) - z[:, 7]).mean()
    before = (floored.logits(x).max(axis=1) - floored.logits(x)[:, 7]).mean()
    assert before > 100 and gap < 3.0


def test_soft_targets_refit_too(shift):
    rng, old, new = shift
    serving = _head_for(old)
    x, y = _stream(rng, new, 1024, np.arange(6))
    probs = np.full((len(y), K), 0.01 / (K - 1), np.float32)
    probs[np.arange(len(y)), y] = 0.99
    buf = RampBuffer(1024, C, soft_classes=K)
    buf.add(x, probs)
    candidate, verdict = propose(serving, buf)
    assert verdict.accept and candidate is not None


def test_the_buffer_keeps_the_newest_in_order():
    buf = RampBuffer(5, 2)
    for start in (0, 3, 6):
        buf.add(np.arange(start, start + 3, dtype=np.float32)[:, None].repeat(2, 1),
                np.arange(start, start + 3))
    x, y = buf.arrays()
    assert len(buf) == 5 and list(y) == [4, 5, 6, 7, 8]
    assert list(x[:, 0]) == [4, 5, 6, 7, 8]
    buf.add(np.zeros((12, 2), np.float32), np.arange(100, 112))   # more than it holds
    assert list(buf.arrays()[1]) == list(range(107, 112))
    with pytest.raises(ValueError, match="N x 2"):
        buf.add(np.zeros((3, 4), np.float32), np.zeros(3))


def test_a_small_buffer_does_not_refit(shift):
    rng, old, new = shift
    buf = RampBuffer(1024, C)
    buf.add(*_stream(rng, new, 100, np.arange(6)))
    assert propose(_head_for(old), buf) == (None, None)


def test_calibration_error_is_zero_when_confidence_matches():
    logits = np.log(np.array([[0.5, 0.5, 1e-9]] * 4, np.float32))
    assert calibration_error(logits, np.array([0, 0, 1, 1])) == pytest.approx(0.0, abs=1e-6)
    assert calibration_error(logits, np.array([2, 2, 2, 2])) == pytest.approx(0.5, abs=1e-6)


def test_overconfidence_error_counts_only_confidence_above_agreement():
    logits = np.log(np.array([[0.5, 0.5, 1e-9]] * 4, np.float32))
    wrong, right = np.array([2, 2, 2, 2]), np.array([0, 0, 0, 0])
    assert overconfidence_error(logits, wrong) == pytest.approx(0.5, abs=1e-6)  # = the ECE
    assert calibration_error(logits, right) == pytest.approx(0.5, abs=1e-6)    # unsure, right
    assert overconfidence_error(logits, right) == pytest.approx(0.0, abs=1e-6)


def test_a_gain_within_chance_is_refused():
    n = 400
    labels = np.zeros(n, int)

    def says_right_on(right: np.ndarray) -> np.ndarray:   # two-class logits, as features
        return np.stack([right, ~right], 1).astype(np.float32) * 4

    idx = np.arange(n)
    serving_right = idx < 200
    x = np.concatenate([says_right_on(serving_right), says_right_on((idx >= 10) & (idx < 220))],
                       axis=1)
    serving = LinearHead(np.array([[1, 0, 0, 0], [0, 1, 0, 0]], np.float32), np.zeros(2, np.float32))
    candidate = LinearHead(np.array([[0, 0, 1, 0], [0, 0, 0, 1]], np.float32), np.zeros(2, np.float32))
    cfg = RefitConfig(calibration_slack=1.0)
    verdict = judge(serving, candidate, x, labels, cfg)      # 20 gained, 10 lost: +2.5 %
    assert verdict.candidate_agreement >= verdict.serving_agreement + 0.02
    assert not verdict.accept and "beyond chance" in verdict.reason
    x[:, 2:] = says_right_on(idx < 260)                      # 60 gained, none lost
    assert judge(serving, candidate, x, labels, cfg).accept


def test_an_untrained_head_is_replaced_whatever_its_calibration(shift):
    rng, _, new = shift
    zero = LinearHead(np.zeros((K, C), np.float32), np.zeros(K, np.float32))
    x, y = _stream(rng, new, 600, np.arange(K))
    candidate = refit(zero, x[:450], y[:450], RefitConfig(steps=3, lr=0.01))
    verdict = judge(zero, candidate, x[450:], y[450:])
    assert verdict.candidate_agreement > verdict.serving_agreement + 0.1
    assert verdict.accept


D = 64  # wide pooled features, as a real ramp's: a few scenes are easy to separate


def _scenes(rng: np.random.Generator, n: int, scenes: int = 16
            ) -> tuple[np.ndarray, np.ndarray]:
    """``n`` frames of ``scenes`` scenes in order, each its own cluster with one of 4
    answers: a head fitted on some scenes is sure of them and as sure of the next ones,
    which it has never seen."""
    means = rng.normal(0, 1.0, (scenes, D))
    answer = rng.integers(0, 4, scenes)
    scene = np.repeat(np.arange(scenes), -(-n // scenes))[:n]
    x = (means[scene] + rng.normal(0, 0.3, (n, D))).astype(np.float32)
    return x, answer[scene]


def cross_entropy(logits: np.ndarray, y: np.ndarray) -> float:
    """Mean cross-entropy of ``logits`` against top-1 labels: what the temperature fits."""
    z = np.asarray(logits, np.float64)
    top = z.max(axis=1, keepdims=True)
    lse = top[:, 0] + np.log(np.exp(z - top).sum(axis=1))
    return float((lse - z[np.arange(len(y)), y]).mean())


def _cold() -> LinearHead:
    return LinearHead(np.zeros((K, D), np.float32), np.zeros(K, np.float32))


def test_a_refit_sure_of_unseen_scenes_is_softened_so_thresholds_can_separate_its_mistakes():
    x, y = _scenes(np.random.default_rng(2), 1024)
    seen, new = slice(0, 768), slice(768, None)       # the next scenes: none seen yet
    fitted = refit(_cold(), x[seen], y[seen])
    temperature = fold_temperature(_cold(), x[seen], y[seen])
    soft = softened(fitted, temperature)
    assert temperature > 1.0
    z_fit, z_soft = fitted.logits(x[new]), soft.logits(x[new])
    assert np.array_equal(z_soft.argmax(1), z_fit.argmax(1))
    wrong = z_fit.argmax(1) != y[new]
    assert wrong.mean() > 0.5
    # as fitted, it is all but certain of half its mistakes: below the threshold climb's
    # finest step (0.01), where no threshold tells them from its right answers
    assert (exit_score(z_fit)[wrong] < 0.01).mean() > 0.5
    assert (exit_score(z_soft)[wrong] < 0.01).mean() == 0.0
    assert cross_entropy(z_soft, y[new]) < cross_entropy(z_fit, y[new]) / 2


def test_the_temperature_only_softens_and_a_small_buffer_keeps_the_fit():
    rng = np.random.default_rng(4)
    cold = _cold()
    x, y = _scenes(rng, 1024, scenes=4)
    order = rng.permutation(len(x))                # every scene in both halves
    x, y = x[order], y[order]
    # one small step: logits barely apart, an underconfident head; sharpening would fit
    # better, but a refit is never made surer than it was fitted
    assert fold_temperature(cold, x, y, RefitConfig(steps=1, lr=0.01)) == 1.0
    assert fold_temperature(cold, x[:20], y[:20]) == 1.0
    head = LinearHead(np.ones((K, C), np.float32), np.ones(K, np.float32))
    assert softened(head, 1.0) is head


def test_propose_deploys_the_softened_candidate_and_can_be_told_not_to():
    rng = np.random.default_rng(5)
    cold = _cold()
    buf = RampBuffer(1024, D)
    x, y = _scenes(rng, 1024, scenes=8)
    buf.add(x, y)
    soft, verdict = propose(cold, buf)
    sure, _ = propose(cold, buf, RefitConfig(calibrate=False))
    assert verdict is not None and verdict.accept and soft is not None and sure is not None
    x, _ = buf.arrays()
    assert np.array_equal(soft.logits(x).argmax(1), sure.logits(x).argmax(1))
    assert np.abs(soft.weight).max() < np.abs(sure.weight).max()

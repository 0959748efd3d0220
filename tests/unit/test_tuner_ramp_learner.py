"""The refit role's state (services.tuner.ramp_learner) and the tuner's feedback filters."""

from __future__ import annotations

import numpy as np
import pytest

from schemas.telemetry import SampleTelemetry
from services.exits.linear_head import LinearHead
from services.exits.scores import exit_score
from services.tuner.ramp_learner import LearnerConfig, RampLearner, soft_temperature
from services.tuner.refit import RefitConfig
from services.tuner.service import head_version, window_of

K, C = 12, 6


def _setup(seed: int = 0):
    rng = np.random.default_rng(seed)
    old = rng.normal(0, 2.0, (K, C))
    new = old + rng.normal(0, 2.0, (K, C))
    head = LinearHead((2 * old).astype(np.float32), (-(old ** 2).sum(1)).astype(np.float32))
    return rng, new, head


def _batch(rng, means, n):
    y = rng.integers(0, len(means), n)
    return (means[y] + rng.normal(0, 0.5, (n, C))).astype(np.float32), y


def test_a_round_is_due_every_so_many_samples_and_deploys_a_better_head():
    rng, new, head = _setup()
    learner = RampLearner({3: head}, LearnerConfig(RefitConfig(min_samples=64), every=100))
    dues = []
    for _ in range(10):
        x, y = _batch(rng, new, 30)
        dues.append(learner.feed({3: x}, y))
    assert dues == [False, False, False, True, False, False, True, False, False, True]
    candidate, verdict, trained, judged, version = learner.propose(3)
    assert verdict is not None and verdict.accept and candidate is not None and version is None
    assert trained + judged == len(learner.buffers[3]) and judged == round(0.25 * trained / 0.75)
    assert learner.adopt(3, candidate) == 1 and learner.heads[3] is candidate
    assert learner.adopt(3, head, version=7) == 7


def test_a_small_buffer_gives_no_verdict_and_unknown_ramps_are_ignored():
    rng, new, head = _setup()
    learner = RampLearner({0: head}, LearnerConfig(every=1))
    x, y = _batch(rng, new, 10)
    assert learner.feed({0: x, 5: x}, y)
    assert learner.propose(0) == (None, None, 0, 0, None)
    with pytest.raises(ValueError):
        learner.feed({0: x[:, :3]}, y)


def test_soft_targets_when_logits_come_else_top1():
    rng, new, head = _setup()
    learner = RampLearner({0: head}, LearnerConfig(soft_temperature=0.5), classes=K)
    x, y = _batch(rng, new, 8)
    logits = rng.normal(0, 1, (8, K)).astype(np.float32)
    learner.feed({0: x}, y, logits)
    _, held = learner.buffers[0].arrays()
    assert held.shape == (8, K) and np.allclose(held.sum(1), 1)
    assert np.array_equal(held.argmax(1), logits.argmax(1))
    assert not learner.feed({0: x}, y)  # soft buffers and no logits: nothing added
    assert len(learner.buffers[0]) == 8
    hard = RampLearner({0: head}, LearnerConfig(soft_temperature=0.5), classes=0)
    hard.feed({0: x}, y, logits)  # no classes: the final top-1
    assert np.array_equal(hard.buffers[0].arrays()[1], y)


def test_evidence_scores_every_ramp_with_its_current_head():
    rng, new, head = _setup()
    learner = RampLearner({0: head, 1: head}, LearnerConfig(evidence=20))
    assert learner.evidence("max_softmax") is None
    x, y = _batch(rng, new, 50)
    learner.feed({0: x, 1: x}, y)
    ev = learner.evidence("max_softmax")
    assert ev.ramp_ids == (0, 1) and ev.n_samples == 20
    assert np.array_equal(ev.final, y[-20:])
    assert np.array_equal(ev.pred[0], head.logits(x[-20:]).argmax(1))


def test_the_evidence_is_scored_by_the_heads_as_they_serve():
    rng, new, head = _setup()
    learner = RampLearner({3: head}, LearnerConfig(RefitConfig(min_samples=64), evidence=40))
    x, y = _batch(rng, new, 400)
    learner.feed({3: x}, y)
    deployed = learner.propose(3).head
    assert deployed is not None
    learner.adopt(3, deployed)  # the head deployed is the head its verdict judged
    assert np.allclose(learner.evidence("max_softmax").score[0],
                       exit_score(deployed.logits(x[-40:]), "max_softmax"))
    learner.adopt(3, head, version=0)
    assert np.allclose(learner.evidence("max_softmax").score[0],
                       exit_score(head.logits(x[-40:]), "max_softmax"))


def test_soft_temperature_comes_from_the_recipe():
    assert soft_temperature("zoo|targets=softmax@0.5|n=4000") == 0.5
    assert soft_temperature("zoo|targets=top1") is None
    assert soft_temperature("") is None


def test_head_versions_from_file_names():
    assert head_version("ramp_3.v12.0123456789ab.onnx") == 12
    assert head_version("ramp_3.onnx") == 0


def test_feedback_scored_by_an_older_head_is_left_out():
    n = 4
    t = SampleTelemetry(
        model="m", worker="w", batch_id="b", batch_ids=["b"], batch_sizes=[n], config_version=5,
        mode="latency", score="max_softmax", thresholds={}, active=[0, 1],
        ids=[str(i) for i in range(n)], ramp_ids=[1, 0],
        ramp_pred=np.array([[1] * n, [0] * n], np.int32),
        ramp_score=np.full((2, n), 0.1, np.float32), exit_at=np.full(n, -1, np.int32),
        final_pred=np.zeros(n, np.int32), final_score=np.zeros(n, np.float32), batch_size=n,
        stage_ms=[[1.0]], t=0.0)
    assert window_of(t).ramp_ids == (0, 1)
    w = window_of(t, {1: 6})  # ramp 1's new head came with config 6: these rows are stale
    assert w.ramp_ids == (0,) and np.array_equal(w.pred[0], np.zeros(n))
    assert window_of(t, {1: 5}).ramp_ids == (0, 1)


def test_a_ramp_returns_to_the_head_it_served_when_its_scene_comes_back():
    rng, _, head = _setup()
    seen = head.weight / 2  # class means the prepared head reads right
    learner = RampLearner({3: head}, LearnerConfig(RefitConfig(min_samples=64), every=64))
    # a head fitted to another scene, where the final model answered these inputs otherwise
    fitted = LinearHead(np.roll(head.weight, 1, axis=0), np.roll(head.bias, 1))
    assert learner.adopt(3, fitted) == 1
    for _ in range(4):
        x, y = _batch(rng, seen, 64)
        learner.feed({3: x}, np.roll(np.arange(K), -1)[y])  # what the fitted head says
    assert learner.propose(3).head is None  # the serving head is right: nothing to change
    x, y = _batch(rng, seen, 64)  # the first scene is back
    assert (fitted.logits(x).argmax(1) != y).mean() > 0.5
    learner.feed({3: x}, y)
    back = learner.propose(3)
    assert (back.head, back.version, back.trained) == (head, 0, 0) and back.verdict.accept
    assert back.judged == 64  # judged on what was fed since the last round
    assert learner.adopt(3, back.head, back.version) == 0
    assert set(learner.returnable(3)) == {1}  # the fitted one may come back in turn


def test_earlier_heads_are_bounded_and_the_prepared_one_always_returnable():
    _, _, head = _setup()
    other = LinearHead(head.weight + 1, head.bias)
    learner = RampLearner({0: other}, LearnerConfig(keep=2), versions={0: 4},
                          prepared={0: head})
    for _ in range(5):
        learner.adopt(0, LinearHead(head.weight - 1, head.bias))
    assert learner.versions[0] == 9
    assert sorted(learner.returnable(0)) == [0, 7, 8]

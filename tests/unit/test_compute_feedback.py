"""Compute mode's accuracy loop in replay: the controller sees only the shadow sample, its
configs answer every request (services/sim/compute_feedback.py)."""

from __future__ import annotations

import numpy as np
import pytest

from services.exits.latency_profile import LatencyProfile
from services.exits.shadow import ShadowSampler
from services.sim import compute_feedback as cf
from services.tuner.controller import mode_controller

PROFILE = LatencyProfile.build([1.0, 2.0, 4.0], [0.05, 0.05])


def trap_trace(n: int = 2000, seed: int = 0):
    """Two ramps. Ramp 0 is confidently wrong (score < 0.3) on a tenth of the samples; ramp
    1 is always right. Thresholds of 0.5 then lose 3 % of the answers to ramp 0."""
    g = np.random.default_rng(seed)
    final = g.integers(0, 5, n)
    score = g.random((2, n))
    pred = np.stack([final, final]).copy()
    trap = (g.random(n) < 0.1) & (score[0] < 0.3)
    pred[0, trap] = (final[trap] + 1) % 5
    return pred, score, final


def replay(rate: float, seed: int = 0, start=(0.5, 0.5), n: int = 6000):
    pred, score, final = trap_trace()
    stream = np.random.default_rng(seed).integers(0, final.size, n)
    ctrl = mode_controller(PROFILE, [0, 1], list(start), compute=True)
    run = cf.replay_compute(pred, score, final, [0, 1], stream, PROFILE, ctrl,
                            ShadowSampler(rate, seed=seed))
    return run, ctrl, (pred, score, final, stream)


def test_without_feedback_the_config_never_moves() -> None:
    run, ctrl, (pred, score, final, stream) = replay(rate=0.0)
    assert not run.shadow.any() and ctrl.counts["changes"] == 0
    assert ctrl.thresholds == (0.5, 0.5)
    static = (score[:, stream] < 0.5).any(axis=0)              # some ramp answers
    first = np.argmax(score[:, stream] < 0.5, axis=0)           # the earliest that does
    ans = np.where(static, pred[first, stream], final[stream])
    assert np.array_equal(run.agree, ans == final[stream])
    assert np.array_equal(run.exited, static)
    assert run.agree.mean() < 0.99                              # the traps of ramp 0
    assert not run.shadow_ms.any()  # nothing kept, nothing run on


def test_feedback_lets_the_tuner_repair_a_config_that_breaks_the_constraint() -> None:
    blind, _, _ = replay(rate=0.0)
    run, ctrl, _ = replay(rate=0.5)
    assert blind.agree.mean() < 0.98  # the same stream with the starting config throughout
    assert run.agree[-2000:].mean() >= 0.99
    assert ctrl.counts["alerts"] > 0 and ctrl.thresholds[0] < 0.3  # below the traps' scores
    # shadow work: exited requests of the sample run on to the end, and only they
    kept = run.shadow & run.exited
    assert (run.shadow_ms[kept] > 0).all() and not run.shadow_ms[~kept].any()


def test_the_shadow_sample_is_the_samplers_and_a_seed_replays_exactly() -> None:
    a, _, _ = replay(rate=0.2, seed=3)
    b, _, _ = replay(rate=0.2, seed=3)
    sampler = ShadowSampler(0.2, seed=3)
    assert a.shadow.tolist() == [sampler.picks(f"req-{i}") for i in range(a.shadow.size)]
    assert np.array_equal(a.agree, b.agree) and np.array_equal(a.savings_ms, b.savings_ms)
    assert a.counts == b.counts


def test_worst_window() -> None:
    run, _, _ = replay(rate=0.0, n=64)
    agree = np.ones(64, dtype=bool)
    agree[40:44] = False
    run = cf.FeedbackRun(agree, run.exited, run.savings_ms, run.shadow, run.shadow_ms, {})
    assert run.worst_window(32) == pytest.approx(28 / 32)
    assert run.worst_window(100) == pytest.approx(60 / 64)  # shorter than one window


def test_static_thresholds_scaled_to_a_target_savings() -> None:
    pred, score, final = trap_trace()
    stream = np.arange(final.size)
    start = np.array([0.5, 0.5])
    _, _, full = cf.scaled_to_savings(pred, score, final, [0, 1], stream, PROFILE, start, 1e9)
    k, agreement, got = cf.scaled_to_savings(pred, score, final, [0, 1], stream, PROFILE,
                                             start, full / 2)
    assert 0 < k < 1 and got == pytest.approx(full / 2, rel=0.05)
    assert agreement > 0.97  # fewer exits, fewer of ramp 0's mistakes


def _setup(pred, score, final, start):
    """An E3 bench setup around a synthetic trace: every sample both easy and hard."""
    from services.bench.e3 import Setup
    from services.sim.trace import Trace

    tr = Trace(pred, score, final, np.array([1.0, 2.0, 4.0]), np.array([0.05, 0.05]))
    every = np.arange(final.size)
    return Setup("m", tr, np.array(start), np.array(start), (0, 1), (0, 1), (), (0.0, 0.0),
                 every, every, {})


def test_accuracy_rows_serve_another_traces_inputs_on_the_tuned_thresholds() -> None:
    from services.bench.e3_accuracy import row_of

    pred, score, final = trap_trace()
    tuned = _setup(np.stack([final, final]), score, final, (0.5, 0.5))  # no trap: 0.5 is safe
    served = _setup(pred, score, final, (0.0, 0.0))                      # its own start unused
    seen = row_of(tuned, "80/20", 0.1, 3000, 0, 0.01, None)
    unseen = row_of(tuned, "80/20", 0.1, 3000, 0, 0.01, None, served)
    assert seen["static_agreement"]["max"] == 1.0   # the thresholds' own inputs
    assert unseen["static_agreement"]["max"] < 0.99  # the trap costs ~3 % left alone
    assert unseen["meets"] == unseen["seeds"]       # the tuner repairs it on the shadow sample

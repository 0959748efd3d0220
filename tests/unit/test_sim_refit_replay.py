"""The offramp+refit replay (services.sim.refit_replay): feature feedback, refits that
re-score the samples still to be served, and the controller restarting a refitted ramp."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from services.exits.scores import exit_score
from services.sim.refit_replay import REFIT, RefitPlan, ReplayRefits
from services.sim.replay import refit_plan, run_replay
from services.sim.trace import Trace, TraceError, TraceFeatures

K, C, N = 12, 8, 2400


def shifted_trace(seed: int = 0) -> Trace:
    """Two ramps whose prepared heads learned another stream: on this one they are often
    wrong, yet the features still separate the classes well (a refit can fix them)."""
    rng = np.random.default_rng(seed)
    old = rng.normal(0, 2.0, (K, C))
    new = old + rng.normal(0, 2.0, (K, C))
    y = np.repeat(rng.choice(K, N // 200), 200)          # scenes of 200 samples, few classes
    feats = [(new[y] + rng.normal(0, s, (N, C))).astype(np.float32) for s in (0.8, 0.5)]
    w = (2.0 * old).astype(np.float32)
    b = (-(old ** 2).sum(axis=1)).astype(np.float32)
    logits = [f @ w.T + b for f in feats]
    return Trace(np.stack([lg.argmax(1) for lg in logits]),
                 np.stack([exit_score(lg) for lg in logits]).astype(np.float64), y,
                 np.array([2.0, 4.0, 10.0]), np.array([0.05, 0.05]),
                 np.arange(N) * 0.02, {"score": "max_softmax"},
                 TraceFeatures(feats, [w, w], [b, b]))


def test_refits_find_the_savings_the_stale_heads_cannot():
    tr = shifted_trace()
    out = run_replay(tr, tr.arrival_s, policies=("vanilla", "offramp", REFIT), grid_rounds=0,
                     timing_passes=1)
    off, ref = out["offramp"], out[REFIT]
    assert any(e.get("deployed_version", 0) >= 1 for e in ref.extra["refits"])
    assert ref.agreement >= 0.99 and off.agreement >= 0.99
    assert ref.summary()["exit_rate"] > off.summary()["exit_rate"] + 0.2
    assert ref.latency_ms.mean() < 0.8 * off.latency_ms.mean()
    kinds = [d["kind"] for d in ref.extra["decisions"]]
    assert "refit" in kinds                              # the controller heard of each head


def test_refitted_heads_reach_the_worker_head_delay_late():
    tr = shifted_trace()

    def refit(head_delay_s: float) -> list[dict]:
        return run_replay(tr, tr.arrival_s, policies=(REFIT,), grid_rounds=0, timing_passes=1,
                          head_delay_s=head_delay_s)[REFIT].extra["refits"]

    for delay in (0.0, 0.5):
        log = refit(delay)
        rounds = [e for e in log if e.get("accepted")]
        deployed = [e for e in log if "deployed_version" in e]
        assert rounds and deployed
        # the first head served is served from the first sample arriving after its round
        # ended plus the delay (samples arrive every 20 ms and are served at once)
        first = min(e["t_s"] for e in rounds)
        assert deployed[0]["sample"] >= (first + delay) / 0.02
    assert not any("deployed_version" in e for e in refit(1e6))  # never in time


def test_a_sampled_run_pays_the_features_cost_spread_along_the_model():
    tr = shifted_trace()  # prefix 2, 4, 10 ms
    every = RefitPlan(feature_rate=1.0, feature_boost=1.0, feature_share=0.5)  # 5 ms a run
    refits = ReplayRefits(tr, every)
    assert refits.serve(0, lambda i: (2.1, 10.2, 7, 0)) == (3.1, 15.2, 7, 0)  # 2 of 10 ms
    assert refits.serve(1, lambda i: (10.2, 10.2, 7, -1)) == (15.2, 15.2, 7, -1)
    assert refits.report()["feature_ms"] == 5.0 and refits.report()["sampled"] == 2
    never = ReplayRefits(tr, RefitPlan(feature_rate=1.0, feature_share=0.0))
    assert never.serve(0, lambda i: (2.1, 10.2, 7, 0)) == (2.1, 10.2, 7, 0)
    # a trace that measured it (trace record --features) is charged by default
    measured = dataclasses.replace(tr, meta={**tr.meta, "feature_share": 0.1})
    assert ReplayRefits(measured, RefitPlan(feature_rate=1.0)).feature_ms == 1.0
    assert ReplayRefits(tr).feature_ms == 0.0  # an older trace: nothing to charge


def test_without_refits_or_evidence_it_decides_as_offramp():
    tr = shifted_trace()
    out = run_replay(tr, tr.arrival_s, policies=("offramp", REFIT), grid_rounds=0,
                     timing_passes=1, refit=RefitPlan(every=10**9, evidence=0))  # never due
    assert out[REFIT].extra["decisions"] == out["offramp"].extra["decisions"]
    assert np.array_equal(out[REFIT].latency_ms, out["offramp"].latency_ms)


def test_a_deployed_head_rescores_only_the_samples_not_yet_served():
    tr = shifted_trace()
    refits = ReplayRefits(tr)
    refits.served(999)
    before = refits.view.ramp_score.copy()
    head = refits.learner.heads[0]
    refits.apply(0, type(head)(head.weight * 2, head.bias * 2))
    assert np.array_equal(refits.view.ramp_score[:, :1000], before[:, :1000])
    assert not np.array_equal(refits.view.ramp_score[0, 1000:], before[0, 1000:])
    assert np.array_equal(refits.view.ramp_score[1], before[1])
    assert refits.versions == [0, 0]  # the version counts when a round accepts a head


def test_a_round_s_accepted_head_is_the_learner_s_before_it_is_served():
    tr = shifted_trace()
    refits = ReplayRefits(tr)
    before = refits.view.ramp_score.copy()
    accepted = []
    for i in range(tr.n_samples):
        refits.served(i)  # whether its features come back is decided as it is served
        accepted += refits.feedback(i, float(i))
    assert accepted, "the shifted trace gives refits something to gain"
    site, head = accepted[-1]
    assert refits.learner.heads[site] is head
    assert any(e.get("accepted") and e["returned_to"] is None for e in refits.log)  # a new fit
    assert np.array_equal(refits.view.ramp_score, before)  # served only once applied


def test_refit_needs_features_and_sane_plans():
    tr = shifted_trace()
    bare = Trace(tr.ramp_pred, tr.ramp_score, tr.final_pred, tr.prefix_ms, tr.ramp_cost_ms)
    with pytest.raises(TraceError, match="--features"):
        ReplayRefits(bare)
    assert REFIT not in run_replay(bare, np.arange(N) * 0.02, policies=(REFIT,), grid_rounds=0)
    with pytest.raises(ValueError, match="feature_rate"):
        ReplayRefits(tr, RefitPlan(feature_rate=0.0))


def test_the_plan_feeds_back_as_the_workers_are_configured():
    tr = shifted_trace()
    default = refit_plan(tr)
    assert (default.feature_rate, default.feature_boost) == (0.25, 2.0)  # the live defaults
    got = refit_plan(tr, 0.5, 1.0)
    assert (got.feature_rate, got.feature_boost) == (0.5, 1.0)
    assert refit_plan(tr, 0.0).feature_rate == 0.25  # a stack without features: the default
    with pytest.raises(ValueError, match="feature_boost"):
        ReplayRefits(tr, RefitPlan(feature_boost=0.5))

"""Replay simulator (services.sim.replay) and trace format (services.sim.trace) on
hand-built traces."""

from __future__ import annotations

import numpy as np
import pytest

from services.sim.replay import (
    event_loop,
    fastest_pass,
    make_controller,
    run_hindsight,
    run_offramp,
    run_oracle,
    run_replay,
    run_static,
    run_vanilla,
    static_threshold,
    threshold_server,
    window_agreements,
)
from services.sim.trace import Trace, TraceError

PREFIX = [2.0, 5.0, 10.0]  # two sites of a 10 ms model
COST = [0.1, 0.1]          # both fit a 2% budget (0.2 ms)


def trace_of(pred: np.ndarray, score: np.ndarray, final: np.ndarray,
             arrival_s: np.ndarray | None = None) -> Trace:
    return Trace(pred, score, final, np.array(PREFIX), np.array(COST), arrival_s)


def easy(n: int = 800, seed: int = 0) -> Trace:
    """Ramp 1 is always right and confident; ramp 0 is right on even samples only."""
    rng = np.random.default_rng(seed)
    final = rng.integers(0, 10, n)
    pred = np.stack([np.where(np.arange(n) % 2 == 0, final, (final + 1) % 10), final])
    score = np.stack([np.where(np.arange(n) % 2 == 0, 0.05, 0.6), rng.uniform(0.01, 0.1, n)])
    return trace_of(pred, score, final, np.arange(n) * 0.05)  # 20/s: no queueing


def drifting(n: int = 2000, seed: int = 1) -> Trace:
    """Both ramps are right and confident for the first 30%; then ramp 0 turns confidently
    wrong (score 0.04) while ramp 1 stays right (score 0.05)."""
    rng = np.random.default_rng(seed)
    final = rng.integers(0, 10, n)
    turn = np.arange(n) >= int(0.3 * n)
    pred = np.stack([np.where(turn, (final + 1) % 10, final), final])
    score = np.stack([np.full(n, 0.04), np.full(n, 0.05)])
    score[0, ~turn] = rng.uniform(0.01, 0.05, int((~turn).sum()))
    return trace_of(pred, score, final, np.arange(n) * 0.05)


def test_vanilla_latency_is_the_full_model() -> None:
    tr = easy()
    r = run_vanilla(tr, tr.arrival_s)
    assert np.allclose(r.latency_ms, 10.0)
    assert r.agreement == 1.0 and (r.exit_site == -1).all()


def test_oracle_le_offramp_le_vanilla_on_an_easy_trace() -> None:
    tr = easy()
    res = run_replay(tr, tr.arrival_s, grid_rounds=2)
    van, off, ora = (res[k].latency_ms.mean() for k in ("vanilla", "offramp", "oracle"))
    assert ora <= off <= van
    assert off < 0.8 * van  # it really exits
    assert res["offramp"].agreement >= 0.99
    assert np.allclose(res["oracle"].latency_ms[::2], 2.0)  # ramp 0 right on even samples
    assert np.allclose(res["oracle"].latency_ms[1::2], 5.0)
    assert res["offramp"].extra["grid"]["rounds"] >= 1


def test_static_violates_on_drift_where_offramp_holds() -> None:
    tr = drifting()
    t = static_threshold(tr, 0.01, 0.1)
    assert t > 0.05  # both ramps looked perfect on the first 10%
    static = run_static(tr, tr.arrival_s)
    off = run_offramp(tr, tr.arrival_s, make_controller(tr))
    assert static.agreement < 0.99
    assert off.agreement >= 0.99
    assert off.latency_ms.mean() < 10.0  # and still saves latency via ramp 1


def test_hindsight_tunes_each_block_on_itself() -> None:
    """On the drifting trace, a block after the turn tunes ramp 0 shut and ramp 1 open, so
    every block meets the constraint and the second ramp still answers."""
    tr = drifting()
    hind = run_hindsight(tr, tr.arrival_s, every=200)
    assert hind.extra["active"] == [0, 1]
    agree = hind.answer == tr.final_pred
    for s in range(0, tr.n_samples, 200):
        assert agree[s: s + 200].mean() >= 0.99
    late = slice(int(0.3 * tr.n_samples) + 200, None)
    assert (hind.exit_site[late] == 1).all()  # ramp 0 (confidently wrong) never answers there
    assert hind.latency_ms.mean() < 10.0
    with pytest.raises(ValueError):
        run_hindsight(tr, tr.arrival_s, every=0)


def test_hindsight_bounds_the_causal_controller_on_drift() -> None:
    tr = drifting()
    res = run_replay(tr, tr.arrival_s, grid_rounds=0)
    assert res["hindsight"].latency_ms.mean() <= res["offramp"].latency_ms.mean() + 1e-9


def test_fifo_queueing_on_three_arrivals_when_runs_go_to_the_end() -> None:
    final = np.array([1, 2, 3])
    pred = np.stack([final, final])
    tr = trace_of(pred, np.full((2, 3), 0.1), final, np.array([0.0, 0.005, 0.030]))
    van = run_vanilla(tr, tr.arrival_s, backlog=0)
    # sample 1 arrives at 5 ms while sample 0 runs until 10 ms: waits 5 ms
    assert np.allclose(van.latency_ms, [10.0, 15.0, 10.0])
    static = run_static(tr, tr.arrival_s, backlog=0)  # threshold > 0.1: all exit at ramp 0
    # reply at 2 + 0.1 ms, but the worker stays busy for 10 + 0.2 ms (latency mode)
    assert np.allclose(static.latency_ms, [2.1, 5.2 + 2.1, 2.1])
    ora = run_oracle(tr, tr.arrival_s, backlog=0)  # no ramp costs: busy exactly 10 ms
    assert np.allclose(ora.latency_ms, [2.0, 7.0, 2.0])


def _finishes(tr: Trace, backlog: int) -> tuple[np.ndarray, list[tuple[int, float]]]:
    got: list[tuple[int, float]] = []
    cfg = ((0, 1), (0.5, 0.5))  # every sample answers at ramp 0 (score 0.1)

    def done(i: int, t: float) -> list:
        got.append((i, round(t * 1e3, 6)))
        return []

    lat, _, _ = event_loop(tr, tr.arrival_s, threshold_server(tr, lambda i: cfg), done,
                            backlog)
    return lat, got


def test_feedback_only_runs_give_way_and_are_redone_when_idle() -> None:
    final = np.array([1, 2, 3])
    pred = np.stack([final, final])
    tr = trace_of(pred, np.full((2, 3), 0.1), final, np.array([0.0, 0.005, 0.030]))
    # sample 1 arrives at 5 ms: sample 0's run (answered at 2.1 ms) stops for it; sample 1's
    # run ends at 15.2 ms, sample 0 is redone from 15.2 to 25.4 ms, before sample 2 at 30 ms
    lat, got = _finishes(tr, backlog=8)
    assert np.allclose(lat, [2.1, 2.1, 2.1])
    assert got == [(1, 15.2), (0, 25.4), (2, 40.2)]  # feedback out of order, none lost
    assert np.allclose(run_vanilla(tr, tr.arrival_s).latency_ms, [10.0, 15.0, 10.0])  # no exits
    assert np.allclose(run_oracle(tr, tr.arrival_s).latency_ms, [2.0, 2.0, 2.0])


def test_a_full_backlog_runs_to_the_end_and_a_redo_loses_its_progress() -> None:
    final = np.array([1, 2, 3])
    pred = np.stack([final, final])
    tr = trace_of(pred, np.full((2, 3), 0.1), final, np.array([0.0, 0.005, 0.008]))
    lat, got = _finishes(tr, backlog=1)
    # sample 0 set aside at 5 ms (backlog now full); sample 2 arrives at 8 ms during sample
    # 1's feedback, which must run to its end (15.2 ms) first
    assert np.allclose(lat, [2.1, 2.1, 7.2 + 2.1])
    assert got == [(1, 15.2), (2, 25.4), (0, 35.6)]
    # a redo started while idle stops (from scratch) when a sample arrives
    tr2 = trace_of(pred, np.full((2, 3), 0.1), final, np.array([0.0, 0.005, 0.020]))
    lat2, got2 = _finishes(tr2, backlog=8)
    # sample 1's run ends at 15.2; the redo of sample 0 would end at 25.4 > 20: it stops
    assert np.allclose(lat2, [2.1, 2.1, 2.1])
    assert got2 == [(1, 15.2), (2, 30.2), (0, 40.4)]


def test_decision_delay_defers_configs() -> None:
    tr = easy(n=400)
    never = run_offramp(tr, tr.arrival_s, make_controller(tr), delay_s=1e6)
    assert np.allclose(never.latency_ms, 10.2)  # initial config (no exits) throughout
    assert never.extra["decisions"]


def test_timing_keeps_each_calls_fastest_identical_pass() -> None:
    tr = drifting()
    one = run_replay(tr, tr.arrival_s, grid_rounds=0, policies=("offramp",), timing_passes=1)
    three = run_replay(tr, tr.arrival_s, grid_rounds=0, policies=("offramp",))
    a, b = one["offramp"], three["offramp"]
    assert b.extra["timing_passes"] == 3 and a.extra["decisions"] == b.extra["decisions"]
    assert {k: len(v) for k, v in a.extra["wall_ms"].items()} == \
        {k: len(v) for k, v in b.extra["wall_ms"].items()}
    again = run_offramp(tr, tr.arrival_s, make_controller(tr))
    again.extra["wall_ms"] = {k: [0.5 * x for x in v] for k, v in a.extra["wall_ms"].items()}
    assert fastest_pass(a, again) == again.extra["wall_ms"]
    again.extra["decisions"] = again.extra["decisions"][:-1]
    with pytest.raises(RuntimeError, match="decided differently"):
        fastest_pass(a, again)
    with pytest.raises(ValueError, match="timing_passes"):
        run_replay(tr, tr.arrival_s, policies=("offramp",), timing_passes=0)


def test_window_agreements() -> None:
    agree = np.array([1] * 16 + [1] * 15 + [0] + [0, 0], bool)
    assert window_agreements(agree, 16).tolist() == [1.0, 15 / 16]
    assert window_agreements(np.array([True, False]), 16).tolist() == [0.5]


def test_trace_validation_errors(tmp_path) -> None:
    good = easy(n=20)
    args = {"ramp_pred": good.ramp_pred, "ramp_score": good.ramp_score,
            "final_pred": good.final_pred, "prefix_ms": good.prefix_ms,
            "ramp_cost_ms": good.ramp_cost_ms}
    bad_cases = {
        "final_pred": {"final_pred": np.zeros(0, int)},
        "ramp_pred must be": {"ramp_pred": good.ramp_pred[:, :5]},
        "ramp_score must be 2": {"ramp_score": good.ramp_score[:1]},
        "integer": {"ramp_pred": good.ramp_pred.astype(float)},
        r"\[0, 1\]": {"ramp_score": good.ramp_score + 1},
        "R \\+ 1": {"prefix_ms": good.prefix_ms[:2]},
        "ramp_cost_ms": {"ramp_cost_ms": np.ones(3)},
        "non-decreasing": {"prefix_ms": np.array([5.0, 2.0, 10.0])},
        "arrival_s must be": {"arrival_s": np.arange(20)[::-1] * 1.0},
        "one time per sample": {"arrival_s": np.arange(3.0)},
    }
    for pattern, change in bad_cases.items():
        with pytest.raises(TraceError, match=pattern):
            Trace(**{**args, **change})
    with pytest.raises(TraceError, match="no trace file"):
        Trace.load(tmp_path / "missing.npz")
    np.savez(tmp_path / "partial.npz", ramp_pred=good.ramp_pred)
    with pytest.raises(TraceError, match="lacks ramp_score"):
        Trace.load(tmp_path / "partial.npz")
    (tmp_path / "junk.npz").write_bytes(b"not a zip")
    with pytest.raises(TraceError, match="readable"):
        Trace.load(tmp_path / "junk.npz")


def test_unknown_policy_and_missing_arrivals() -> None:
    tr = trace_of(np.zeros((2, 4), int), np.zeros((2, 4)), np.zeros(4, int))
    with pytest.raises(ValueError, match="unknown policy"):
        run_replay(tr, np.zeros(4), policies=("nope",))
    from services.sim.replay import arrivals_for

    with pytest.raises(ValueError, match="arrival spec"):
        arrivals_for(tr)
    assert arrivals_for(tr, "constant:100").tolist() == [0.01, 0.02, 0.03, 0.04]




def test_a_fresh_deployment_never_starts_on_untrained_ramps() -> None:
    tr = easy()
    everything = make_controller(tr, budget=1.0).active
    assert len(everything) > 1
    tr.meta["trained"] = [k not in everything[:1] for k in range(tr.n_sites)]
    assert everything[0] not in make_controller(tr, budget=1.0).active
    tr.meta["trained"] = [False] * tr.n_sites
    assert make_controller(tr, budget=1.0).active == ()

"""The live Apparate bench's measurements from client outcomes (services/bench/live_metrics)."""

from __future__ import annotations

import numpy as np
import pytest

from services.bench.live_metrics import (
    active_over_time,
    aggregate,
    labels_by_index,
    oracle_latency,
    run_summary,
)
from services.loadgen.drive import Outcome, attach_hops, attach_serving, way_back_ms


def _out(i: int, label: int, ms: float = 10.0, ok: bool = True, early: bool = False,
         version: int = 1) -> Outcome:
    return Outcome(i, ok, ms, "ok" if ok else "timeout", early, -1, label if ok else -1, version)


def test_agreement_compares_each_answer_with_the_reference_for_the_same_index():
    ref = np.array([3, 3, 5, 5])
    outs = [_out(2, 5), _out(0, 3), _out(1, 4), _out(3, 5)]  # answers arrive out of order
    s = run_summary(outs, ref, window=2)
    assert s["agreement"] == pytest.approx(0.75)
    # in stream order the windows are [3, 4] vs [3, 3] -> 0.5 and [5, 5] -> 1.0
    assert s["worst_window_agreement"] == pytest.approx(0.5)
    assert s["compared"] == 4 and s["errors"] == 0


def test_failed_requests_and_unknown_references_are_not_counted_but_reported():
    ref = np.array([1, -1, 2])
    outs = [_out(0, 1), _out(1, 9), _out(2, 0, ok=False)]
    s = run_summary(outs, ref)
    assert s["compared"] == 1 and s["agreement"] == 1.0
    assert (s["requests"], s["ok"], s["errors"]) == (3, 2, 1)


def test_latency_percentiles_exit_share_and_versions():
    outs = [_out(i, 0, ms=float(i + 1), early=i % 2 == 0, version=1 + (i >= 2)) for i in range(4)]
    s = run_summary(outs, np.zeros(4, np.int64))
    assert s["p50_ms"] == pytest.approx(2.5)
    assert s["exit_rate"] == pytest.approx(0.5)
    assert s["config_versions"] == [1, 2]


def test_serving_latency_comes_from_the_router_records_where_known():
    outs = [_out(i, 0, ms=10.0 + i) for i in range(4)] + [_out(4, 0, ok=False)]
    for o in outs:
        o.request_id = f"r{o.index}"
    got = attach_serving(outs, {"r0": 2.0, "r1": 4.0, "r2": 6.0, "r4": 1.0, "other": 9.0})
    assert got == 3  # r3 not recorded (yet); r4 failed, so its record is not used
    assert [o.serving_ms for o in outs] == [2.0, 4.0, 6.0, None, None]
    s = run_summary(outs, np.zeros(5, np.int64))
    assert s["serving_known"] == 3 and s["serving_p50_ms"] == pytest.approx(4.0)
    assert s["p50_ms"] == pytest.approx(11.5)  # end to end still covers every answer
    assert run_summary([_out(0, 0)], np.zeros(1, np.int64))["serving_p50_ms"] is None


def test_oracle_serving_latency_uses_the_router_records():
    vanilla = [_out(0, 0, ms=20.0), _out(1, 1, ms=20.0)]
    vanilla[0].serving_ms = 12.0  # sample 1 has no router record: left out
    lat = oracle_latency(vanilla, np.array([[0, 1]]), np.array([0, 1]), np.array([4.0, 10.0]),
                         serving=True)
    assert lat.tolist() == [6.0]


def test_no_answers_give_none_not_a_crash():
    s = run_summary([_out(0, 1, ok=False)], np.array([1]))
    assert s["p50_ms"] is None and s["agreement"] is None and s["exit_rate"] is None


def test_labels_by_index_marks_missing_answers():
    got = labels_by_index([_out(1, 7), _out(0, 2, ok=False)], 3)
    assert got.tolist() == [-1, 7, -1]


def test_oracle_subtracts_the_model_time_skipped_at_the_earliest_correct_ramp():
    # two ramps at 1 ms and 4 ms of a 10 ms model
    prefix = np.array([1.0, 4.0, 10.0])
    ramp_pred = np.array([[0, 9, 9],    # ramp 0 right for sample 0 only
                          [0, 1, 9]])   # ramp 1 right for samples 0 and 1
    final = np.array([0, 1, 2])
    vanilla = [_out(0, 0, ms=20.0), _out(1, 1, ms=20.0), _out(2, 2, ms=20.0)]
    lat = oracle_latency(vanilla, ramp_pred, final, prefix)
    assert lat.tolist() == [11.0, 14.0, 20.0]  # saved 9, 6 and nothing


def test_oracle_latency_never_goes_below_zero():
    lat = oracle_latency([_out(0, 0, ms=2.0)], np.array([[0]]), np.array([0]),
                         np.array([0.5, 10.0]))
    assert lat.tolist() == [0.0]


def test_active_ramps_over_time_lists_changes_in_stream_order():
    outs = [_out(0, 0, version=3), _out(1, 0, version=3), _out(2, 0, version=4),
            _out(3, 0, version=5)]
    by_version = {3: [1, 4], 4: [1, 4], 5: [4]}
    assert active_over_time(outs, by_version) == [[0, 2], [3, 1]]


def test_live_series_follow_the_config_each_answer_carried():
    from services.bench.live_metrics import live_series

    configs = [{"version": 3, "active": [1], "thresholds": {"1": 0.2}},
               {"version": 4, "active": [0, 2], "thresholds": {"0": 0.1, "2": 0.3}}]
    outs = {"vanilla": [_out(i, 0, ms=10.0 + i) for i in range(4)],
            "offramp": [_out(3, 0, ms=1.0, version=4), _out(0, 0, ms=2.0, version=3),
                        _out(1, 0, ms=3.0, version=3), _out(2, 0, ms=4.0, version=4)]}
    roll, th, active = live_series(outs, configs, n_sites=3, n=4, roll=2)
    assert roll["vanilla"].tolist() == [10.5, 11.5, 12.5]      # stream order, window 2
    assert roll["offramp"].tolist() == [2.5, 3.5, 2.5]
    assert active.tolist() == [1, 1, 2, 2]
    assert np.isnan(th[0, :2]).all() and th[0, 2:].tolist() == [0.1, 0.1]
    assert th[1, :2].tolist() == [0.2, 0.2] and np.isnan(th[1, 2:]).all()


def test_answers_are_broken_down_by_where_they_came_from():
    outs = [Outcome(i, True, float(ms), "ok", site >= 0, site, 0, 1, f"r{i}")
            for i, (site, ms) in enumerate([(3, 4), (3, 6), (-1, 9), (3, 8), (0, 2)])]
    outs.append(Outcome(5, False, 99.0, "timeout"))  # failed: not an answer
    for o, srv in zip(outs, [3.0, 5.0, 8.0, None, 1.0], strict=False):
        o.serving_ms = srv
    got = run_summary(outs, np.zeros(6, np.int64))["by_exit"]
    assert list(got) == ["0", "3", "final"]  # ramps in order, then the final layer
    assert got["3"]["n"] == 3 and got["3"]["p50_ms"] == pytest.approx(6.0)
    assert got["3"]["p75_ms"] == pytest.approx(7.0)
    assert got["3"]["serving_p50_ms"] == pytest.approx(4.0)  # the two known records
    assert got["final"] == {"n": 1, "p50_ms": 9.0, "p75_ms": 9.0, "serving_p50_ms": 8.0,
                            "serving_p75_ms": 8.0}
    one = {"vanilla": run_summary(outs, np.zeros(6, np.int64))}
    one["static"] = one["offramp"] = one["offramp+refit"] = one["oracle"] = one["vanilla"]
    assert "by_exit" in aggregate([one])["offramp"]           # one run: that run's
    assert "by_exit" not in aggregate([one, one])["offramp"]  # several: per run only


def test_ways_in_and_back_come_from_the_routers_receipt_on_one_clock():
    """Sent at 100.000 s, received by the router at 100.002, served in 3 ms, answered at
    100.0065: 2 ms in, 1.5 ms back. Unknown or failed requests get neither."""
    outs = [_out(i, 0) for i in range(3)] + [_out(3, 0, ok=False)]
    for o in outs:
        o.request_id, o.sent_at, o.answered_at = f"r{o.index}", 100.0, 100.0065
    assert attach_serving(outs, {"r0": 3.0, "r1": 3.0, "r3": 1.0}) == 2
    assert attach_hops(outs, {"r0": 100.002, "r2": 100.001, "r3": 100.001}) == 2
    assert outs[0].way_in_ms == pytest.approx(2.0) and outs[2].way_in_ms == pytest.approx(1.0)
    assert outs[3].way_in_ms is None  # failed: its record is not used
    assert way_back_ms(outs[0]) == pytest.approx(1.5)
    assert way_back_ms(outs[1]) is None  # no way in known
    assert way_back_ms(outs[2]) is None  # no serving time known
    s = run_summary(outs, np.zeros(4, np.int64))  # the bench's summary carries them
    assert s["way_in_p50_ms"] == pytest.approx(1.5) and s["way_in_p75_ms"] == pytest.approx(1.75)
    assert s["way_back_p50_ms"] == pytest.approx(1.5)
    assert run_summary([_out(0, 0)], np.zeros(1, np.int64))["way_in_p50_ms"] is None

"""How `bench apparate --live` combines repeated runs (services.bench.live_metrics.aggregate)
and prints them (services.bench.apparate_live.table)."""

from __future__ import annotations

import pytest

from services.bench.apparate_live import table
from services.bench.live_metrics import aggregate


def _run(vanilla_ms: float, offramp_ms: float, errors: int = 0, refit_ms: float | None = None
         ) -> dict:
    base = {"requests": 10, "ok": 10 - errors, "errors": errors}
    refit_ms = offramp_ms if refit_ms is None else refit_ms
    return {
        "vanilla": {**base, "p25_ms": vanilla_ms, "p50_ms": vanilla_ms, "p95_ms": 2 * vanilla_ms,
                    "agreement": 1.0, "worst_window_agreement": 1.0, "exit_rate": 0.0},
        "static": {**base, "p25_ms": vanilla_ms, "p50_ms": vanilla_ms, "p95_ms": 2 * vanilla_ms,
                   "agreement": 0.5, "worst_window_agreement": 0.0, "exit_rate": 1.0,
                   "threshold": 0.3},
        "offramp": {**base, "p25_ms": offramp_ms, "p50_ms": offramp_ms, "p95_ms": 2 * offramp_ms,
                    "agreement": 0.995, "worst_window_agreement": 0.9375, "exit_rate": 0.2,
                    "initial_active": [1, 8], "configs": 4, "active_ramps_over_time": [[0, 2]],
                    "timeline": []},
        "offramp+refit": {**base, "p25_ms": refit_ms, "p50_ms": refit_ms, "p95_ms": 2 * refit_ms,
                          "agreement": 0.993, "worst_window_agreement": 0.9375, "exit_rate": 0.5,
                          "initial_active": [1, 8], "configs": 6,
                          "active_ramps_over_time": [[0, 2]], "timeline": [],
                          "refits": [{"ramp": 3, "version": 1, "trained_on": 96,
                                      "serving_agreement": 0.5, "agreement": 0.9}]},
        "oracle": {"p25_ms": 1.0, "p50_ms": 2.0, "p95_ms": 3.0, "agreement": 1.0,
                   "exit_rate": 0.9, "source": "estimated"},
    }


def test_one_run_is_reported_as_it_is_with_its_changes():
    agg = aggregate([_run(20.0, 18.0)])
    assert agg["offramp"]["p50_ms"] == 18.0 and agg["offramp"]["configs"] == 4
    assert agg["offramp"]["p50_change_by_run"] == [pytest.approx(-0.1)]
    assert agg["vanilla"]["p95_change_by_run"] == [0.0]


def test_repeats_report_medians_and_every_run_s_change_against_its_own_vanilla():
    # the machine drifts: run 2 is twice as slow for every policy
    agg = aggregate([_run(20.0, 18.0), _run(40.0, 38.0), _run(20.0, 16.0, errors=1)])
    off = agg["offramp"]
    assert off["p50_ms"] == 18.0                      # median of 18, 38, 16
    assert off["p50_change_by_run"] == [pytest.approx(-0.1), pytest.approx(-0.05),
                                        pytest.approx(-0.2)]
    assert off["errors"] == 1 and off["requests"] == 30
    assert off["initial_active"] == [1, 8] and "timeline" not in off
    assert agg["static"]["threshold"] == 0.3 and agg["oracle"]["source"] == "estimated"


def test_the_table_shows_the_median_change_and_each_run():
    runs = [_run(20.0, 18.0), _run(40.0, 38.0), _run(20.0, 16.0)]
    doc = {"model": "m", "requests": 10, "workload": "text", "arrivals": "poisson:20",
           "budget": 0.02, "constraint": 0.01, "aggregate": "median over 3 runs",
           "repeats": 3, "runs": runs, "tuning_ms_p50": 0.4, "adjust_ms_p50": 0.2,
           "grid_gap": 0.0, "tuning_source": "replay", **aggregate(runs)}
    text = table(doc)
    offramp_row = next(line for line in text.splitlines() if line.startswith("  offramp "))
    assert "-10.0%" in offramp_row                    # the median of -10, -5 and -20 %
    assert "offramp p50/p95 vs vanilla, run by run: -10.0/-10.0%, -5.0/-5.0%, -20.0/-20.0%" in text
    assert "configs per run [4, 4, 4]" in text
    assert "refitted heads deployed per run [1, 1, 1]" in text and "3 v1: 0.500 -> 0.900" in text


def test_the_refit_policy_is_compared_with_its_own_run_s_vanilla():
    agg = aggregate([_run(20.0, 18.0, refit_ms=10.0), _run(40.0, 38.0, refit_ms=30.0)])
    assert agg["offramp+refit"]["p50_change_by_run"] == [pytest.approx(-0.5),
                                                         pytest.approx(-0.25)]
    assert "refits" not in agg["offramp+refit"]  # per run only


def test_serving_latency_changes_are_taken_against_each_run_s_vanilla():
    runs = [_run(20.0, 18.0), _run(40.0, 38.0)]
    for r, (van, off) in zip(runs, [(10.0, 6.0), (20.0, 15.0)]):
        r["vanilla"].update(serving_p50_ms=van, serving_p95_ms=2 * van, serving_known=10)
        r["offramp"].update(serving_p50_ms=off, serving_p95_ms=2 * off, serving_known=9)
    agg = aggregate(runs)
    off = agg["offramp"]
    assert off["serving_p50_change_by_run"] == [pytest.approx(-0.4), pytest.approx(-0.25)]
    assert off["serving_p50_ms"] == pytest.approx(10.5) and off["serving_known"] == 18
    assert agg["static"]["serving_p50_change_by_run"] == [None, None]  # no records: no figure
    doc = {"model": "m", "requests": 10, "workload": "text", "arrivals": "poisson:20",
           "budget": 0.02, "constraint": 0.01, "aggregate": "median over 2 runs",
           "repeats": 2, "runs": runs, "tuning_ms_p50": 0.4, "adjust_ms_p50": 0.2,
           "grid_gap": 0.0, "tuning_source": "replay", **agg}
    lines = table(doc).splitlines()
    serving = lines[lines.index(next(x for x in lines if x.startswith("  serving latency"))):]
    row = next(x for x in serving if x.startswith("  offramp "))
    assert "10.50" in row and "-32.5%" in row and row.rstrip().endswith("18")

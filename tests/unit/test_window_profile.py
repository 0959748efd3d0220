"""The profiler's decision for one batch-profile window (services.profiler.window_profile)."""

from __future__ import annotations

import pytest

from services.profiler.survival_forecast import MAX_HISTORY, NaiveForecaster
from services.profiler.window_profile import exits_of, profile_window, tracked_ramps


def test_survival_after_each_active_ramp_from_exit_counts() -> None:
    # 10 samples: 2 left at ramp 0, 3 at ramp 3, 5 at the final layer (-1 and None alike)
    wp = profile_window({0: 2, 3: 3, -1: 4, None: 1}, active=[3, 0], history={})
    assert wp is not None
    assert wp.ramps == (0, 3) and wp.samples == 10
    assert wp.observed == pytest.approx((0.8, 0.5))
    assert wp.drift is None and not wp.drifted  # nothing was forecast for this window
    # no history: both forecasters say "like this window"
    assert wp.forecast == pytest.approx((0.8, 0.5)) and wp.naive == pytest.approx((0.8, 0.5))


def test_a_ramp_that_answered_is_tracked_even_when_no_longer_active() -> None:
    assert tracked_ramps({1: 4, 5: 0, -1: 2, None: 3}, active=[7]) == (1, 7)
    assert list(exits_of({1: 2, None: 1})) == [1, 1, -1]


def test_drift_is_judged_against_the_forecast_made_for_the_window() -> None:
    counts = {0: 2, 3: 3, -1: 5}  # observed (0.8, 0.5)
    near = profile_window(counts, [0, 3], {}, forecast_made={0: 0.75, 3: 0.45})
    far = profile_window(counts, [0, 3], {}, forecast_made={0: 0.8, 3: 0.7})
    assert near is not None and far is not None
    assert not near.drifted and near.drift.max_error == pytest.approx(0.05)
    assert far.drifted and far.drift.errors == pytest.approx((0.0, 0.2))
    # a forecast that misses a tracked ramp (it became active this window) judges nothing
    partial = profile_window(counts, [0, 3], {}, forecast_made={0: 0.1})
    assert partial is not None and partial.drift is None


def test_forecast_follows_the_history_and_stays_a_valid_profile() -> None:
    history = {0: [0.9] * 20, 3: [0.2] * 20}
    wp = profile_window({0: 1, 3: 1, -1: 8}, [0, 3], history, forecaster=NaiveForecaster())
    assert wp is not None and wp.forecast == pytest.approx((0.9, 0.8))  # the last window
    # ARIMA on a steady level with a jump at the end: between the old level and the new one,
    # within [0, 1] and non-increasing along the ramps
    level = [0.5 + 0.01 * ((k * 7) % 3 - 1) for k in range(25)]
    arima = profile_window({0: 1, 3: 1, -1: 8}, [0, 3], {0: level, 3: level})
    assert arima is not None
    assert 0.5 < arima.forecast[0] < 0.9 and arima.forecast[1] <= arima.forecast[0]
    assert all(0.0 <= f <= 1.0 for f in arima.forecast)


def test_history_beyond_the_forecaster_s_reach_is_dropped() -> None:
    seen: list[int] = []

    class Spy:
        def forecast(self, history):  # type: ignore[no-untyped-def]
            seen.append(len(history))
            return history[-1]

    profile_window({0: 1, -1: 1}, [0], {0: [0.5] * 100}, forecaster=Spy())
    assert seen == [MAX_HISTORY]


def test_nothing_to_profile_without_samples_or_ramps() -> None:
    assert profile_window({}, [0, 3], {}) is None
    assert profile_window({0: 0}, [0], {}) is None
    assert profile_window({-1: 5}, [], {}) is None  # vanilla: every sample runs to the end


def _rows(start, ramps, version, observed=0.5, forecast=0.5, samples=500):
    return [{"start": start, "ramp": r, "config_version": version, "observed": observed,
             "forecast": forecast, "samples": samples} for r in ramps]


def test_history_and_forecast_stop_at_a_change_of_config_or_of_ramps() -> None:
    from services.profiler.window_profile import same_regime

    rows = (_rows(0.0, [1, 3], 1, 0.9) + _rows(10.0, [1, 3], 2, 0.8) + _rows(20.0, [1, 3], 2, 0.7)
            + _rows(30.0, [1, 3], 2, None, 0.6))
    history, made = same_regime(rows, 30.0, [1, 3], 2)
    assert history == {1: [0.8, 0.7], 3: [0.8, 0.7]}  # window 0 ran config 1: another series
    assert made == {1: 0.6, 3: 0.6}
    # the same window under a new config: nothing before speaks for it, no drift judged
    assert same_regime(rows, 30.0, [1, 3], 3) == ({}, None)
    # a plan that runs another set of ramps: the same
    assert same_regime(rows, 30.0, [1], 2) == ({}, None)
    # a forecast missing for one tracked ramp judges nothing, history still counts
    partial = rows[:-1]
    assert same_regime(partial, 30.0, [1, 3], 2)[1] is None


def test_a_forecast_from_a_handful_of_samples_is_not_judged() -> None:
    from services.profiler.batch_profile import MIN_FORECAST_SAMPLES
    from services.profiler.window_profile import same_regime

    few = MIN_FORECAST_SAMPLES - 1
    rows = (_rows(10.0, [1, 3], 2, 0.8) + _rows(20.0, [1, 3], 2, 0.7, samples=few)
            + _rows(30.0, [1, 3], 2, None, 0.6))
    history, made = same_regime(rows, 30.0, [1, 3], 2)
    assert history == {1: [0.8, 0.7], 3: [0.8, 0.7]}  # still the series' history
    assert made is None                               # but its forecast rests on noise
    assert same_regime(rows, 30.0, [1, 3], 2, min_samples=few)[1] == {1: 0.6, 3: 0.6}
    # the window the forecast came from decides, not an older, larger one
    rows[2]["samples"] = rows[3]["samples"] = MIN_FORECAST_SAMPLES
    rows[0]["samples"] = rows[1]["samples"] = 1
    assert same_regime(rows, 30.0, [1, 3], 2)[1] == {1: 0.6, 3: 0.6}

"""Survival forecasts: naive, ARIMA (known next values, fallbacks, beats naive), profiles."""

from __future__ import annotations

import warnings
from itertools import pairwise

import numpy as np
import pytest
import statsmodels.tsa.arima.model
from statsmodels.tools.sm_exceptions import ConvergenceWarning

from services.profiler.survival_forecast import (
    ARIMA_ORDER,
    MAX_HISTORY,
    MIN_HISTORY,
    ArimaForecaster,
    NaiveForecaster,
    clamp,
    forecast_profile,
    non_increasing,
)


def ar1(n: int, c: float, phi: float, x0: float, sd: float, seed: int = 0) -> np.ndarray:
    """x_{t+1} = c + phi x_t + N(0, sd)."""
    rng = np.random.default_rng(seed)
    x = [x0]
    for _ in range(n - 1):
        x.append(c + phi * x[-1] + (rng.normal(0.0, sd) if sd else 0.0))
    return np.array(x)


def test_naive_is_the_last_observed_value_clamped():
    f = NaiveForecaster()
    assert f.forecast([0.2, 0.7, 0.4]) == 0.4
    assert f.forecast([0.5, float("nan")]) == 0.5  # a window without samples is skipped
    assert f.forecast([1.2]) == 1.0
    with pytest.raises(ValueError):
        f.forecast([])
    with pytest.raises(ValueError):
        f.forecast([float("nan")])


def test_constant_series_forecasts_that_constant():
    assert ArimaForecaster().forecast([0.37] * 20) == 0.37
    assert ArimaForecaster(order=(1, 0, 0)).forecast([0.0] * 12) == 0.0


def test_short_history_falls_back_to_last_value():
    history = [0.2, 0.8, 0.2, 0.8, 0.3]
    assert len(history) < MIN_HISTORY
    assert ArimaForecaster().forecast(history) == 0.3
    assert ArimaForecaster(min_history=4).forecast([0.5, 0.5, float("nan"), 0.4]) == 0.4


def test_oscillating_ar1_next_value_is_known():
    # x_{t+1} = 0.9 - 0.8 x_t (mean 0.5) with tiny noise: the next value is 0.9 - 0.8 x_T up
    # to that noise. ARIMA(1,0,0) recovers it; the last value is off by the swing.
    fc = ArimaForecaster(order=(1, 0, 0))
    arima_err, naive_err = [], []
    for seed in range(3):
        x = ar1(MAX_HISTORY, 0.9, -0.8, 0.5, 0.01, seed)
        known = 0.9 - 0.8 * x[-1]
        arima_err.append(abs(fc.forecast(x) - known))
        naive_err.append(abs(x[-1] - known))
    assert max(arima_err) < 0.01
    assert np.mean(arima_err) < 0.5 * np.mean(naive_err)


@pytest.mark.parametrize("order", [ARIMA_ORDER, (1, 0, 0)])
def test_noise_free_ar1_next_value_is_close(order):
    x = ar1(MAX_HISTORY, 0.05, 0.9, 0.95, 0.0)  # decaying to 0.5
    assert ArimaForecaster(order=order).forecast(x) == pytest.approx(0.05 + 0.9 * x[-1], abs=0.01)


def test_level_switch_is_followed():
    # The workload mix switches from 30 % to 60 % hard inputs (200 samples a window).
    rng = np.random.default_rng(1)
    x = np.r_[rng.binomial(200, 0.3, 22), rng.binomial(200, 0.6, 8)] / 200
    assert ArimaForecaster().forecast(x) == pytest.approx(0.6, abs=0.05)


def test_arima_beats_naive_on_mean_reverting_noisy_ar1():
    # x_{t+1} = 0.35 + 0.3 x_t + N(0, 0.05): strong mean reversion around 0.5, so the last
    # value carries its noise forward and a fitted model does better, on average.
    fc, errs, naive = ArimaForecaster(), [], []
    for seed in (0, 1):
        x = ar1(70, 0.35, 0.3, 0.5, 0.05, seed)
        for t in range(40, 70):
            errs.append(abs(fc.forecast(x[:t]) - x[t]))
            naive.append(abs(x[t - 1] - x[t]))
    assert np.mean(errs) < 0.95 * np.mean(naive)


def test_only_the_recent_history_is_fitted():
    x = ar1(80, 0.35, 0.3, 0.5, 0.05, seed=3)
    fc = ArimaForecaster()
    assert fc.forecast(x) == fc.forecast(x[-MAX_HISTORY:])


def test_forecast_is_clamped_to_unit_interval():
    rising = np.r_[np.linspace(0.5, 0.96, 17), 0.97, 0.99, 1.0]
    assert ArimaForecaster().forecast(rising) <= 1.0
    falling = 1.0 - rising
    assert ArimaForecaster().forecast(falling) >= 0.0
    assert (clamp(-0.2), clamp(0.3), clamp(1.7)) == (0.0, 0.3, 1.0)


def test_a_failing_fit_falls_back_to_last_value():
    x = ar1(20, 0.35, 0.3, 0.5, 0.05)
    assert ArimaForecaster(order=(-1, 0, 0)).forecast(x) == x[-1]  # ARIMA rejects the order


class _Unconverged:
    """Stands in for statsmodels' ARIMA: warns that the fit did not converge."""

    def __init__(self, *args, **kwargs) -> None:
        pass

    def fit(self, **kwargs) -> _Unconverged:
        warnings.warn("did not converge", ConvergenceWarning, stacklevel=2)
        return self

    def forecast(self, steps: int) -> np.ndarray:
        return np.array([0.9])


def test_an_unconverged_fit_falls_back_and_its_warning_stays_inside(monkeypatch):
    # the forecaster imports ARIMA when it fits, from statsmodels' module
    monkeypatch.setattr(statsmodels.tsa.arima.model, "ARIMA", _Unconverged)
    x = ar1(20, 0.35, 0.3, 0.5, 0.05)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any warning escaping would fail here
        assert ArimaForecaster().forecast(x) == x[-1]


def test_real_fits_leak_no_warnings():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ArimaForecaster().forecast(ar1(12, 0.35, 0.3, 0.5, 0.05))
        ArimaForecaster(order=(2, 0, 1)).forecast(ar1(8, 0.35, 0.3, 0.5, 0.05))


def test_non_increasing_pools_adjacent_violators():
    assert non_increasing([0.8, 0.5, 0.3]) == (0.8, 0.5, 0.3)
    assert non_increasing([0.5, 0.6, 0.3]) == pytest.approx((0.55, 0.55, 0.3))
    assert non_increasing([0.2, 0.3, 0.4]) == pytest.approx((0.3, 0.3, 0.3))
    assert non_increasing([0.9, 0.4, 0.5, 0.6, 0.1]) == pytest.approx((0.9, 0.5, 0.5, 0.5, 0.1))
    assert non_increasing([]) == ()


def test_profile_is_clamped_and_non_increasing_across_ramps():
    class Fixed:
        def __init__(self) -> None:
            self.values = iter([1.3, 0.4, 0.6, -0.1])

        def forecast(self, history) -> float:
            return next(self.values)

    profile = forecast_profile([[0.5]] * 4, Fixed())
    assert profile == pytest.approx((1.0, 0.5, 0.5, 0.0))


def test_profile_per_ramp_histories():
    histories = [[0.9, 0.8, 0.85], [0.5, 0.45, 0.5], [0.2, 0.3, 0.52]]  # last ramp noisy
    assert forecast_profile(histories, NaiveForecaster()) == pytest.approx((0.85, 0.51, 0.51))
    assert forecast_profile(histories) == forecast_profile(histories, NaiveForecaster())  # short
    rng = np.random.default_rng(7)
    long = [list(np.clip(rng.normal(m, 0.05, 25), 0, 1)) for m in (0.8, 0.5, 0.45)]
    profile = forecast_profile(long)
    assert all(a >= b for a, b in pairwise(profile))
    assert all(0.0 <= p <= 1.0 for p in profile)

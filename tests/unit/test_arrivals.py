"""Arrival processes: rates, burstiness, determinism, time-varying segments, CLI parsing."""

from __future__ import annotations

import math

import numpy as np
import pytest

from services.workloads import arrivals as arr


def _gaps(times: np.ndarray) -> np.ndarray:
    return np.diff(np.concatenate([[0.0], times]))


def _cv2(times: np.ndarray) -> float:
    g = _gaps(times)
    return float(g.var() / g.mean() ** 2)


def test_poisson_rate_and_cv2() -> None:
    t = arr.poisson(200.0, n=100_000, seed=1)
    assert t.dtype == np.float64 and len(t) == 100_000
    assert np.all(np.diff(t) >= 0) and t[0] > 0
    assert len(t) / t[-1] == pytest.approx(200.0, rel=0.02)
    assert _cv2(t) == pytest.approx(1.0, rel=0.05)


@pytest.mark.parametrize("cv2", [0.25, 1.0, 8.0])
def test_gamma_rate_and_cv2(cv2: float) -> None:
    t = arr.gamma(200.0, cv2, n=200_000, seed=2)
    assert np.all(np.diff(t) >= 0)
    assert len(t) / t[-1] == pytest.approx(200.0, rel=0.03)
    assert _cv2(t) == pytest.approx(cv2, rel=0.1)


def test_bursty_gamma_is_burstier_than_poisson_in_windows() -> None:
    # Counts per 100 ms window vary far more under cv2=8 than under Poisson.
    p = np.histogram(arr.poisson(200.0, duration_s=300, seed=3), bins=3000, range=(0, 300))[0]
    g = np.histogram(arr.gamma(200.0, 8.0, duration_s=300, seed=3), bins=3000, range=(0, 300))[0]
    assert g.var() > 3 * p.var()


def test_determinism_and_seeds() -> None:
    for make in (lambda s: arr.poisson(50, n=1000, seed=s),
                 lambda s: arr.gamma(50, 4, n=1000, seed=s),
                 lambda s: arr.make_arrivals("steps:0=10,5=100", n=1000, seed=s),
                 lambda s: arr.make_arrivals("sine:100:amp=0.8,period=10", n=1000, seed=s)):
        assert np.array_equal(make(7), make(7))
        assert not np.array_equal(make(7), make(8))


@pytest.mark.parametrize("spec", ["poisson:100", "gamma:100:cv2=5", "steps:0=50,3=300,6=20",
                                  "sine:100:amp=0.9,period=4", "constant:100"])
def test_duration_cut_is_prefix_of_count_cut(spec: str) -> None:
    by_time = arr.make_arrivals(spec, duration_s=20.0, seed=11)
    assert len(by_time) > 0 and by_time[-1] < 20.0
    by_count = arr.make_arrivals(spec, n=len(by_time) + 100, seed=11)
    assert np.array_equal(by_count[: len(by_time)], by_time)
    assert by_count[len(by_time)] >= 20.0


def test_piecewise_rate_per_segment() -> None:
    t = arr.make_arrivals("steps:0=100,10=400,20=100", duration_s=1000.0, seed=5)
    # 10..20 s is the only 400/s stretch; the rest (0..10, 20..1000) runs at 100/s.
    mid = np.count_nonzero((t >= 10) & (t < 20)) / 10.0
    first = np.count_nonzero(t < 10) / 10.0
    tail = np.count_nonzero(t >= 20) / 980.0
    assert mid == pytest.approx(400, rel=0.1)
    assert first == pytest.approx(100, rel=0.25)
    assert tail == pytest.approx(100, rel=0.03)


def test_piecewise_zero_rate_gap_and_late_start() -> None:
    t = arr.time_varying([(2.0, 300.0), (4.0, 0.0), (6.0, 300.0)], duration_s=8.0, seed=0)
    assert np.count_nonzero(t < 2.0) == 0
    assert np.count_nonzero((t >= 4.0) & (t < 6.0)) == 0
    assert np.count_nonzero(t >= 6.0) / 2.0 == pytest.approx(300, rel=0.15)


def test_rate_function_thinning() -> None:
    def rate(t: np.ndarray) -> np.ndarray:
        return np.where(t < 50.0, 50.0, 250.0)

    t = arr.time_varying(rate, duration_s=100.0, seed=4, max_rate=250.0)
    assert np.count_nonzero(t < 50) / 50 == pytest.approx(50, rel=0.1)
    assert np.count_nonzero(t >= 50) / 50 == pytest.approx(250, rel=0.05)
    # a scalar-only function works too
    s = arr.time_varying(lambda x: 20.0 + 10.0 * math.sin(x), n=500, seed=4, max_rate=30.0)
    assert len(s) == 500 and np.all(np.diff(s) >= 0)
    with pytest.raises(ValueError, match="exceeds max_rate"):
        arr.time_varying(rate, n=5000, seed=0, max_rate=100.0)  # reaches t > 50 s
    with pytest.raises(ValueError, match="max_rate"):
        arr.time_varying(rate, n=100, seed=0)


def test_sine_rate_follows_phase() -> None:
    t = arr.make_arrivals("sine:200:amp=0.5,period=40", duration_s=400.0, seed=9)
    phase = (t % 40.0) / 40.0
    high = np.count_nonzero(phase < 0.5) / 200.0  # sin > 0 half: mean 200(1 + 0.5·2/π)
    low = np.count_nonzero(phase >= 0.5) / 200.0
    assert high == pytest.approx(200 * (1 + 1 / math.pi), rel=0.05)
    assert low == pytest.approx(200 * (1 - 1 / math.pi), rel=0.05)


def test_constant_and_empty() -> None:
    assert np.allclose(arr.constant(4.0, n=3), [0.25, 0.5, 0.75])
    assert np.allclose(arr.constant(4.0, duration_s=1.0), [0.25, 0.5, 0.75])
    assert len(arr.poisson(10, n=0)) == 0 and len(arr.gamma(10, 2, duration_s=0.0)) == 0


def test_parse_spec_accepts() -> None:
    assert arr.parse_spec("poisson:200") == arr.ArrivalSpec("poisson", 200.0)
    assert arr.parse_spec(" Gamma:200:cv2=8 ").options == {"cv2": 8.0}
    s = arr.parse_spec("steps:0=100,10=400,20=100")
    assert s.steps == ((0.0, 100.0), (10.0, 400.0), (20.0, 100.0)) and s.rate == 400.0
    assert arr.parse_spec("sine:100").options == {"amp": 0.5, "period": 60.0}


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ("uniform:100", "unknown arrival kind"),
        ("poisson", "missing rate"),
        ("poisson:", "missing rate"),
        ("poisson:abc", "not a number"),
        ("poisson:-5", "rate must be > 0"),
        ("poisson:inf", "finite"),
        ("gamma:100", "missing cv2"),
        ("gamma:100:cv2=0", "cv2 must be > 0"),
        ("gamma:100:cv=2", "unknown option 'cv'"),
        ("gamma:100:cv2", "not KEY=VALUE"),
        ("poisson:100:cv2=3", "unknown option"),
        ("steps:", "expected steps"),
        ("steps:0=100,x=5", "not a number"),
        ("steps:0=100,10", "not T=RATE"),
        ("steps:10=100,5=200", "increasing"),
        ("steps:0=-1", ">= 0"),
        ("steps:0=0,5=0", "every step rate is 0"),
        ("sine:100:amp=2", "amp"),
    ],
)
def test_parse_spec_errors(spec: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        arr.parse_spec(spec)


def test_count_argument_errors() -> None:
    with pytest.raises(ValueError, match="exactly one"):
        arr.poisson(10)
    with pytest.raises(ValueError, match="exactly one"):
        arr.poisson(10, n=5, duration_s=1.0)
    with pytest.raises(ValueError, match="n must be"):
        arr.poisson(10, n=-1)
    with pytest.raises(ValueError, match="last piecewise rate is 0"):
        arr.make_arrivals("steps:0=100,5=0", n=10)

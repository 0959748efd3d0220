"""SuperServe's trace shapes: bursty (constant base + gamma variant), accelerating, and
MAF-like; their rates, burstiness (CV²), seeds and spec strings."""

from __future__ import annotations

import numpy as np
import pytest

from services.workloads import arrivals as arr


def cv2_of(times: np.ndarray) -> float:
    gaps = np.diff(times)
    return float(gaps.var() / gaps.mean() ** 2)


def dispersion(times: np.ndarray, window_s: float, duration_s: float) -> float:
    """Variance over mean of the arrival counts in consecutive windows."""
    counts = np.histogram(times, bins=np.arange(0.0, duration_s + 1e-9, window_s))[0]
    return float(counts.var() / counts.mean())


@pytest.mark.parametrize("cv2", [2.0, 4.0, 8.0])
def test_bursty_rate_and_burstiness(cv2):
    base, variant, d = 100.0, 300.0, 400.0
    t = arr.bursty(base, variant, cv2, d, seed=3)
    assert np.all(np.diff(t) >= 0) and t[-1] < d
    assert len(t) / d == pytest.approx(base + variant, rel=0.05)
    # the variant part alone has the asked squared CV; the base adds no variance, so the
    # counts' index of dispersion over long windows tends to cv2 x variant / total
    v = arr.gamma(variant, cv2, duration_s=d, seed=3)
    assert cv2_of(v) == pytest.approx(cv2, rel=0.15)
    assert dispersion(t, 10.0, d) == pytest.approx(cv2 * variant / (base + variant), rel=0.4)


def test_burstier_traces_have_burstier_counts():
    d = [dispersion(arr.bursty(100, 300, c, 300.0, seed=5), 5.0, 300.0) for c in (2, 4, 8)]
    assert d[0] < d[1] < d[2]


def test_accelerating_trace_moves_between_rates_at_tau():
    spec = "accel:100:to=400,tau=50,at=10,cv2=1"
    t = arr.make_arrivals(spec, duration_s=60.0, seed=2)
    rate = np.histogram(t, bins=np.arange(0, 61, 1.0))[0]
    assert rate[:10].mean() == pytest.approx(100, rel=0.1)      # before the change
    assert rate[17:60].mean() == pytest.approx(400, rel=0.05)   # 6 s of change at 50/s²
    assert 175 < rate[12:15].mean() < 325                       # on the way: ~250 at 13.5 s
    fn = arr.accel_rate(100, 400, 50, 10)
    assert fn(np.array([0.0, 13.0, 16.0, 99.0])).tolist() == [100, 250, 400, 400]


@pytest.mark.parametrize("cv2", [1.0, 8.0])
def test_rescaled_trace_keeps_its_cv2_at_a_constant_rate(cv2):
    t = arr.rescaled(lambda x: np.full_like(x, 500.0), cv2, 200.0, seed=9)
    assert len(t) / 200.0 == pytest.approx(500, rel=0.05)
    assert cv2_of(t) == pytest.approx(cv2, rel=0.15)


def test_maf_like_trace_has_its_mean_spikes_and_day():
    spec = arr.parse_spec("maf:200:day=120,every=20,width=2,x=3,amp=0.5")
    t = arr.make_arrivals(spec, duration_s=120.0, seed=4)
    assert len(t) / 120.0 == pytest.approx(200, rel=0.05)
    per_s = np.histogram(t, bins=np.arange(0, 121, 1.0))[0]
    spikes = per_s[[k for k in range(120) if k % 20 >= 18]]
    around = per_s[[k for k in range(120) if 12 <= k % 20 < 18]]
    assert spikes.mean() > 2 * around.mean()
    assert per_s[55:65].mean() > 2 * per_s[0:10].mean()        # midday vs the trough


def test_traces_are_seeded_and_cut_by_count_as_prefixes():
    for spec in ("bursty:50:variant=150,cv2=4", "accel:50:to=200,tau=20,at=2",
                 "maf:100:day=60,every=10,width=1"):
        a = arr.make_arrivals(spec, duration_s=20.0, seed=1)
        assert np.array_equal(a, arr.make_arrivals(spec, duration_s=20.0, seed=1))
        assert not np.array_equal(a, arr.make_arrivals(spec, duration_s=20.0, seed=2))
        n = arr.make_arrivals(spec, n=500, seed=1)
        assert len(n) == 500
        both = min(np.count_nonzero(a < 19.0), np.count_nonzero(n < 19.0))
        np.testing.assert_allclose(n[:both], a[:both])


@pytest.mark.parametrize(("spec", "msg"), [
    ("bursty:100", "missing variant"),
    ("bursty:100:variant=0,cv2=2", "variant > 0"),
    ("accel:100:to=200", "missing tau"),
    ("maf:100:width=30,every=20", "width <= every"),
    ("maf:100:amp=1.5", "amp < 1"),
])
def test_bad_trace_specs_say_what_is_wrong(spec, msg):
    with pytest.raises(ValueError, match=msg):
        arr.parse_spec(spec)

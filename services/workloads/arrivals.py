"""Request arrival processes: sorted arrival timestamps (seconds, float64), seeded.

Serving results depend on *when* requests come as much as on what they are: Poisson
arrivals are the textbook baseline, gamma inter-arrivals with CV² > 1 give the bursts
that make queues and batch sizes swing, and a time-varying rate exercises the
controllers' re-planning. Every process is a pure function of its arguments (numpy
only), and a stream cut by ``duration_s`` is a prefix of the same seed's stream cut by
a larger ``n``, so experiments of different lengths see the same early traffic.

CLI strings (:func:`make_arrivals`)::

    poisson:200                 Poisson, 200 req/s
    gamma:200:cv2=8             gamma inter-arrivals, 200 req/s, squared CV 8 (bursty)
    constant:200                evenly spaced, 200 req/s (closed-form, no randomness)
    steps:0=100,10=400,20=100   piecewise-constant Poisson rate: 100/s from t=0, 400/s
                                from t=10 s, 100/s from t=20 s on
    sine:200:amp=0.5,period=60  Poisson with rate 200·(1 + 0.5·sin(2πt/60))
    bursty:100:variant=300,cv2=8
                                SuperServe's bursty trace: 100 req/s evenly spaced (CV² 0)
                                plus 300 req/s of gamma arrivals with squared CV 8
    accel:100:to=400,tau=50,at=10,cv2=8
                                100 req/s until t=10 s, then a linear change at 50 req/s²
                                to 400 req/s, which holds; gamma gaps with squared CV 8
    maf:200:day=120,every=20,width=2,x=3,amp=0.5,cv2=1
                                Azure-Functions-like: a diurnal swing (±50 % over a 120 s
                                "day") with 2 s spikes at 3x every 20 s, mean 200 req/s
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

SeedLike = int | Sequence[int]
RateFn = Callable[[np.ndarray], np.ndarray | float]
Piecewise = Sequence[tuple[float, float]]

_CHUNK = 4096  # draws per step; numpy's generators fill arrays sequentially, so any
# chunking yields the same numbers and duration-cut streams are prefixes of n-cut ones.


def _check_count(n: int | None, duration_s: float | None) -> None:
    if (n is None) == (duration_s is None):
        raise ValueError("give exactly one of n (number of arrivals) or duration_s")
    if n is not None and (not isinstance(n, int | np.integer) or n < 0):
        raise ValueError(f"n must be a non-negative integer, got {n!r}")
    if duration_s is not None and not (math.isfinite(duration_s) and duration_s >= 0):
        raise ValueError(f"duration_s must be a finite number >= 0, got {duration_s!r}")


def _check_rate(rate_per_s: float, what: str = "rate_per_s") -> float:
    rate = float(rate_per_s)
    if not (math.isfinite(rate) and rate > 0):
        raise ValueError(f"{what} must be a finite number > 0, got {rate_per_s!r}")
    return rate


def _renewal(
    draw: Callable[[np.random.Generator, int], np.ndarray],
    n: int | None,
    duration_s: float | None,
    seed: SeedLike,
) -> np.ndarray:
    """Cumulative sums of i.i.d. gaps, cut at n arrivals or at duration_s.

    Always summed chunk by chunk, so both cuts give bit-identical common prefixes.
    """
    rng = np.random.default_rng(seed)
    parts: list[np.ndarray] = []
    t, got = 0.0, 0
    while (n is not None and got < n) or (duration_s is not None and t <= duration_s):
        times = t + np.cumsum(draw(rng, _CHUNK), dtype=np.float64)
        parts.append(times)
        t, got = float(times[-1]), got + _CHUNK
    times = np.concatenate(parts) if parts else np.zeros(0, np.float64)
    if n is not None:
        return times[:n]
    return times[: int(np.searchsorted(times, duration_s, side="left"))]


def poisson(
    rate_per_s: float,
    n: int | None = None,
    duration_s: float | None = None,
    seed: SeedLike = 0,
) -> np.ndarray:
    """Homogeneous Poisson arrivals: exponential gaps with mean 1/rate (CV² = 1)."""
    rate = _check_rate(rate_per_s)
    _check_count(n, duration_s)
    return _renewal(lambda rng, k: rng.exponential(1.0 / rate, k), n, duration_s, seed)


def gamma(
    rate_per_s: float,
    cv2: float,
    n: int | None = None,
    duration_s: float | None = None,
    seed: SeedLike = 0,
) -> np.ndarray:
    """Gamma renewal arrivals with mean gap 1/rate and squared CV ``cv2``.

    Shape 1/cv2 and scale cv2/rate: cv2 = 1 is Poisson, cv2 > 1 is bursty (many tiny
    gaps, a few long ones), cv2 < 1 is more regular than Poisson.
    """
    rate = _check_rate(rate_per_s)
    c = float(cv2)
    if not (math.isfinite(c) and c > 0):
        raise ValueError(f"cv2 must be a finite number > 0, got {cv2!r}")
    _check_count(n, duration_s)
    shape, scale = 1.0 / c, c / rate
    return _renewal(lambda rng, k: rng.gamma(shape, scale, k), n, duration_s, seed)


def constant(
    rate_per_s: float, n: int | None = None, duration_s: float | None = None
) -> np.ndarray:
    """Evenly spaced arrivals (k/rate for k = 1, 2, ...): a load with no burstiness."""
    rate = _check_rate(rate_per_s)
    _check_count(n, duration_s)
    if n is None:
        assert duration_s is not None
        n = math.ceil(duration_s * rate)
        times = np.arange(1, n + 1, dtype=np.float64) / rate
        return times[times < duration_s]
    return np.arange(1, n + 1, dtype=np.float64) / rate


def _check_piecewise(steps: Piecewise) -> tuple[np.ndarray, np.ndarray]:
    if len(steps) == 0:
        raise ValueError("a piecewise rate needs at least one (t, rate) step")
    try:
        t = np.array([float(s[0]) for s in steps], np.float64)
        r = np.array([float(s[1]) for s in steps], np.float64)
    except (TypeError, ValueError, IndexError) as exc:
        raise ValueError(f"piecewise steps must be (t_s, rate_per_s) pairs: {exc}") from None
    if not (np.all(np.isfinite(t)) and np.all(np.isfinite(r))):
        raise ValueError("piecewise step times and rates must be finite")
    if t[0] < 0 or np.any(np.diff(t) <= 0):
        raise ValueError(f"piecewise step times must be >= 0 and increasing, got {t.tolist()}")
    if np.any(r < 0):
        raise ValueError(f"piecewise rates must be >= 0, got {r.tolist()}")
    return t, r


def _piecewise_cum(t: np.ndarray, r: np.ndarray, x: float) -> float:
    """Λ(x) = ∫₀ˣ rate: the expected number of arrivals before x."""
    seg = np.append(np.diff(t), np.inf)
    return float(np.sum(r * np.clip(x - t, 0.0, seg)))


def _piecewise_inverse(t: np.ndarray, r: np.ndarray, s: np.ndarray) -> np.ndarray:
    """Λ⁻¹(s) for the cumulative intensity Λ of a piecewise-constant rate (0 before t[0])."""
    # Λ at each step start; segment i covers [t[i], t[i+1]) with rate r[i].
    lam = np.concatenate([[0.0], np.cumsum(r[:-1] * np.diff(t))])
    # The segment of each s: last i with lam[i] <= s among segments with positive rate
    # (a zero-rate segment has no arrivals, so its flat part of Λ is skipped).
    pos = np.flatnonzero(r > 0)
    i = pos[np.searchsorted(lam[pos], s, side="right") - 1]
    return t[i] + (s - lam[i]) / r[i]


def time_varying(
    rate: RateFn | Piecewise,
    n: int | None = None,
    duration_s: float | None = None,
    seed: SeedLike = 0,
    max_rate: float | None = None,
) -> np.ndarray:
    """Non-homogeneous Poisson arrivals.

    ``rate`` is either a piecewise-constant schedule ``[(t_s, rate_per_s), ...]`` (rate
    0 before the first step, the last rate holds forever), sampled exactly by inverting
    the cumulative intensity, or a function of a float64 array of times, sampled by
    thinning a Poisson process of rate ``max_rate`` (which must bound it).
    """
    _check_count(n, duration_s)
    rng = np.random.default_rng(seed)
    if not callable(rate):
        t, r = _check_piecewise(rate)
        if not np.any(r > 0):
            raise ValueError("a piecewise rate that is 0 everywhere has no arrivals")
        if n is not None and r[-1] == 0:
            raise ValueError("the last piecewise rate is 0: ask for duration_s, not n")
        # Arrivals of a unit-rate process mapped through Λ⁻¹ (same prefix property).
        end = None if duration_s is None else _piecewise_cum(t, r, duration_s)
        unit = _renewal(lambda g, k: g.standard_exponential(k), n, end, rng)
        return _piecewise_inverse(t, r, unit)

    if max_rate is None:
        raise ValueError("a rate function needs max_rate, an upper bound of the rate")
    return _thinned(rate, n, duration_s, rng, _check_rate(max_rate, "max_rate"))


def _rates_at(rate: RateFn, times: np.ndarray, lam_max: float) -> np.ndarray:
    """``rate`` at ``times``, checked: finite, non-negative, within ``lam_max``."""
    try:
        out = np.asarray(rate(times), np.float64)
    except TypeError:  # a scalar-only function (math.sin, ...): call it per time
        out = np.array([float(rate(x)) for x in times], np.float64)
    out = np.broadcast_to(out, times.shape)
    if not np.all(np.isfinite(out)) or np.any(out < 0):
        raise ValueError("the rate function returned a negative or non-finite rate")
    if np.any(out > lam_max * (1 + 1e-9)):
        raise ValueError(f"the rate function exceeds max_rate={lam_max} (max {out.max()})")
    return out


def _thinned(rate: RateFn, n: int | None, duration_s: float | None,
             rng: np.random.Generator, lam_max: float) -> np.ndarray:
    """Arrivals of rate ``rate(t)``: a Poisson process of rate ``lam_max``, each candidate
    kept with probability ``rate(t) / lam_max`` (thinning)."""
    parts: list[np.ndarray] = []
    got, t0, empty = 0, 0.0, 0
    while True:
        cand = t0 + np.cumsum(rng.exponential(1.0 / lam_max, _CHUNK))
        keep = cand[rng.random(_CHUNK) * lam_max < _rates_at(rate, cand, lam_max)]
        t0 = float(cand[-1])
        empty = 0 if len(keep) else empty + 1
        if duration_s is not None:
            parts.append(keep[keep < duration_s])
            if t0 >= duration_s:
                break
        else:
            parts.append(keep)
            got += len(keep)
            if got >= n:  # type: ignore[operator]
                break
        if n is not None and empty >= 256:
            raise ValueError(
                f"no arrival in {256 * _CHUNK} candidates up to t={t0:.3g} s: the rate "
                "function is (nearly) 0 or far below max_rate"
            )
    times = np.concatenate(parts) if parts else np.zeros(0, np.float64)
    return times if n is None else times[:n]


# ---------------------------------------------------------------------------- CLI specs


@dataclass(frozen=True)
class ArrivalSpec:
    """A parsed arrival string: kind, base rate (req/s) and options."""

    kind: str
    rate: float
    options: dict[str, float] = field(default_factory=dict)
    steps: tuple[tuple[float, float], ...] = ()


KINDS = {
    "bursty": "bursty:BASE_RATE:variant=RATE,cv2=X",
    "accel": "accel:RATE1:to=RATE2,tau=REQ_PER_S2[,at=SECONDS,cv2=X]",
    "maf": "maf:MEAN_RATE[:day=S,every=S,width=S,x=X,amp=A,cv2=X]",
    "poisson": "poisson:RATE",
    "gamma": "gamma:RATE:cv2=X",
    "constant": "constant:RATE",
    "steps": "steps:T0=RATE0,T1=RATE1,...",
    "sine": "sine:RATE:amp=A,period=SECONDS",
}
_OPTIONS = {"poisson": {}, "constant": {}, "gamma": {"cv2": None},
            "sine": {"amp": 0.5, "period": 60.0},
            "bursty": {"variant": None, "cv2": None},
            "accel": {"to": None, "tau": None, "at": 0.0, "cv2": 1.0},
            "maf": {"day": 120.0, "every": 20.0, "width": 2.0, "x": 3.0, "amp": 0.5,
                    "cv2": 1.0}}


def _num(text: str, what: str, spec: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"arrival spec {spec!r}: {what} {text!r} is not a number") from None
    if not math.isfinite(value):
        raise ValueError(f"arrival spec {spec!r}: {what} must be finite")
    return value


def parse_spec(spec: str) -> ArrivalSpec:
    """Parse ``kind:rate[:k=v,...]`` (or ``steps:t=r,...``); ValueError says what is wrong."""
    usage = "; ".join(KINDS.values())
    text = spec.strip().lower()
    kind, _, rest = text.partition(":")
    if kind not in KINDS:
        raise ValueError(f"unknown arrival kind {kind!r} in {spec!r}; expected one of: {usage}")
    if kind == "steps":
        if not rest:
            raise ValueError(f"arrival spec {spec!r}: expected {KINDS['steps']}")
        steps = []
        for item in rest.split(","):
            t_s, eq, r_s = item.partition("=")
            if not eq:
                raise ValueError(f"arrival spec {spec!r}: step {item!r} is not T=RATE")
            steps.append((_num(t_s, "step time", spec), _num(r_s, "step rate", spec)))
        _check_piecewise(steps)
        if not any(r > 0 for _, r in steps):
            raise ValueError(f"arrival spec {spec!r}: every step rate is 0")
        return ArrivalSpec("steps", max(r for _, r in steps), {}, tuple(steps))
    rate_s, _, opt_s = rest.partition(":")
    if not rate_s:
        raise ValueError(f"arrival spec {spec!r}: missing rate; expected {KINDS[kind]}")
    rate = _num(rate_s, "rate", spec)
    if rate <= 0:
        raise ValueError(f"arrival spec {spec!r}: rate must be > 0")
    options: dict[str, float] = {}
    for item in filter(None, opt_s.split(",")):
        key, eq, val = item.partition("=")
        if not eq:
            raise ValueError(f"arrival spec {spec!r}: option {item!r} is not KEY=VALUE")
        if key not in _OPTIONS[kind]:
            allowed = ", ".join(_OPTIONS[kind]) or "none"
            raise ValueError(f"arrival spec {spec!r}: unknown option {key!r} (allowed: {allowed})")
        options[key] = _num(val, key, spec)
    for key, default in _OPTIONS[kind].items():
        if key not in options:
            if default is None:
                raise ValueError(f"arrival spec {spec!r}: missing {key}=...; expected {KINDS[kind]}")
            options[key] = default
    if kind == "gamma" and options["cv2"] <= 0:
        raise ValueError(f"arrival spec {spec!r}: cv2 must be > 0")
    if kind == "sine" and not (0 <= options["amp"] <= 1 and options["period"] > 0):
        raise ValueError(f"arrival spec {spec!r}: need 0 <= amp <= 1 and period > 0")
    try:
        _check_trace_options(kind, options)
    except ValueError as exc:
        raise ValueError(f"arrival spec {spec!r}: {exc}") from None
    return ArrivalSpec(kind, rate, options)


def make_arrivals(
    spec: str | ArrivalSpec,
    n: int | None = None,
    duration_s: float | None = None,
    seed: SeedLike = 0,
) -> np.ndarray:
    """Arrival timestamps for a CLI string such as ``gamma:200:cv2=8`` (see module doc)."""
    s = parse_spec(spec) if isinstance(spec, str) else spec
    if s.kind == "poisson":
        return poisson(s.rate, n, duration_s, seed)
    if s.kind == "gamma":
        return gamma(s.rate, s.options["cv2"], n, duration_s, seed)
    if s.kind == "constant":
        return constant(s.rate, n, duration_s)
    if s.kind == "steps":
        return time_varying(list(s.steps), n, duration_s, seed)
    if s.kind in TRACE_KINDS:
        return _by_count(lambda d: trace_arrivals(s, d, seed), n, duration_s, mean_rate(s))
    if s.kind == "sine":
        amp, period = s.options["amp"], s.options["period"]
        base = s.rate

        def fn(t: np.ndarray) -> np.ndarray:
            return base * (1.0 + amp * np.sin(2.0 * np.pi * t / period))

        return time_varying(fn, n, duration_s, seed, max_rate=base * (1.0 + amp))
    raise ValueError(f"unknown arrival kind {s.kind!r}")


LIGHT_LOAD = 0.2  # utilisation of the default arrivals for a trace without its own


def light_load(full_ms: float) -> str:
    """A Poisson arrival spec that keeps one vanilla worker ``LIGHT_LOAD`` busy."""
    return f"poisson:{LIGHT_LOAD * 1000.0 / full_ms:.4g}"


STREAM_SALT = 0xA7  # a stream's arrivals draw from (seed, salt): independent of its inputs


def stream_arrivals(spec: str | ArrivalSpec, n: int, seed: int) -> np.ndarray:
    """The ``n`` arrival times of stream ``seed``: what ``trace record --arrivals``, the
    replay, the live bench and the demo all send, so one seed means one stream everywhere."""
    return make_arrivals(spec, n=n, seed=(seed, STREAM_SALT))


# ------------------------------------------------- SuperServe's trace shapes (§6.1, §6.2)

TRACE_KINDS = ("bursty", "accel", "maf")
GRID_S = 1e-3   # time step of the cumulative rate a rescaled trace is mapped through


def _check_trace_options(kind: str, o: dict[str, float]) -> None:
    if kind == "bursty" and not (o["variant"] > 0 and o["cv2"] > 0):
        raise ValueError("need variant > 0 and cv2 > 0")
    if kind == "accel" and not (o["to"] > 0 and o["tau"] > 0 and o["at"] >= 0
                                and o["cv2"] > 0):
        raise ValueError("need to > 0, tau > 0, at >= 0 and cv2 > 0")
    if kind == "maf" and not (o["day"] > 0 and o["every"] > 0 and 0 < o["width"] <= o["every"]
                              and o["x"] >= 1 and 0 <= o["amp"] < 1 and o["cv2"] > 0):
        raise ValueError("need day > 0, 0 < width <= every, x >= 1, 0 <= amp < 1, cv2 > 0")


def bursty(base_rate: float, variant_rate: float, cv2: float, duration_s: float,
           seed: SeedLike = 0) -> np.ndarray:
    """SuperServe's (and InferLine's) bursty trace: a base load of ``base_rate`` evenly
    spaced (CV² 0) merged with a variant load of ``variant_rate`` whose gaps are gamma
    with squared CV ``cv2``; the mean rate is the sum."""
    base = constant(base_rate, duration_s=duration_s) if base_rate > 0 else np.zeros(0)
    return np.sort(np.concatenate([base, gamma(variant_rate, cv2, duration_s=duration_s,
                                               seed=seed)]))


def rescaled(rate: RateFn, cv2: float, duration_s: float, seed: SeedLike = 0) -> np.ndarray:
    """Arrivals of a time-varying mean ``rate(t)`` whose gaps are gamma with squared CV
    ``cv2`` at every rate: a unit-rate gamma renewal process mapped through the inverse of
    the cumulative rate (time rescaling), so a burst has the same shape at 100 and at
    1,000 req/s. ``cv2 = 1`` is a non-homogeneous Poisson process."""
    grid = np.arange(0.0, duration_s + GRID_S, GRID_S)
    r = _rates_at(rate, grid, math.inf)
    cum = np.concatenate([[0.0], np.cumsum((r[1:] + r[:-1]) * 0.5 * GRID_S)])
    unit = gamma(1.0, cv2, duration_s=float(cum[-1]), seed=seed)
    times = np.interp(unit, cum, grid)
    return times[times < duration_s]


def accel_rate(rate1: float, rate2: float, tau: float, at_s: float) -> RateFn:
    """``rate1`` until ``at_s``, then a linear change of ``tau`` req/s² until ``rate2``."""
    ramp_s = abs(rate2 - rate1) / tau

    def fn(t: np.ndarray) -> np.ndarray:
        frac = np.clip((np.asarray(t) - at_s) / ramp_s, 0.0, 1.0) if ramp_s > 0 else (
            np.asarray(t) >= at_s).astype(np.float64)
        return rate1 + (rate2 - rate1) * frac
    return fn


def maf_rate(mean: float, day_s: float, every_s: float, width_s: float, spike_x: float,
             amp: float) -> RateFn:
    """Azure Functions' shape shrunk to minutes: a diurnal swing of ``amp`` over a
    ``day_s`` "day" (starting at its trough), with spikes of ``spike_x`` times the base,
    ``width_s`` long, every ``every_s``; scaled so the mean over whole spike periods of
    the day is ``mean``."""
    spike_share = width_s / every_s
    norm = mean / (1.0 + spike_share * (spike_x - 1.0))

    def fn(t: np.ndarray) -> np.ndarray:
        t = np.asarray(t, dtype=np.float64)
        diurnal = 1.0 - amp * np.cos(2.0 * np.pi * t / day_s)
        spike = np.where(np.mod(t, every_s) >= every_s - width_s, spike_x, 1.0)
        return norm * diurnal * spike
    return fn


def trace_arrivals(s: ArrivalSpec, duration_s: float, seed: SeedLike) -> np.ndarray:
    o = s.options
    if s.kind == "bursty":
        return bursty(s.rate, o["variant"], o["cv2"], duration_s, seed)
    if s.kind == "accel":
        return rescaled(accel_rate(s.rate, o["to"], o["tau"], o["at"]), o["cv2"],
                        duration_s, seed)
    return rescaled(maf_rate(s.rate, o["day"], o["every"], o["width"], o["x"], o["amp"]),
                    o["cv2"], duration_s, seed)


def mean_rate(s: ArrivalSpec) -> float:
    """The rate a trace spec offers on average (its final rate for ``accel``)."""
    if s.kind == "bursty":
        return s.rate + s.options["variant"]
    if s.kind == "accel":
        return min(s.rate, s.options["to"])
    return s.rate


def _by_count(make: Callable[[float], np.ndarray], n: int | None, duration_s: float | None,
              rate: float) -> np.ndarray:
    """A duration-defined trace cut at ``n`` arrivals when asked by count: generated for a
    duration long enough, doubled until it holds ``n`` (each is a prefix of the next)."""
    _check_count(n, duration_s)
    if duration_s is not None:
        return make(duration_s)
    d = max(1.0, 1.25 * n / rate)
    while True:
        times = make(d)
        if len(times) >= n:
            return times[:n]
        d *= 2.0

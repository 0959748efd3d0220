"""Online batch profile (E3 §3.1), the pure part: how much of a window's batch survives
each active ramp, fixed time windows over exit records, and how far a forecast profile is
from the observed one (drift, and MAPE/WAPE for evaluation as in E3 §5.8.2, fig. 21).

Exits are represented as everywhere else in the project (``SampleTelemetry.exit_at``, the
``exit`` of a ``Result``): the index of the ramp that answered, or ``FINAL`` (-1) when the
final layer did; ``None`` is accepted as ``FINAL`` too. Ramp indices are sites in model
order, so a larger index is deeper.

No I/O, no clocks: the profiler service reads telemetry, passes times in and stores rows.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

FINAL = -1                # exit of a sample the final layer answered
DEFAULT_WINDOW_S = 10.0   # profile window; E3 uses 2 min, ours is shorter to react sooner
# Drift: re-plan when some ramp's forecast survival is off by more than 10 points. E3
# §5.8.3 loses ~4-8 % goodput at 20 % error, so 0.1 absolute (20 % of a 50 % survival)
# re-plans before the loss is noticeable, and is well above the binomial noise of a
# window (sd <= 0.5 / sqrt(n): 0.035 at 200 samples).
DRIFT_THRESHOLD = 0.1
# A forecast is judged for drift only when the window it was made from held this many
# samples: below it one window's survival has sd up to 0.05, so window-to-window noise
# alone reaches the threshold (the first seconds of a stream, or a config's first part
# of a window).
MIN_FORECAST_SAMPLES = 100
# MAPE skips pairs whose observed survival is below this: a percentage of ~0 is undefined
# or explodes (0.005 vs 0.01 is "100 %" but harmless to the plan).
MAPE_FLOOR = 0.01

ExitValue = int | None
Profile = Sequence[float] | np.ndarray


def exit_array(exits: Iterable[ExitValue] | np.ndarray | ExitValue) -> np.ndarray:
    """Exits as an int64 array with ``None`` mapped to ``FINAL``; a single exit is one item."""
    if isinstance(exits, np.ndarray) and exits.dtype.kind in "iu":
        return exits.astype(np.int64).ravel()  # telemetry's exit_at: no per-item loop
    if exits is None or isinstance(exits, int | np.integer):
        exits = [exits]
    return np.array([FINAL if e is None else int(e) for e in exits], dtype=np.int64)


def survival(exits: Iterable[ExitValue] | np.ndarray,
             ramps: Sequence[int]) -> tuple[float, ...] | None:
    """Fraction of the window's samples still in the batch after each ramp of ``ramps``
    (sorted ascending; the result follows that order, so it is non-increasing).

    A sample is alive after ramp ``r`` unless it exited at a ramp ``<= r``. Exits at ramps
    not in ``ramps`` (a config changed inside the window) still count: that sample left
    the batch before ``r`` all the same. ``None`` for an empty window (nothing observed,
    which is not the same as "everything survives").
    """
    e = exit_array(exits)
    if e.size == 0:
        return None
    order = sorted(ramps)
    if list(ramps) != order or len(set(order)) != len(order):
        raise ValueError(f"ramps must be distinct and ascending, got {list(ramps)}")
    early = np.sort(e[e >= 0])  # any negative exit is the final layer
    gone = np.searchsorted(early, np.asarray(order, dtype=np.int64), side="right")
    return tuple(float(x) for x in (e.size - gone) / e.size)  # counts: k/n exactly


def window_start(t: float, window_s: float = DEFAULT_WINDOW_S) -> float:
    """Start of the fixed window holding time ``t`` (windows are aligned on multiples of
    ``window_s`` so every replica of the profiler cuts the same windows)."""
    if window_s <= 0:
        raise ValueError(f"window_s must be positive, got {window_s}")
    return math.floor(t / window_s) * window_s


@dataclass(frozen=True, slots=True)
class WindowExits:
    start: float          # window is [start, start + window_s)
    exits: np.ndarray     # int64, one per sample, FINAL for the final layer


def group_windows(records: Iterable[tuple[float, Iterable[ExitValue] | np.ndarray | ExitValue]],
                  window_s: float = DEFAULT_WINDOW_S) -> list[WindowExits]:
    """Group ``(t, exit)`` records (one sample) or ``(t, exit_at)`` records (one telemetry
    message, all its samples at its time) into fixed windows, oldest first. Only windows
    holding samples are returned: a gap means nothing was observed, not zero survival.
    Whether the latest window is complete is the caller's call (it owns the clock)."""
    parts: dict[float, list[np.ndarray]] = {}
    for t, exits in records:
        parts.setdefault(window_start(t, window_s), []).append(exit_array(exits))
    return [WindowExits(start, np.concatenate(parts[start])) for start in sorted(parts)
            if sum(p.size for p in parts[start])]


def _pair(forecast: Profile, observed: Profile) -> tuple[np.ndarray, np.ndarray]:
    f, o = np.asarray(forecast, dtype=float), np.asarray(observed, dtype=float)
    if f.shape != o.shape or f.ndim != 1:
        raise ValueError(f"forecast and observed must list the same ramps, got shapes "
                         f"{f.shape} and {o.shape}")
    return f, o


@dataclass(frozen=True, slots=True)
class Drift:
    errors: tuple[float, ...]   # per ramp, |forecast - observed| (what the store keeps)
    max_error: float            # 0.0 when there are no ramps
    drifted: bool               # max_error > threshold


def compare(forecast: Profile, observed: Profile,
            threshold: float = DRIFT_THRESHOLD) -> Drift:
    """Per-ramp absolute error of a forecast profile against the observed one, and whether
    it drifted: the largest error exceeds ``threshold`` (absolute survival fraction, so a
    deep ramp with little survival is judged on the same scale as the batch it sizes)."""
    f, o = _pair(forecast, observed)
    errors = np.abs(f - o)
    worst = float(errors.max()) if errors.size else 0.0
    return Drift(tuple(float(x) for x in errors), worst, worst > threshold)


def drifted(forecast: Profile | None, observed: Profile | None,
            threshold: float = DRIFT_THRESHOLD) -> bool:
    """True when some ramp's forecast is off by more than ``threshold``; False when either
    side is missing (no forecast yet, or an empty window: nothing to compare)."""
    if forecast is None or observed is None:
        return False
    return compare(forecast, observed, threshold).drifted


def _stack(forecasts: Iterable[Profile | None],
           observed: Iterable[Profile | None]) -> tuple[np.ndarray, np.ndarray]:
    """All (forecast, observed) pairs of windows where both exist, flattened over ramps."""
    fs: list[np.ndarray] = []
    os_: list[np.ndarray] = []
    for f, o in zip(forecasts, observed, strict=True):
        if f is None or o is None:
            continue
        fa, oa = _pair(f, o)
        fs.append(fa)
        os_.append(oa)
    if not fs:
        return np.zeros(0), np.zeros(0)
    return np.concatenate(fs), np.concatenate(os_)


def mape(forecasts: Iterable[Profile | None], observed: Iterable[Profile | None],
         floor: float = MAPE_FLOOR) -> float | None:
    """Mean absolute percentage error, in percent (12.5 means 12.5 %), over every window
    and ramp: ``100 * mean(|F - A| / A)``, the standard definition (relative to the
    observed ``A``). Windows where either profile is None are skipped; so are pairs with
    ``A < floor``, where a percentage is undefined or meaningless. None when no pair is
    left. ``wape`` is the zero-robust alternative."""
    f, o = _stack(forecasts, observed)
    keep = o >= floor
    if not keep.any():
        return None
    return float(100.0 * np.mean(np.abs(f[keep] - o[keep]) / o[keep]))


def wape(forecasts: Iterable[Profile | None],
         observed: Iterable[Profile | None]) -> float | None:
    """Weighted absolute percentage error, in percent: ``100 * sum|F - A| / sum A`` over
    every window and ramp (the MAE divided by the mean observed survival). Zeros need no
    special case: they weigh by their size. None when the observed total is 0."""
    f, o = _stack(forecasts, observed)
    total = float(np.abs(o).sum())
    if total == 0.0:
        return None
    return float(100.0 * np.abs(f - o).sum() / total)


def sampling_mape(observed: Iterable[float], samples: Iterable[int],
                  floor: float = MAPE_FLOOR) -> float | None:
    """The MAPE (percent) a forecaster that knew each window's true survival exactly would
    still score, from sampling alone: a window of ``n`` samples observes a survival ``p``
    as Binomial(n, p) / n, whose mean absolute deviation is about
    ``sqrt(2 / pi) * sqrt(p (1 - p) / n)``. Evaluated at the observed ``p``; pairs below
    ``floor`` or with no samples are skipped as in ``mape``. None when none is left."""
    p = np.asarray(list(observed), dtype=np.float64)
    n = np.asarray(list(samples), dtype=np.float64)
    keep = (p >= floor) & (n > 0)
    if not keep.any():
        return None
    p, n = p[keep], n[keep]
    return float(100.0 * np.mean(math.sqrt(2.0 / math.pi) * np.sqrt((1.0 - p) / (p * n))))

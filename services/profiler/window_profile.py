"""One profile window of one model, the profiler's decision (pure): from the exits of the
window's requests, the survival after each tracked ramp, whether the forecast made for
this window drifted from it, and the forecasts (ARIMA and naive) for the next window.

Tracked ramps are the active ramps of the exit config the window's requests were served
under, plus any ramp that answered some of them (a config changed inside the window).
History is per ramp, oldest first, of earlier windows' observed survival.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from services.profiler.batch_profile import (
    DRIFT_THRESHOLD,
    FINAL,
    MIN_FORECAST_SAMPLES,
    Drift,
    compare,
    survival,
)
from services.profiler.survival_forecast import (
    MAX_HISTORY,
    ArimaForecaster,
    Forecaster,
    NaiveForecaster,
    forecast_profile,
)


@dataclass(frozen=True)
class WindowProfile:
    ramps: tuple[int, ...]           # tracked ramps, ascending
    samples: int
    observed: tuple[float, ...]      # survival after each tracked ramp
    drift: Drift | None              # None: no forecast was made for every tracked ramp
    forecast: tuple[float, ...]      # next window, ARIMA (what plans use)
    naive: tuple[float, ...]         # next window, last value

    @property
    def drifted(self) -> bool:
        return self.drift is not None and self.drift.drifted


def tracked_ramps(exit_counts: Mapping[int | None, int], active: Sequence[int]) -> tuple[int, ...]:
    exited = {int(e) for e, n in exit_counts.items() if e is not None and e >= 0 and n > 0}
    return tuple(sorted(exited | {int(r) for r in active}))


def exits_of(exit_counts: Mapping[int | None, int]) -> np.ndarray:
    """One exit per sample from ``{exit: count}`` (None is the final layer)."""
    keys = [FINAL if e is None else int(e) for e in exit_counts]
    return np.repeat(np.asarray(keys, dtype=np.int64),
                     np.asarray([int(n) for n in exit_counts.values()], dtype=np.int64))


def profile_window(exit_counts: Mapping[int | None, int], active: Sequence[int],
                   history: Mapping[int, Sequence[float]],
                   forecast_made: Mapping[int, float] | None = None,
                   threshold: float = DRIFT_THRESHOLD,
                   forecaster: Forecaster | None = None) -> WindowProfile | None:
    """The window's profile, or None when it held no sample (nothing observed, which is
    not "everything survived") or no ramp is tracked (vanilla: nothing to profile)."""
    ramps = tracked_ramps(exit_counts, active)
    exits = exits_of(exit_counts)
    if not ramps or exits.size == 0:
        return None
    observed = survival(exits, ramps)
    assert observed is not None  # exits is not empty
    drift = None
    if forecast_made is not None and all(r in forecast_made for r in ramps):
        drift = compare([forecast_made[r] for r in ramps], observed, threshold)
    series = [[*list(history.get(r, ()))[-(MAX_HISTORY - 1):], s]
              for r, s in zip(ramps, observed, strict=True)]
    arima = forecast_profile(series, forecaster or ArimaForecaster())
    naive = forecast_profile(series, NaiveForecaster())
    return WindowProfile(ramps, int(exits.size), observed, drift, arima, naive)


def same_regime(rows: Sequence[Mapping], start: float, ramps: Sequence[int],
                version: int | None, min_samples: int = MIN_FORECAST_SAMPLES
                ) -> tuple[dict[int, list[float]], dict[int, float] | None]:
    """What of the stored profile speaks for the window at ``start``: the history of the
    windows right before it that tracked the same ramps under the same exit config, and the
    forecast made for it if it was made under that config for exactly those ramps, from a
    window of at least ``min_samples`` samples (None otherwise). A change of thresholds or
    of the ramps a plan runs moves survival by design: windows from before it are another
    series, and a forecast across it is no drift. A forecast from a handful of samples (the
    first seconds of a stream or of a config) is their noise: judging it would re-plan on it.

    ``rows``: stored rows as mappings with ``start`` (unix seconds), ``ramp``,
    ``config_version``, ``observed``, ``forecast`` and ``samples`` (None: unknown)."""
    want = {int(r) for r in ramps}
    windows: dict[float, list[Mapping]] = {}
    for r in rows:
        windows.setdefault(float(r["start"]), []).append(r)
    made = None
    mine = windows.get(float(start), [])
    if ({int(r["ramp"]) for r in mine} == want and want
            and all(r["forecast"] is not None and r["config_version"] == version for r in mine)):
        made = {int(r["ramp"]): float(r["forecast"]) for r in mine}
    history: dict[int, list[float]] = {}
    base: int | None = None  # samples of the newest window before: the forecast's own
    for s in sorted((s for s in windows if s < start), reverse=True):
        seen = [r for r in windows[s] if r["observed"] is not None]
        if ({int(r["ramp"]) for r in seen} != want
                or any(r["config_version"] != version for r in seen)):
            break
        if base is None:
            base = min((r.get("samples") or 0) for r in seen)
        for r in seen:
            history.setdefault(int(r["ramp"]), []).insert(0, float(r["observed"]))
    if base is None or base < min_samples:
        made = None
    return history, made

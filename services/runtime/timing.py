"""Timing model parts on a shared machine: medians, alternating pairs and interleaved rounds,
so a slow spell lands on everything compared alike. ``offramp prepare`` and the profiler
measure through these and the code stage workers run."""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable

import numpy as np


class Cancelled(Exception):
    """Raised when ``should_stop`` says so between runs (a service shutting down)."""


def _check(should_stop: Callable[[], bool] | None) -> None:
    if should_stop is not None and should_stop():
        raise Cancelled("timing stopped")


def median_ms(fn: Callable[[], object], runs: int = 20, warmup: int = 3,
              budget_s: float = math.inf, min_runs: int = 1,
              should_stop: Callable[[], bool] | None = None) -> tuple[float, int]:
    """(median ms, timed runs) of ``fn``: ``runs`` timed runs after ``warmup`` untimed ones,
    fewer (but at least ``min_runs``) once ``budget_s`` is spent, so a slow part does not hold
    a measurement for minutes. Raises :class:`Cancelled` when ``should_stop()``."""
    start = time.perf_counter()
    for _ in range(warmup):
        _check(should_stop)
        fn()
    times: list[float] = []
    while len(times) < runs:
        _check(should_stop)
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e3)
        if len(times) >= min_runs and time.perf_counter() - start > budget_s:
            break
    return round(statistics.median(times), 4), len(times)


def marginal_ms(with_it: Callable[[], object], without: Callable[[], object],
                max_runs: int = 401, min_runs: int = 41, budget_s: float = 1.0) -> float:
    """Median extra time of ``with_it`` over ``without``, timed in alternating pairs so
    machine noise hits both alike (which call goes first alternates too: the second of a
    pair finds warmer caches); many pairs for cheap calls (a ramp head costs microseconds),
    at least ``min_runs`` for slow ones; never below a microsecond."""
    for _ in range(3):
        with_it()
        without()
    diffs: list[float] = []
    start = time.perf_counter()
    while len(diffs) < max_runs and (len(diffs) < min_runs
                                     or time.perf_counter() - start < budget_s):
        first, second = (with_it, without) if len(diffs) % 2 == 0 else (without, with_it)
        t = time.perf_counter()
        first()
        t1 = time.perf_counter()
        second()
        t2 = time.perf_counter()
        extra = (t1 - t) - (t2 - t1)
        diffs.append(extra if first is with_it else -extra)
    return round(max(statistics.median(diffs) * 1e3, 0.001), 4)


def interleaved_median_ms(fns: list[Callable[[], object]], runs: int = 20, warmup: int = 3
                          ) -> list[float]:
    """Median ms of each of ``fns``, timed in rounds (one call of each per round). Timed one
    after another, a slow spell can put a site's prefix after a later one's, and the latency
    profile, which keeps prefixes in model order, then prices every later ramp as late."""
    for _ in range(warmup):
        for fn in fns:
            fn()
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(runs):
        for k, fn in enumerate(fns):
            t = time.perf_counter()
            fn()
            times[k].append((time.perf_counter() - t) * 1e3)
    return [round(statistics.median(t), 4) for t in times]


def tile(inputs: dict[str, np.ndarray], b: int) -> dict[str, np.ndarray]:
    """A batch of ``b`` copies of the first sample of each input."""
    return {k: np.ascontiguousarray(np.repeat(v[:1], b, axis=0)) for k, v in inputs.items()}


def costs_by_batch(fn: Callable[[int], object], sizes: tuple[int, ...]) -> dict[str, float]:
    """Median ms of ``fn(b)`` for each batch size ``b`` (fewer runs for the slower batches)."""
    return {str(b): median_ms(lambda b=b: fn(b), runs=10 if b > 1 else 20)[0] for b in sizes}

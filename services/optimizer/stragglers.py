"""Straggler detection (E3 §3.2, pure): a worker whose batches run slower than its device
class's profile says, by more than ``margin`` (1.5x), and slower than its peers by as much,
in ``windows`` (3) windows in a row, is a straggler; the optimizer marks it in the store and
leaves it out of the next plan (it is not stopped). It is taken back after as many windows
in a row within the margin.

Per window the watch gets each worker's batches as (rows, ms) from its heartbeats, and the
expected ms of its stage at the window's mean batch size from the latency profile. The
peers are the other workers judged in the window, each against its own class's profile
(their median slowdown). When every worker runs slow alike, the profile is what is off (a
machine under load, co-located workers sharing cores), not one of them: dropping a busy
worker there halves a stage's capacity at the moment it is needed.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass, field

MARGIN = 1.5
WINDOWS = 3
MIN_BATCHES = 3  # a window with fewer batches of a worker says nothing about it


@dataclass
class WorkerWindow:
    batches: int = 0
    rows: float = 0.0
    ms: float = 0.0


@dataclass
class StragglerWatch:
    margin: float = MARGIN
    windows: int = WINDOWS
    current: dict[str, WorkerWindow] = field(default_factory=dict)
    slow_streak: dict[str, int] = field(default_factory=dict)
    fast_streak: dict[str, int] = field(default_factory=dict)
    stragglers: set[str] = field(default_factory=set)

    def observe(self, worker: str, batches: int, rows: float, ms: float) -> None:
        """``batches`` batches of ``rows`` samples in all, ``ms`` of compute in all."""
        if batches <= 0:
            return
        w = self.current.setdefault(worker, WorkerWindow())
        w.batches += batches
        w.rows += rows
        w.ms += ms

    def close_window(self, expected_ms: Callable[[str, float], float | None]
                     ) -> tuple[set[str], set[str]]:
        """End the window: ``expected_ms(worker, mean batch)`` is what one batch should
        take (None: unknown). Returns (newly marked, newly cleared) workers."""
        marked, cleared = set(), set()
        ratio = {}
        for worker, w in self.current.items():
            if w.batches < MIN_BATCHES:
                continue
            expect = expected_ms(worker, w.rows / w.batches)
            if expect is not None and expect > 0:
                ratio[worker] = (w.ms / w.batches) / expect
        for worker, r in ratio.items():
            peers = [v for k, v in ratio.items() if k != worker]
            slow = r > self.margin * max(1.0, statistics.median(peers) if peers else 1.0)
            streak, other = (self.slow_streak, self.fast_streak) if slow else \
                (self.fast_streak, self.slow_streak)
            streak[worker] = streak.get(worker, 0) + 1
            other[worker] = 0
            if slow and worker not in self.stragglers and streak[worker] >= self.windows:
                self.stragglers.add(worker)
                marked.add(worker)
            elif not slow and worker in self.stragglers and streak[worker] >= self.windows:
                self.stragglers.discard(worker)
                cleared.add(worker)
        self.current = {}
        return marked, cleared

"""Bounded earliest-deadline-first queue of admitted requests (pure: no I/O, no clock)."""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass
from typing import Any


@dataclass(slots=True, eq=False)
class Pending:
    """One admitted request. Times are seconds on the router's monotonic clock."""

    id: str
    model: str
    reply: str
    inputs: dict[str, Any]
    arrival: float
    deadline: float
    replied: bool = False
    attempts: int = 0
    received_wall: float = 0.0
    sent_reply: str | None = None  # the reply subject its worker holds (once dispatched)


class QueueFull(Exception):
    pass


class EDFQueue:
    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._heap: list[tuple[float, int, Pending]] = []
        self._seq = itertools.count()

    def __len__(self) -> int:
        return len(self._heap)

    def push(self, item: Pending, force: bool = False) -> None:
        """Admit ``item``; ``force`` re-admits work that was already accepted (worker loss)."""
        if not force and len(self._heap) >= self.limit:
            raise QueueFull
        heapq.heappush(self._heap, (item.deadline, next(self._seq), item))

    def peek(self) -> Pending | None:
        return self._heap[0][2] if self._heap else None

    def pop(self, n: int) -> list[Pending]:
        """The ``n`` most urgent requests, earliest deadline first."""
        out = []
        while self._heap and len(out) < n:
            out.append(heapq.heappop(self._heap)[2])
        return out

    def expire(self, now: float) -> list[Pending]:
        """Remove and return every request whose deadline has passed."""
        out = []
        while self._heap and self._heap[0][0] <= now:
            out.append(heapq.heappop(self._heap)[2])
        return out

    def drain(self) -> list[Pending]:
        out = [entry[2] for entry in self._heap]
        self._heap.clear()
        return out

    def earliest_deadlines(self, n: int) -> list[float]:
        """The deadlines of the ``n`` most urgent requests, earliest first."""
        return [e[0] for e in heapq.nsmallest(n, self._heap)] if n > 0 else []

    def oldest_arrival(self) -> float | None:
        return min((e[2].arrival for e in self._heap), default=None)

"""Batch fusion for a later stage in compute mode (pure; E3 §3.3): the partial batches
earlier stages send after their exits are held and fused back up to the stage's target
batch, so the stage runs full batches although every batch shrinks at every ramp.

A partial batch is held only while its requests can afford it: the fused batch leaves as
soon as it reaches the target, when the earliest deadline among the held parts leaves no
more than the stage's service time (plus what the plan allows as slack), or when the
oldest part has waited ``max_hold_ms``. Parts (one upstream batch each: its activations
travel together) are fused earliest deadline first. With a ``split`` (the payload's first
k rows and the rest) the part that would pass the target is cut there and its rest stays
held, so every full batch is exactly the target: whole parts of survivors that are more
than half a batch (a cut where most samples go on) would otherwise fuse one at a time, at
little more than half the batch the plan is sized for. Without one, parts are fused whole
and a fused batch never exceeds the target unless one part alone does."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Part(Generic[T]):
    rows: int
    deadline: float   # earliest deadline of its requests (s, the caller's clock)
    arrived: float
    payload: T


@dataclass(slots=True)
class FusionBuffer(Generic[T]):
    target: int             # the stage's target batch (from the plan)
    service_ms: float       # expected time of one fused batch through the rest
    max_hold_ms: float      # longest a part may wait for company
    parts: list[Part[T]] = field(default_factory=list)
    split: Callable[[T, int], tuple[T, T]] | None = None  # payload, k -> first k rows, rest

    def __post_init__(self) -> None:
        if self.target < 1 or self.service_ms < 0 or self.max_hold_ms < 0:
            raise ValueError("target >= 1, service_ms >= 0 and max_hold_ms >= 0 required")

    @property
    def rows(self) -> int:
        return sum(p.rows for p in self.parts)

    def add(self, part: Part[T]) -> None:
        self.parts.append(part)
        self.parts.sort(key=lambda p: p.deadline)

    def flush_at(self) -> float | None:
        """When the held parts must leave even if the batch is not full (None: nothing
        held): the earliest deadline less the service time, or the oldest part's hold
        limit, whichever comes first."""
        if not self.parts:
            return None
        by_deadline = self.parts[0].deadline - self.service_ms / 1e3
        by_hold = min(p.arrived for p in self.parts) + self.max_hold_ms / 1e3
        return min(by_deadline, by_hold)

    def take(self, now: float) -> list[Part[T]]:
        """The parts of the next fused batch if one should run now, else []: a full batch
        whenever the held rows reach the target, or whatever is held once ``flush_at``
        has come."""
        if not self.parts:
            return []
        due = self.flush_at()
        if self.rows < self.target and (due is None or now < due):
            return []
        out: list[Part[T]] = []
        rows = 0
        for k, p in enumerate(list(self.parts)):
            room = self.target - rows
            if p.rows > room and self.split is not None:
                head, rest = self.split(p.payload, room)
                self.parts[k] = Part(p.rows - room, p.deadline, p.arrived, rest)
                out.append(Part(room, p.deadline, p.arrived, head))
                return self._taken(out, whole=len(out) - 1)
            if out and p.rows > room:
                continue  # a later, smaller part may still fit
            out.append(p)
            rows += p.rows
            if rows >= self.target:
                break
        return self._taken(out, whole=len(out))

    def _taken(self, out: list[Part[T]], whole: int) -> list[Part[T]]:
        """``out``, whose first ``whole`` parts leave the buffer (a split part's rest stays)."""
        for p in out[:whole]:
            self.parts.remove(p)
        return out

    def drain(self) -> list[Part[T]]:
        """Everything held (a role change or shutdown hands it back)."""
        out, self.parts = self.parts, []
        return out

"""Batching policies: given the state of a model's queue, how many requests to dispatch now.

A policy is pure: it sees a :class:`QueueView` and returns a :class:`BatchDecision`. The
router calls it whenever a first-stage worker has credit. SlackFit (SuperServe) plugs
in through the same interface.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class QueueView:
    size: int                # requests waiting
    oldest_wait_ms: float    # how long the oldest has waited
    min_slack_ms: float      # time left before the earliest deadline, minus the service estimate
    deadline_ms: float = float("inf")  # time left before the earliest deadline (slack-driven
    # variant policies subtract their own, per-variant, batch time)
    slowdown: float = 1.0    # live batch times over profiled ones (variant policies scale by it)
    workers: int = 1         # workers serving the queue (variant policies drain it over them)
    deadlines_ms: tuple[float, ...] = ()  # time left before the deadlines of the most urgent
    # requests, earliest first (a batch's worth; empty: read as the earliest one's)


@dataclass(frozen=True, slots=True)
class BatchDecision:
    batch_size: int          # 0 = wait
    wait_ms: float = 0.0     # when waiting: re-ask after this long
    variant: str | None = None  # the subnet or depth cap the batch runs (None: the model)


class Policy(Protocol):
    name: str

    def decide(self, view: QueueView) -> BatchDecision: ...


@dataclass(frozen=True)
class FixedBatchPolicy:
    """Dispatch ``max_batch`` when that many wait; a partial batch once the oldest request
    has waited ``timeout_ms`` or the earliest deadline leaves no slack for waiting."""

    max_batch: int = 16
    timeout_ms: float = 0.0
    name: str = "fixed"

    def decide(self, view: QueueView) -> BatchDecision:
        if view.size <= 0:
            return BatchDecision(0)
        if view.size >= self.max_batch:
            return BatchDecision(self.max_batch)
        remaining = self.timeout_ms - view.oldest_wait_ms
        if remaining <= 0 or view.min_slack_ms <= remaining:
            return BatchDecision(view.size)
        return BatchDecision(0, wait_ms=remaining)


POLICIES = {"fixed": FixedBatchPolicy}


def make_policy(name: str, max_batch: int, timeout_ms: float) -> Policy:
    if name not in POLICIES:
        raise ValueError(f"unknown batching policy {name!r}; known: {', '.join(POLICIES)}")
    return POLICIES[name](max_batch=max_batch, timeout_ms=timeout_ms)

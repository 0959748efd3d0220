"""When the optimizer makes a new plan (E3 §3.2 re-plans as the workload and the cluster
change), pure: the first time, when the pool inventory changed (a worker joined, left, or
was marked a straggler) or a device class got its latency profile, when a batch-profile
window drifted from its forecast since the last plan, when the request rate moved by more
than ``RATE_CHANGE`` since the plan, and on a timer.

A stream younger than one profile window has no rate yet (:data:`UNMEASURED`): a plan
sized for the few requests seen so far would start a burst on one replica and leave the
rest of the pool idle until the next look, so until then the plan is the most the pool
can serve, and the first measured rate re-plans it down.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

DEFAULT_INTERVAL_S = 120.0
# Re-plan when the rate is this far (relative) from the one planned for: replicas are
# sized by the rate, and E3's batch fill time too; half again or half less changes both.
RATE_CHANGE = 0.5
MIN_RATE = 1.0  # below this (req/s) the rate is noise: no re-plan for it
UNMEASURED = math.inf  # the rate of a stream younger than a window: plan for the whole pool


@dataclass(frozen=True)
class Basis:
    """What the plan in force was made from."""

    made_at: float                                # unix seconds
    inventory: Mapping[str, Sequence[str]]        # device class -> pool worker ids
    drift_seen: datetime | None                   # the newest drifted window it accounted for
    profiled: frozenset[str] = frozenset()        # device classes that had a latency profile
    rate: float = 0.0                             # requests per second it was planned for


def inventory_change(old: Mapping[str, Sequence[str]],
                     new: Mapping[str, Sequence[str]]) -> str | None:
    """'+a -b' for workers that joined and left (by id, any class), None when the same."""
    def flat(inv: Mapping[str, Sequence[str]]) -> set[str]:
        return {f"{w}@{d}" for d, ids in inv.items() for w in ids}

    joined, left = sorted(flat(new) - flat(old)), sorted(flat(old) - flat(new))
    if not joined and not left:
        return None
    return " ".join([*(f"+{w}" for w in joined), *(f"-{w}" for w in left)])


def rate_moved(planned: float, now: float) -> bool:
    if math.isinf(planned) or math.isinf(now):  # measured now, or no longer
        return math.isinf(planned) != math.isinf(now)
    if max(planned, now) < MIN_RATE:
        return False
    return abs(now - planned) > RATE_CHANGE * max(planned, MIN_RATE)


def request_rate(count: int, span_s: float, first_age_s: float | None,
                 floor_s: float) -> float:
    """Requests per second over the last ``span_s`` seconds, which held ``count`` requests,
    the first ``first_age_s`` ago: over the part of the span since that first request, so
    a stream that began within the span is not diluted by the quiet before it. A stream
    younger than ``floor_s`` (one window) is :data:`UNMEASURED`: a handful of requests
    does not tell a trickle from the start of a burst. No requests: 0."""
    if count <= 0 or first_age_s is None:
        return 0.0
    if first_age_s < floor_s:
        return UNMEASURED
    return count / min(span_s, first_age_s)


def replan_reason(basis: Basis | None, now: float, inventory: Mapping[str, Sequence[str]],
                  newest_drift: datetime | None,
                  interval_s: float = DEFAULT_INTERVAL_S,
                  profiled: frozenset[str] | None = None,
                  rate: float | None = None) -> str | None:
    """Why to plan now, or None to keep the plan in force (``profiled`` and ``rate``: not
    looked at when None)."""
    if basis is None:
        return "first plan"
    change = inventory_change(basis.inventory, inventory)
    if change is not None:
        return f"inventory: {change}"
    if profiled is not None and profiled - basis.profiled:
        return f"profiles: {', '.join(sorted(profiled - basis.profiled))} now profiled"
    if rate is not None and rate_moved(basis.rate, rate):
        if math.isinf(rate):
            return "load: a stream began (its rate not measured yet)"
        if math.isinf(basis.rate):
            return f"load: {rate:.3g} req/s, planned for the whole pool before it was measured"
        return f"load: {rate:.3g} req/s, planned for {basis.rate:.3g}"
    if newest_drift is not None and (basis.drift_seen is None
                                     or newest_drift > basis.drift_seen):
        return f"drift: the window of {newest_drift.isoformat()} left its forecast"
    if now - basis.made_at >= interval_s:
        return f"timer: {interval_s:g} s since the last plan"
    return None

"""The router's admission and dispatch rules (pure: no I/O, no clock; callers pass ``now``).

Times are seconds on the router's monotonic clock; names ending in ``_ms`` are milliseconds.
The service estimate is the router's expected dispatch -> release time of one batch.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from schemas import errors
from services.router.edf_queue import EDFQueue, Pending
from services.router.policy import QueueView

MAX_ATTEMPTS = 3             # dispatches of one request before giving up after worker losses
NO_WORKER_GRACE_S = 2.0      # a model with no live worker this long answers no_workers
# A request its first stage released (its batch went on to a later stage) that nobody has
# answered this long past its deadline was lost with a later stage's worker: a live worker
# answers a late request itself (deadline_exceeded) as soon as it gets to it.
DOWNSTREAM_GRACE_S = 5.0
SERVICE_FLOOR_MS = 5.0       # the first estimate never promises less than this
FIRST_ESTIMATE_FACTOR = 2.0  # the profiled full-model time leaves out queueing and transfer
SERVICE_EWMA_WEIGHT = 0.2    # weight of the newest batch in the running estimate
MIN_REASK_MS = 0.1           # a policy's wait of ~0 must not make the dispatch loop spin
SAMPLE_ENVELOPE_BYTES = 256  # per request in a batch message: id, reply subject, age
BATCH_ENVELOPE_BYTES = 64 * 1024


@dataclass(frozen=True, slots=True)
class Refusal:
    """An error reply the router owes a request: a stable code and a message for the client."""

    code: str
    message: str


# ---------------------------------------------------------------- intake


def request_deadline(now: float, slo_ms: float | None, default_slo_ms: float) -> float:
    """The deadline of a request arriving at ``now``: its own SLO, else the default one."""
    slo = slo_ms if slo_ms is not None else default_slo_ms
    return now + slo / 1000.0


def refuse_for_no_workers(has_worker: bool, now: float, started: float,
                          grace_s: float = NO_WORKER_GRACE_S) -> bool:
    """No first-stage worker: refuse at once, except just after the router started, when
    workers have not had the time to announce themselves yet."""
    return not has_worker and now - started > grace_s


# ---------------------------------------------------------------- service estimate


def initial_service_ms(full_ms: float) -> float:
    """Estimate before any batch came back, from the profiled time of the whole model."""
    return max(SERVICE_FLOOR_MS, FIRST_ESTIMATE_FACTOR * full_ms)


def updated_service_ms(service_ms: float, elapsed_ms: float) -> float:
    """EWMA: follows load changes within a few batches and shrugs off a single outlier."""
    return (1.0 - SERVICE_EWMA_WEIGHT) * service_ms + SERVICE_EWMA_WEIGHT * elapsed_ms


# ---------------------------------------------------------------- dispatch


def queue_view(queue: EDFQueue, now: float, service_ms: float,
               slowdown: float = 1.0, workers: int = 1, urgent: int = 0) -> QueueView:
    """What the batching policy sees of a non-empty queue; the slack already has the
    service estimate taken off, so 0 means dispatch now or miss the earliest deadline.
    ``urgent``: how many of the earliest deadlines to show (variant policies weigh what a
    batch would save)."""
    head = queue.peek()
    assert head is not None, "queue_view of an empty queue"
    oldest = queue.oldest_arrival() or now
    left_ms = (head.deadline - now) * 1e3
    return QueueView(size=len(queue), oldest_wait_ms=(now - oldest) * 1e3,
                     min_slack_ms=left_ms - service_ms, deadline_ms=left_ms,
                     slowdown=slowdown, workers=max(1, workers),
                     deadlines_ms=tuple((d - now) * 1e3
                                        for d in queue.earliest_deadlines(urgent)))


SLOWDOWN_RANGE = (1.0, 10.0)  # live over profiled batch time: never read as faster than
# profiled (hops inflate each sample a little) nor beyond 10x (a stalled batch)


def updated_slowdown(slowdown: float, elapsed_ms: float, expected_ms: float) -> float:
    """EWMA of a variant batch's dispatch-to-release time over its profiled batch time:
    a profile taken on an idle machine promises more than a loaded one gives, and a
    slack-driven policy that trusts it overruns its deadlines."""
    if expected_ms <= 0:
        return slowdown
    lo, hi = SLOWDOWN_RANGE
    ratio = min(hi, max(lo, elapsed_ms / expected_ms))
    return (1.0 - SERVICE_EWMA_WEIGHT) * slowdown + SERVICE_EWMA_WEIGHT * ratio


def reask_after_s(wait_ms: float) -> float:
    """When to ask a policy again that chose to wait ``wait_ms``."""
    return max(wait_ms, MIN_REASK_MS) / 1000.0


def payload_batch_cap(batch_size: int, sample_bytes: int, max_payload: int) -> int:
    """Largest batch (at most ``batch_size``, at least 1) whose message fits ``max_payload``;
    one oversized request still goes out alone and fails with a clear error."""
    budget = max_payload - BATCH_ENVELOPE_BYTES
    return max(1, min(batch_size, budget // (sample_bytes + SAMPLE_ENVELOPE_BYTES)))


def dispatch_estimate_ms(measured_ms: float, busy: bool, profiled, size: int,
                         slowdown: float, overhead_ms: float) -> float:
    """How long a batch about to go out should take, for screening out requests it cannot
    save. ``measured_ms``: the EWMA of recent batches. A variant batch's own profiled time
    (``profiled``: its ``VariantProfile``) at the live slowdown, plus the hops, is the
    better guess: the EWMA mixes every variant's batches, and a fast variant chosen for a
    late queue would have its requests refused on the slow ones' mean. Behind a batch the
    worker already runs (``busy``), the EWMA is added."""
    if profiled is None:
        return measured_ms
    own = profiled.latency(size) * slowdown + overhead_ms
    return own + measured_ms if busy else own


def can_finish_in_time(now: float, deadline: float, service_ms: float) -> bool:
    return now + service_ms / 1000.0 <= deadline


@dataclass(slots=True)
class Screened:
    """Requests popped for a batch, sorted: those to send and those to refuse."""

    send: list[Pending] = field(default_factory=list)
    refuse: list[tuple[Pending, Refusal]] = field(default_factory=list)


def screen_for_dispatch(entries: Iterable[Pending], now: float, service_ms: float) -> Screened:
    """Already answered requests are dropped; a request that cannot finish before its
    deadline is refused now rather than spending a worker's time on a late answer."""
    out = Screened()
    for e in entries:
        if e.replied:
            continue
        if can_finish_in_time(now, e.deadline, service_ms):
            out.send.append(e)
        else:
            out.refuse.append((e, Refusal(
                errors.DEADLINE_EXCEEDED,
                f"cannot finish within the SLO: about {service_ms:.1f} ms needed, "
                f"{(e.deadline - now) * 1e3:.1f} ms left")))
    return out


# ---------------------------------------------------------------- worker loss and deadlines


@dataclass(slots=True)
class LossOutcome:
    """What becomes of the requests a lost worker held."""

    requeue: list[Pending] = field(default_factory=list)
    give_up: list[tuple[Pending, Refusal]] = field(default_factory=list)


def after_worker_loss(entries: Iterable[Pending], max_attempts: int = MAX_ATTEMPTS) -> LossOutcome:
    """Unanswered requests go back to the queue (past-deadline ones are then expired from
    it like any queued request) unless they have used ``max_attempts`` dispatches: a
    request that keeps losing its worker may be what kills them."""
    out = LossOutcome()
    for e in entries:
        if e.replied:
            continue
        if e.attempts >= max_attempts:
            out.give_up.append((e, Refusal(errors.NO_WORKERS,
                                           f"{e.attempts} workers were lost while serving it")))
        else:
            out.requeue.append(e)
    return out


@dataclass(frozen=True, slots=True)
class WorkerAbsence:
    since: float | None  # when the model was first seen without a first-stage worker
    drain: bool          # answer every queued request no_workers now


def track_worker_absence(has_worker: bool, since: float | None, now: float, queued: int,
                         grace_s: float = NO_WORKER_GRACE_S) -> WorkerAbsence:
    """Queued requests wait ``grace_s`` for a worker to come (back), then are refused."""
    if has_worker:
        return WorkerAbsence(None, False)
    if since is None:
        return WorkerAbsence(now, False)
    return WorkerAbsence(since, now - since > grace_s and queued > 0)


def client_error_code(code: object) -> str:
    """A worker's error code reaches clients only if it is one of the stable codes."""
    return code if isinstance(code, str) and code in errors.CODES else errors.INTERNAL

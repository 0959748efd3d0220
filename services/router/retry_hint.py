"""The ``retry_after_ms`` of an ``overloaded`` reply, and the router's own check of it
(pure: no I/O, no clock; callers pass ``now``, seconds on the router's monotonic clock).

The hint says how long the queue a refused request met takes to drain: until the request
that will be answered last (the queue's *tail*, the latest deadline in EDF order) has its
answer, served or expired. ``HintAudit`` measures exactly that, per refusal, so the hint's
accuracy is a metric of every router rather than a guess from a client's side."""

from __future__ import annotations

from collections import deque

MIN_RETRY_AFTER_MS = 1.0   # a retry hint of 0 would invite an immediate retry storm
DRAIN_WINDOW_S = 2.0       # recent service the drain rate is measured over
MIN_DRAIN_SPAN_S = 0.1
BEST_MEMORY_S = 300.0      # how long the best one-second drain rate is remembered
AUDIT_TAILS = 64           # tails awaiting their answer, each with the refusals that met it
AUDIT_PER_TAIL = 256       # refusals kept per tail (a burst refuses thousands per tail)


def retry_after_ms(service_ms: float, queued: int, max_batch: int,
                   drain_per_s: float | None = None, parallel: int = 1,
                   answered_by_s: float | None = None) -> float:
    """About the time the queue takes to drain, to 0.1 ms.

    From the rate requests were recently served (``drain_per_s``, see ``DrainRate``) when
    known: what every worker together serves, pipelined. Else what is queued, in batches of
    ``max_batch``, each taking one batch's dispatch-to-release time, ``parallel`` batches at
    once (workers x batches each may hold). Never past ``answered_by_s``, when every
    queued request has its answer: the router passes the time left until the tail's
    deadline less one batch's service time (dispatch refuses what can no longer finish by
    then) plus the sweep period (what expires in the queue is answered within one)."""
    if drain_per_s is not None and drain_per_s > 0:
        seconds = queued / drain_per_s
    else:
        seconds = service_ms / 1e3 * queued / max(1, max_batch) / max(1, parallel)
    if answered_by_s is not None:
        seconds = min(seconds, max(0.0, answered_by_s))
    return round(max(MIN_RETRY_AFTER_MS, 1e3 * seconds), 1)


class DrainRate:
    """Requests per second served over the last ``window_s``, over the time since the first
    release in it (at least ``MIN_DRAIN_SPAN_S``: a burst's first batches do not make a rate
    alone). Kept as releases come, so an overloaded intake reads it in O(1).

    The hint's rate hedges between now and the best recent past (``hint_rate``): under a
    burst, moving the burst's own bytes slows serving (measured on 2 cores, EfficientNet:
    ~50 requests/s while 3,000 requests arrive, ~140/s once they stop), and nothing here
    can tell whether the overload will last. The geometric mean of the current rate and the
    best one-second rate of the last ``BEST_MEMORY_S`` is within sqrt(best / current) of
    either outcome."""

    def __init__(self, window_s: float = DRAIN_WINDOW_S) -> None:
        self.window_s = window_s
        self.released: deque[tuple[float, int]] = deque()  # (time, requests) per batch
        self.total = 0
        self.second = (0, 0)                 # (whole second, requests released in it)
        self.best: deque[tuple[float, float]] = deque()  # (second, rate): decreasing rates

    def add(self, now: float, requests: int) -> None:
        self.released.append((now, requests))
        self.total += requests
        self._forget(now)
        sec = int(now)
        if sec != self.second[0]:
            self._remember(*self.second)
            self.second = (sec, 0)
        self.second = (sec, self.second[1] + requests)

    def rate(self, now: float) -> float | None:
        """Requests per second, or None when nothing was served within the window."""
        self._forget(now)
        if not self.released:
            return None
        return self.total / max(now - self.released[0][0], MIN_DRAIN_SPAN_S)

    def hint_rate(self, now: float) -> float | None:
        """The rate a retry hint divides by: the current rate, hedged toward the best
        recent one (see the class note)."""
        current = self.rate(now)
        if current is None:
            return None
        while self.best and now - self.best[0][0] > BEST_MEMORY_S:
            self.best.popleft()
        best = self.best[0][1] if self.best else 0.0
        return (current * best) ** 0.5 if best > current else current

    def _remember(self, second: int, requests: int) -> None:
        """Keep the best rate per one-second bin as a monotone queue (the front is the
        best of the memory; a newer, better second makes older, worse ones irrelevant)."""
        if requests <= 0:
            return
        while self.best and self.best[-1][1] <= requests:
            self.best.pop()
        self.best.append((float(second), float(requests)))

    def _forget(self, now: float) -> None:
        while self.released and now - self.released[0][0] > self.window_s:
            self.total -= self.released.popleft()[1]


class HintAudit:
    """Each hint against the drain it predicted: a refusal notes the queue's tail with its
    time and hint; when that tail is answered, ``settle`` gives hint / actual drain of every
    refusal that met it. Bounded: at most ``AUDIT_TAILS`` tails (the oldest is forgotten)
    and ``AUDIT_PER_TAIL`` refusals each (later ones are not noted)."""

    def __init__(self, tails: int = AUDIT_TAILS, per_tail: int = AUDIT_PER_TAIL) -> None:
        self.tails, self.per_tail = tails, per_tail
        self.waiting: dict[str, list[tuple[float, float]]] = {}  # tail id -> (at, hint s)
        self.forgotten = 0   # refusals whose tail was forgotten before its answer

    def note(self, tail_id: str, now: float, hint_ms: float) -> None:
        noted = self.waiting.get(tail_id)
        if noted is None:
            if len(self.waiting) >= self.tails:
                self.forgotten += len(self.waiting.pop(next(iter(self.waiting))))
            noted = self.waiting[tail_id] = []
        if len(noted) < self.per_tail:
            noted.append((now, hint_ms / 1e3))

    def settle(self, rid: str, now: float) -> list[float]:
        """Ratios hint / actual of the refusals whose tail ``rid`` is answered at ``now``
        (none if it was no noted tail)."""
        noted = self.waiting.pop(rid, None)
        if not noted:
            return []
        return [hint / max(now - at, 1e-6) for at, hint in noted]

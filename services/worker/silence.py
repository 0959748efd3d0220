"""Whether a worker may answer clients directly, or must answer through the router.

A router takes a first-stage worker for lost after ``MISSED_HEARTBEATS`` silent heartbeat
periods (or a batch for lost in transit when a heartbeat does not list it) and sends the
unanswered requests again, to another worker. A worker whose event loop stalled that long
(sessions built by Python code that holds the GIL, a paused process) cannot tell whether
that happened. Had it answered those clients directly, each would get two answers.

So after a silence the worker answers what it received before the silence, or soon after
it (batches still in transit when the router gave up on it), through the router: the
router holds the one record of what was answered, and replies at most once. A request the
router sends again goes without reply subjects for the same reason. Outside silences, the
direct answer saves a hop on every request.

Pure: the caller passes the clock.
"""

from __future__ import annotations


class SilenceGuard:
    def __init__(self, period_s: float, transit_s: float) -> None:
        # a router declares loss after 3 periods; 2 leaves room for a late delivery
        self.suspect_s = 2 * period_s
        self.transit_s = transit_s     # how long batches sent before the loss may arrive
        self.last_beat: float | None = None
        self.closed_at = float("-inf")  # when the last silence ended

    def beat(self, now: float) -> bool:
        """A heartbeat went out at ``now``; True when it ends a silence."""
        silent = self.last_beat is not None and now - self.last_beat > self.suspect_s
        if silent:
            self.closed_at = now
        self.last_beat = now
        return silent

    def may_answer_directly(self, received: float, now: float) -> bool:
        """May a batch received at ``received`` be answered straight to its clients now?"""
        if self.last_beat is not None and now - self.last_beat > self.suspect_s:
            return False  # silent right now: the router may be giving up on this worker
        return received > self.closed_at + self.transit_s

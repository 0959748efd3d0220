"""A load generator that sees every reply: each request is published with a reply subject
of its own under the client's inbox (``<inbox>.<tag>.<i>``) and one subscription on
``<inbox>.<tag>.>`` collects what comes back, so a second reply to one request is counted
instead of being swallowed as a request() call would. Optionally it follows the contract's
resend rule: a request with no reply after ``resend_after`` seconds is sent once more, same
body (same ``id``), on a new reply subject."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

from nats.aio.client import Client
from nats.aio.msg import Msg

from schemas.codec import unpack
from services.bench.chaos_tally import NO_RESPONDERS, OK, Reply, Tracked

STATUS_HEADER = "Status"
NO_RESPONDERS_STATUS = "503"  # the server's answer to a request nobody subscribes to
YIELD_EVERY = 256  # unthrottled sending still lets replies in between


def reply_of(msg: Msg, t: float) -> Reply:
    """One reply as the tally reads it; a reply that does not decode is a finding too, so
    it gets a code of its own rather than an exception."""
    if not msg.data and msg.headers and msg.headers.get(STATUS_HEADER) == NO_RESPONDERS_STATUS:
        return Reply(t, msg.subject, NO_RESPONDERS, None, None)
    try:
        body = unpack(msg.data)
    except Exception:  # noqa: BLE001 - any undecodable reply is counted, not raised
        return Reply(t, msg.subject, "undecodable_reply", None, None)
    if not isinstance(body, dict):
        return Reply(t, msg.subject, "undecodable_reply", None, None)
    rid = body.get("id") if isinstance(body.get("id"), str) else None
    if "error" in body:
        err = body["error"]
        if not isinstance(err, dict):
            return Reply(t, msg.subject, "malformed_error", rid, None)
        hint = err.get("retry_after_ms")
        return Reply(t, msg.subject, str(err.get("code")), rid, None,
                     float(hint) if isinstance(hint, int | float) else None)
    version = body.get("config_version")
    return Reply(t, msg.subject, OK, rid, version if isinstance(version, int) else None)


class TrackedLoad:
    def __init__(self, nc: Client, subject: str, inbox: str, tag: str,
                 resend_after: float | None = None) -> None:
        self.nc = nc
        self.subject = subject
        self.root = f"{inbox}.{tag}"
        self.resend_after = resend_after
        self.requests: list[Tracked] = []
        self.by_subject: dict[str, Tracked] = {}
        self.bodies: dict[int, bytes] = {}  # kept only to resend
        self.strays = 0  # replies on subjects this load never used
        self.last_sent = 0.0
        self._sub = None
        self._resender: asyncio.Task | None = None

    async def start(self) -> None:
        self._sub = await self.nc.subscribe(f"{self.root}.>", cb=self._on_reply)
        await self.nc.flush()
        if self.resend_after is not None:
            self._resender = asyncio.ensure_future(self._resend_loop())

    async def _on_reply(self, msg: Msg) -> None:
        t = time.monotonic()
        tracked = self.by_subject.get(msg.subject)
        if tracked is None:
            self.strays += 1
            return
        tracked.replies.append(reply_of(msg, t))

    async def _publish(self, tracked: Tracked, index: int, body: bytes) -> None:
        attempt = len(tracked.subjects)
        subject = f"{self.root}.{index}" + (f"-r{attempt}" if attempt else "")
        tracked.subjects.append(subject)
        self.by_subject[subject] = tracked
        now = time.monotonic()
        tracked.sent.append(now)
        self.last_sent = now
        await self.nc.publish(self.subject, body, reply=subject)

    async def send(self, rid: str | None, body: bytes) -> Tracked:
        tracked = Tracked(rid)
        index = len(self.requests)
        self.requests.append(tracked)
        if self.resend_after is not None:
            self.bodies[index] = body
        await self._publish(tracked, index, body)
        return tracked

    async def send_many(self, make: Callable[[int], tuple[str | None, bytes]], n: int,
                        rate: float | None = None,
                        events: dict[int, Callable[[], None]] | None = None) -> float:
        """Send ``make(i)`` (id, body) for i < n: open loop at ``rate`` per second, or as
        fast as the client can (``None``). ``events[i]`` runs just before request i goes
        out (a kill at a known point of the load). Returns the seconds sending took."""
        events = events or {}
        t0 = time.monotonic()
        for i in range(n):
            if rate is not None:
                wait = t0 + i / rate - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
            elif i % YIELD_EVERY == 0:
                await asyncio.sleep(0)
            if i in events:
                events[i]()
            await self.send(*make(i))
        with contextlib.suppress(Exception):  # disconnected: nats-py sends them on reconnect
            await self.nc.flush(timeout=5)
        return time.monotonic() - t0

    async def _resend_loop(self) -> None:
        """Resend, once, each request still unanswered ``resend_after`` s after it went out.
        Requests are resent in send order, so a cursor over them suffices."""
        cursor = 0
        while True:
            now = time.monotonic()
            while cursor < len(self.requests) and self.requests[cursor].sent[0] + self.resend_after <= now:
                tracked = self.requests[cursor]
                if not tracked.replies:
                    await self._publish(tracked, cursor, self.bodies[cursor])
                cursor += 1
            await asyncio.sleep(0.05)

    def unanswered(self) -> int:
        return sum(not t.replies for t in self.requests)

    async def wait(self, grace_s: float, say: Callable[[str], None] | None = None) -> float:
        """Until every request has a reply, or ``grace_s`` after the last attempt went out
        (then the rest are silent losses); returns the seconds waited."""
        t0 = time.monotonic()
        next_note = t0 + 5
        while self.unanswered():
            pending_resends = self.resend_after is not None and any(
                len(t.subjects) == 1 and not t.replies for t in self.requests)
            if not pending_resends and time.monotonic() > self.last_sent + grace_s:
                break
            if say is not None and time.monotonic() >= next_note:
                say(f"  waiting for {self.unanswered()} replies ...")
                next_note += 5
            await asyncio.sleep(0.1)
        return time.monotonic() - t0

    async def stop(self) -> None:
        if self._resender is not None:
            self._resender.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._resender
        if self._sub is not None:
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()

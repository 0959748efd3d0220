"""The request path's own use of a nats-py connection: no event-loop hops of its own.

nats-py hands every received message to a per-subscription task through a queue, and
every publish to a flusher task: two scheduling round trips per message per process,
about a third of a request's transport time through client, router and worker on a
small machine (see ``offramp bench overhead``). On the request path offramp instead

- publishes by writing the PUB frame straight to the socket (``publish_now``), after
  anything nats-py still holds so order is kept; while disconnected the frame joins
  nats-py's own reconnect buffer, exactly as ``Client.publish`` would do;
- handles messages in the connection's read loop (``subscribe_direct``): the handler is
  a plain function that must not block; it spawns a task for anything that waits.
  What handlers publish while one chunk read from the socket is parsed goes out in one
  write at the end of it: under load a burst costs one system call, not one per message.

Subscriptions stay nats-py subscriptions (re-subscribed on reconnect, drained on close);
only their delivery changes. Everything else (control, telemetry, JetStream) uses the
ordinary nats-py API.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import Callable
from typing import Any

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import ConnectionClosedError, MaxPayloadError, NoRespondersError
from nats.errors import TimeoutError as NatsTimeout
from nats.protocol import command as prot_command

log = logging.getLogger("offramp.bus")

NO_RESPONDERS_STATUS = "503"


def publish_now(nc: Client, subject: str, data: bytes, reply: str = "") -> None:
    """Publish without waiting for the flusher task; same guarantees as ``nc.publish``.

    Inside a direct handler the frame is held until the handler's read chunk is parsed
    (or ``flush_now``), so a burst of messages read together is answered with one write."""
    _send(nc, _frame(nc, subject, data, reply))


def publish_many(nc: Client, messages: list[tuple[str, bytes] | tuple[str, bytes, str]]
                 ) -> None:
    """``publish_now`` for several messages, in order, with one write. A message may carry
    a third element, its ``Nats-Msg-Id`` (JetStream drops a second copy of an id; consumers
    see the id as the message's identity)."""
    if messages:
        _send(nc, [part for m in messages
                   for part in _frame(nc, m[0], m[1], msg_id=m[2] if len(m) > 2 else None)])


def publish_all(nc: Client, messages: list[tuple[str, bytes] | tuple[str, bytes, str]],
                log) -> None:
    """``publish_many``; when that write fails (e.g. one message over max_payload, or a
    closed connection), each message on its own, so the rest still go and each one that
    cannot is logged."""
    try:
        publish_many(nc, messages)
    except Exception:  # noqa: BLE001 - send the rest, say which
        for m in messages:
            try:
                publish_many(nc, [m])
            except Exception as exc:  # noqa: BLE001
                log.error("publish failed subject=%s bytes=%d error=%r", m[0], len(m[1]), exc)


# Payloads from this size on are written as their own buffer (writev) instead of being
# copied into one frame: nats-py's ``pub_cmd`` copies a payload twice (header + payload,
# then + CRLF), which is 0.6 MB twice per image request per hop.
_UNCOPIED_BYTES = 64 * 1024
_CRLF = b"\r\n"


def _frame(nc: Client, subject: str, data: bytes, reply: str = "",
           msg_id: str | None = None) -> list[bytes]:
    """The PUB (HPUB with ``msg_id``) frame for one message, as the buffers to write (see
    ``_UNCOPIED_BYTES``)."""
    if len(data) > nc.max_payload:
        raise MaxPayloadError
    if nc.is_closed:
        raise ConnectionClosedError
    nc.stats["out_msgs"] += 1
    nc.stats["out_bytes"] += len(data)
    if msg_id is not None:
        hdr = f"NATS/1.0\r\nNats-Msg-Id: {msg_id}\r\n\r\n".encode()
        head = f"HPUB {subject} {reply} {len(hdr)} {len(hdr) + len(data)}\r\n".encode()
        return [b"".join((head, hdr, data, _CRLF))]
    head = f"{prot_command.PUB_OP} {subject} {reply} {len(data)}\r\n".encode()
    if len(data) >= _UNCOPIED_BYTES:
        return [head, data, _CRLF]
    return [b"".join((head, data, _CRLF))]


def _send(nc: Client, frames: list[bytes]) -> None:
    held = getattr(nc, _HELD, None)
    if held is not None and held.frames is not None:
        held.frames.extend(frames)
    else:
        _write(nc, frames)


def flush_now(nc: Client) -> None:
    """Write what a direct handler has published so far (e.g. replies before bookkeeping)."""
    held = getattr(nc, _HELD, None)
    if held is not None and held.frames:
        frames, held.frames = held.frames, []
        _write(nc, frames)


def _write(nc: Client, frames: list[bytes]) -> None:
    transport = nc._transport
    if nc.is_connected and transport is not None:
        if nc._pending:  # older frames first
            frames = nc._pending + frames
            nc._pending = []
            nc._pending_data_size = 0
        transport.writelines(frames)
    else:  # reconnecting: nats-py's buffer, sent in order once the connection is back
        nc._pending.extend(frames)
        nc._pending_data_size += sum(len(f) for f in frames)


_HELD = "_offramp_held"


class _Held:
    """Frames published while the read loop parses one chunk; written when it is done."""

    def __init__(self) -> None:
        self.frames: list[bytes] | None = None


def _hold_during_parse(nc: Client) -> None:
    if getattr(nc, _HELD, None) is not None:
        return
    held = _Held()
    setattr(nc, _HELD, held)
    parser = nc._ps
    parse = parser.parse

    async def parse_held(data: bytes = b"") -> None:
        held.frames = []
        try:
            await parse(data)
        finally:
            frames, held.frames = held.frames, None
            if frames:
                _write(nc, frames)

    parser.parse = parse_held


class _Direct:
    """Stands in for a subscription's pending queue: delivers each message at once."""

    def __init__(self, sub, handler: Callable[[Msg], None], name: str) -> None:
        self.sub = sub
        self.handler = handler
        self.name = name

    def put_nowait(self, msg: Msg) -> None:
        self.sub._pending_size -= len(msg.data)  # nothing is ever pending here
        try:
            self.handler(msg)
        except Exception:  # a handler's bug must not stop the read loop
            log.exception("message handler failed subject=%s", self.name)

    def qsize(self) -> int:
        return 0

    def empty(self) -> bool:
        return True

    async def join(self) -> None:  # drain: nothing left to process
        return None


async def subscribe_direct(nc: Client, subject: str, handler: Callable[[Msg], None],
                           queue: str = "") -> Any:
    """Subscribe so that ``handler(msg)`` runs in the read loop (see module docstring)."""

    async def unused(msg: Msg) -> None:  # nats-py needs a callback to make a callback sub
        handler(msg)

    _hold_during_parse(nc)
    sub = await nc.subscribe(subject, queue=queue, cb=unused)
    task = sub._wait_for_msgs_task
    if task is not None:
        task.cancel()
    sub._pending_queue = _Direct(sub, handler, subject)
    # The SUB out now: nats-py's flush() writes its PING past its own buffer, so a flush
    # alone would not prove the server has this subscription.
    _write(nc, [])
    return sub


class Requester:
    """Request-reply over one wildcard inbox whose replies resolve futures directly."""

    def __init__(self, nc: Client) -> None:
        self.nc = nc
        self.prefix = nc.new_inbox()
        self.waiting: dict[str, asyncio.Future] = {}
        self.next_token = 0
        self.batch: list[bytes] = []
        self.sub = None

    def _send_batch(self) -> None:
        frames, self.batch = self.batch, []
        _send(self.nc, frames)

    async def start(self) -> Requester:
        self.sub = await subscribe_direct(self.nc, self.prefix + ".*", self._on_reply)
        return self

    def _on_reply(self, msg: Msg) -> None:
        fut = self.waiting.pop(msg.subject[len(self.prefix) + 1:], None)
        if fut is None or fut.done():
            return  # timed out already
        if msg.headers and msg.headers.get("Status") == NO_RESPONDERS_STATUS:
            fut.set_exception(NoRespondersError())
        else:
            fut.set_result(msg)

    async def request(self, subject: str, data: bytes, timeout: float) -> Msg:
        """Like ``nc.request``: raises nats ``TimeoutError`` / ``NoRespondersError``."""
        self.next_token += 1
        token = str(self.next_token)
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self.waiting[token] = fut
        # A timer, not asyncio.wait_for: the reply wakes this task directly (wait_for adds
        # two scheduling rounds per request).
        timer = loop.call_later(timeout, _expire, fut)
        try:
            frame = _frame(self.nc, subject, data, f"{self.prefix}.{token}")
            if len(self.waiting) == 1:
                _send(self.nc, frame)  # the only request in flight: no wait at all
            else:  # others in flight: one write for all sent in this loop iteration
                if not self.batch:
                    loop.call_soon(self._send_batch)
                self.batch.extend(frame)
            return await fut
        finally:
            timer.cancel()
            self.waiting.pop(token, None)


def _expire(fut: asyncio.Future) -> None:
    if not fut.done():
        fut.set_exception(NatsTimeout())


_requesters: weakref.WeakKeyDictionary[Client, asyncio.Future] = weakref.WeakKeyDictionary()


async def requester(nc: Client) -> Requester:
    """The connection's requester (one per connection, made on first use)."""
    made = _requesters.get(nc)
    if made is None:  # concurrent first requests share one start
        made = _requesters[nc] = asyncio.ensure_future(Requester(nc).start())
    return await asyncio.shield(made)

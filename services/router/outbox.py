"""The router's answers and their rows, leaving together.

A reply the router sends itself (an error, or a result it relays) is written in the same
socket write as the request record that stores it, record first: if the router dies, a
client never holds an answer the history lacks. Everything queued during one event-loop
iteration goes out in one write at its end, so a burst of refusals costs a few messages,
not one per request.
"""

from __future__ import annotations

import asyncio

from nats.aio.client import Client

from schemas import subjects
from schemas.telemetry import RequestRecord, RequestTelemetry
from services.common import logs
from services.common.hotpath import publish_all
from services.common.payload_chunks import payload_chunks


class Outbox:
    def __init__(self, nc: Client, router_id: str, log) -> None:
        self.nc = nc
        self.router_id = router_id
        self.log = log
        self.replies: list[tuple[str, bytes]] = []
        self.records: dict[str, list[RequestRecord]] = {}
        self.sent = 0           # record messages published (their ids count up)
        self.scheduled = False

    def answer(self, model: str, record: RequestRecord, reply: str | None,
               data: bytes) -> None:
        """Send ``data`` to ``reply`` (none: record only) with ``record`` stored."""
        self.records.setdefault(model, []).append(record)
        if reply:
            self.replies.append((reply, data))
        self._schedule()

    def reply(self, subject: str, data: bytes) -> None:
        """An answer with no row (a request for a model this router does not serve)."""
        self.replies.append((subject, data))
        self._schedule()

    def _schedule(self) -> None:
        if not self.scheduled:
            self.scheduled = True
            asyncio.get_running_loop().call_soon(self.flush)

    def flush(self) -> None:
        self.scheduled = False
        messages: list[tuple] = []
        for model, records in self.records.items():
            chunks, dropped = payload_chunks(
                records, lambda rs, model=model: RequestTelemetry(
                    model, self.router_id, rs).encode(), self.nc.max_payload)
            for data in chunks:
                # the id the monitor stores the records under, however often they come
                self.sent += 1
                messages.append((subjects.telemetry_requests(model), data,
                                 f"{self.router_id}:{self.sent}"))
            if dropped:  # only a record over the limit on its own: say so
                self.log.error("request records too large to send %s",
                               logs.kv(model=model, dropped=dropped))
        messages += self.replies
        self.records, self.replies = {}, []
        if messages:
            publish_all(self.nc, messages, self.log)

"""The router's bookkeeping of generation streams: which LLM worker holds which stream, the
slots each has free, the requests waiting for a slot, and the streams of a worker that went
silent (their clients get an error, so no stream ends silently).

A worker streams tokens straight to the client; the router hands it each request, counts it
against the worker's slots (``capacity`` in its heartbeats) until the worker releases it,
and settles a stream its worker's heartbeats stopped listing: released (the note may still
be on its way) once it was sent more than a transit margin earlier.

Pure: the caller passes the clock.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field


@dataclass(slots=True)
class Stream:
    id: str
    model: str
    reply: str
    data: bytes          # the request as the client sent it (handed to the worker as is)
    arrival: float
    deadline: float      # for a first token: past it while waiting, the request is refused
    worker: str = ""
    sent: float = 0.0


@dataclass(slots=True)
class LlmWorker:
    id: str
    model: str
    capacity: int
    last_seen: float
    streams: dict[str, Stream] = field(default_factory=dict)

    @property
    def free(self) -> int:
        return self.capacity - len(self.streams)


class LlmDesk:
    def __init__(self, timeout_s: float, transit_s: float, queue_limit: int) -> None:
        self.timeout_s = timeout_s
        self.transit_s = transit_s
        self.queue_limit = queue_limit
        self.workers: dict[str, LlmWorker] = {}
        self.waiting: dict[str, deque[Stream]] = {}   # model -> requests, oldest first
        self.open: dict[str, Stream] = {}             # request id -> stream, waiting or sent
        self.models_seen: set[str] = set()

    def heartbeat(self, worker: str, model: str, capacity: int, now: float,
                  held: tuple[str, ...] | None) -> list[Stream]:
        """Record a heartbeat; returns the streams it settles (released by the worker)."""
        w = self.workers.get(worker)
        if w is None:
            w = self.workers[worker] = LlmWorker(worker, model, capacity, now)
            self.models_seen.add(model)
        w.last_seen, w.capacity = now, capacity
        if held is None:
            return []
        listed = set(held)
        done = [s for s in w.streams.values()
                if s.id not in listed and now - s.sent >= self.transit_s]
        for s in done:
            self.release(worker, s.id)
        return done

    def serves(self, model: str) -> bool:
        return model in self.models_seen

    def enqueue(self, stream: Stream) -> bool:
        """Queue a request for a slot; False when the model's queue is full."""
        q = self.waiting.setdefault(stream.model, deque())
        if len(q) >= self.queue_limit:
            return False
        q.append(stream)
        self.open[stream.id] = stream
        return True

    def assign(self, model: str, now: float) -> list[Stream]:
        """Waiting requests given to workers with free slots (most free first), in order."""
        q = self.waiting.get(model)
        out: list[Stream] = []
        while q:
            w = max((w for w in self.workers.values() if w.model == model and w.free > 0),
                    key=lambda w: w.free, default=None)
            if w is None:
                break
            s = q.popleft()
            s.worker, s.sent = w.id, now
            w.streams[s.id] = s
            out.append(s)
        return out

    def release(self, worker: str, rid: str) -> Stream | None:
        """The worker finished the stream (its terminal message is out)."""
        w = self.workers.get(worker)
        s = w.streams.pop(rid, None) if w is not None else None
        if s is not None:
            self.open.pop(rid, None)
        return s

    def lost(self, now: float) -> list[Stream]:
        """The streams of workers silent past the timeout: they leave the desk (their
        clients get an error)."""
        lost: list[Stream] = []
        for w in [w for w in self.workers.values() if now - w.last_seen > self.timeout_s]:
            del self.workers[w.id]
            lost += w.streams.values()
        for s in lost:
            self.open.pop(s.id, None)
        return lost

    def late(self, now: float) -> list[Stream]:
        """Requests that waited for a slot past their deadline: they leave the queue."""
        late: list[Stream] = []
        for q in self.waiting.values():
            if not any(s.deadline <= now for s in q):  # the sweep's usual case: no copy
                continue
            late += [s for s in q if s.deadline <= now]
            keep = [s for s in q if s.deadline > now]
            q.clear()
            q.extend(keep)
        for s in late:
            self.open.pop(s.id, None)
        return late

    def has_worker(self, model: str) -> bool:
        return any(w.model == model for w in self.workers.values())

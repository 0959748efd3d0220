"""Load generation over the public contract (demo and benchmarks): closed loop (a fixed
number in flight) or open loop (requests sent at given arrival times, whatever is pending)."""

from __future__ import annotations

import asyncio
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from nats.aio.client import Client

from services.common import gc_pauses
from services.common.client import InferError, infer


@dataclass(slots=True)
class Outcome:
    index: int
    ok: bool
    latency_ms: float          # measured by the client, end to end
    code: str = "ok"
    early: bool = False
    exit: int = -1
    label: int = -1
    config_version: int = -1
    request_id: str = ""
    serving_ms: float | None = None  # the router's record of it (``attach_serving``)
    variant: str | None = None       # the subnet or depth cap that answered, if any
    sent_at: float | None = None     # wall clock (Unix s) as the client sent it ...
    answered_at: float | None = None  # ... and as its answer arrived
    way_in_ms: float | None = None   # client -> router (``attach_hops``; one host's clock)


async def _request(nc: Client, model: str, i: int, inputs: dict[str, np.ndarray],
                   slo_ms: float | None, timeout: float, start: float,
                   clock: Callable[[], float]) -> Outcome:
    """One request; its latency runs from ``start`` on ``clock``."""
    rid = uuid.uuid4().hex
    sent = time.time()
    try:
        r = await infer(nc, model, inputs, slo_ms, timeout=timeout, request_id=rid)
        return Outcome(i, True, (clock() - start) * 1e3, "ok", bool(r["early"]),
                       int(r["exit"]), int(r["label"]), int(r["config_version"]), rid,
                       variant=r.get("variant"), sent_at=sent, answered_at=time.time())
    except InferError as exc:
        return Outcome(i, False, (clock() - start) * 1e3, exc.code, request_id=rid,
                       sent_at=sent, answered_at=time.time())


def attach_serving(outcomes: list[Outcome], serving: dict[str, float | None]) -> int:
    """Set each answered outcome's ``serving_ms`` from the router's records (request id ->
    latency); returns how many outcomes got one."""
    got = 0
    for o in outcomes:
        v = serving.get(o.request_id) if o.ok else None
        o.serving_ms = v
        got += v is not None
    return got


def attach_hops(outcomes: list[Outcome], received: dict[str, float]) -> int:
    """Set each answered outcome's ``way_in_ms`` (its send to the router's receipt, from the
    router's records: request id -> Unix seconds); returns how many got one. Client and
    router must share a clock: one host, as in the demo."""
    got = 0
    for o in outcomes:
        at = received.get(o.request_id) if o.ok and o.sent_at is not None else None
        o.way_in_ms = None if at is None else (at - o.sent_at) * 1e3
        got += at is not None
    return got


def way_back_ms(o: Outcome) -> float | None:
    """From the router learning the answer to the client holding it: what is left of the
    client's round trip after the way in and the router's serving time."""
    if None in (o.way_in_ms, o.serving_ms, o.sent_at, o.answered_at):
        return None
    return (o.answered_at - o.sent_at) * 1e3 - o.way_in_ms - o.serving_ms


async def await_config(nc: Client, model: str, version: int, probe: dict[str, np.ndarray],
                       timeout_s: float = 30.0) -> int:
    """Send ``probe`` until an answer carries exit config ``version`` or later (workers swap
    a new config in between batches, after building what it needs), so a measured run
    starts on the config it is meant to measure. Returns the probes sent."""
    deadline = time.monotonic() + timeout_s
    sent = 0
    while True:
        sent += 1
        try:
            r = await infer(nc, model, probe, None, timeout=min(5.0, timeout_s))
            if int(r["config_version"]) >= version:
                return sent
        except InferError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"{model}: no answer carried exit config v{version} within "
                               f"{timeout_s:.0f} s")
        await asyncio.sleep(0.1)


async def drive(nc: Client, model: str, inputs: list[dict[str, np.ndarray]], concurrency: int,
                slo_ms: float | None = None, timeout: float = 10.0,
                on_done: Callable[[Outcome], None] | None = None,
                duration_s: float | None = None) -> list[Outcome]:
    """Send requests with ``concurrency`` in flight: each input once, or cycling through the
    inputs until ``duration_s`` elapses."""
    outcomes: list[Outcome] = []
    counter = iter(range(10**12))
    stop_at = None if duration_s is None else time.perf_counter() + duration_s

    async def one_loop() -> None:
        while True:
            i = next(counter)
            if stop_at is None and i >= len(inputs):
                return
            if stop_at is not None and time.perf_counter() >= stop_at:
                return
            out = await _request(nc, model, i, inputs[i % len(inputs)], slo_ms, timeout,
                                 time.perf_counter(), time.perf_counter)
            outcomes.append(out)
            if on_done is not None:
                on_done(out)

    with gc_pauses.timing():  # a client's collection would stall every request it times
        await asyncio.gather(*(one_loop() for _ in range(concurrency)))
    return outcomes


def _pace(loop: asyncio.AbstractEventLoop, dues: list[float], fire: Callable[[int], None],
          stop: threading.Event) -> None:
    """In a thread: call ``fire(i)`` on the loop at ``dues[i]`` (``time.monotonic``).

    The loop's own timers wake up to ~2 ms late (epoll's millisecond timeout), and spinning
    the loop until a send is due cost the client 1.8 ms of CPU per request at 36 req/s on a
    2-core machine (a probe), taken from the model being served. ``time.sleep`` in a thread
    wakes within tens of microseconds; the loop then sends at once."""
    for i, due in enumerate(dues):
        wait = due - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        if stop.is_set():
            return
        loop.call_soon_threadsafe(fire, i)


async def drive_open(nc: Client, model: str, inputs: list[dict[str, np.ndarray]],
                     arrival_s: np.ndarray, slo_ms: float | None = None, timeout: float = 10.0,
                     on_done: Callable[[Outcome], None] | None = None) -> list[Outcome]:
    """Send input i at ``arrival_s[i]`` seconds from the start, however many are pending
    (open loop: a camera does not wait for the previous frame's answer). Latency runs from
    the scheduled arrival, so a late send counts against the system, not for it."""
    if len(arrival_s) != len(inputs):
        raise ValueError(f"{len(inputs)} inputs but {len(arrival_s)} arrival times")
    gc_pauses.settle_once()  # before the schedule starts: the first freeze takes a while
    loop = asyncio.get_running_loop()
    # Arrivals on the loop's clock (latency) and on the pacing thread's; both monotonic.
    start, start_mono = loop.time(), time.monotonic()
    offsets = np.asarray(arrival_s, dtype=float).tolist()
    outcomes: list[Outcome] = []
    tasks: list[asyncio.Task] = []
    all_sent = loop.create_future()

    async def one(i: int, due: float) -> None:
        out = await _request(nc, model, i, inputs[i], slo_ms, timeout, due, loop.time)
        outcomes.append(out)
        if on_done is not None:
            on_done(out)

    def fire(i: int) -> None:
        tasks.append(asyncio.ensure_future(one(i, start + offsets[i])))
        if len(tasks) == len(offsets) and not all_sent.done():
            all_sent.set_result(None)

    with gc_pauses.timing():  # a client's collection would stall every request it times
        if offsets:
            stop = threading.Event()
            pacer = threading.Thread(target=_pace, name="offramp-pacer", daemon=True,
                                     args=(loop, [start_mono + t for t in offsets], fire, stop))
            pacer.start()
            try:
                await all_sent
            finally:
                stop.set()
        await asyncio.gather(*tasks)
    return sorted(outcomes, key=lambda o: o.index)


class Progress:
    """A one-line progress bar on stderr (plain lines every 10% when not a terminal)."""

    def __init__(self, total: int, label: str) -> None:
        self.total, self.label, self.done, self.errors = total, label, 0, 0
        self.t0 = time.perf_counter()
        self.tty = sys.stderr.isatty()
        self.next_mark = 0.1

    def __call__(self, out: Outcome) -> None:
        self.done += 1
        self.errors += 0 if out.ok else 1
        frac = self.done / self.total
        rate = self.done / max(1e-9, time.perf_counter() - self.t0)
        line = (f"{self.label} [{'#' * int(30 * frac):<30}] {self.done}/{self.total} "
                f"{rate:.0f} req/s errors={self.errors}")
        if self.tty:
            print("\r" + line, end="" if self.done < self.total else "\n", file=sys.stderr, flush=True)
        elif frac >= self.next_mark or self.done == self.total:
            self.next_mark += 0.1
            print(line, file=sys.stderr, flush=True)

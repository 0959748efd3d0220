"""The bus's cost per message and per byte on this machine, measured once for
``offramp bench e3 --sim`` (I/O: a private nats-server and one client).

A stage hands its survivors to the next stage as one message on the bus, so the planner
and the simulator charge ``fixed_ms + bytes x ms_per_byte`` of a link's time per message
(``services.optimizer.splits.Transfer``). Measured here as the bus's throughput: one
client publishes up to ``COUNT`` messages (16 MiB at most) of each size in ``SIZES_BYTES`` to a subject it is
subscribed to, and the time from the first publish to the last delivery divided by the
count is a message's occupancy of the link (the messages are pipelined, as a stage's are).
Each size is timed ``REPEATS`` times and the fastest kept (a shared machine's noise only
adds time); a line through (bytes, ms) by least relative squares gives ``fixed_ms`` and
``ms_per_byte``. The result is cached under ``$OFFRAMP_HOME/cache/e3/bus.json``. This is
loopback on one machine, the NATS hop between two stage workers here, not a network
between machines; when the measurement fails the bench falls back to the conservative
constant of ``services.bench.e3_inputs`` and says so.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

SIZES_BYTES = (4 * 1024, 256 * 1024, 2 * 1024 * 1024)
COUNT = 64
IN_FLIGHT_BYTES = 16 * 1024 * 1024  # fewer messages of a large size: no slow consumer
REPEATS = 3


def count_of(size: int) -> int:
    return max(4, min(COUNT, IN_FLIGHT_BYTES // size))


async def _timed(nc, subject: str, payload: bytes, count: int) -> float:
    """ms from the first publish to the last of ``count`` deliveries."""
    done = asyncio.get_running_loop().create_future()
    seen = 0

    async def on_msg(_msg) -> None:
        nonlocal seen
        seen += 1
        if seen == count and not done.done():
            done.set_result(time.perf_counter())

    sub = await nc.subscribe(subject, cb=on_msg)
    await nc.flush()
    t0 = time.perf_counter()
    for _ in range(count):
        await nc.publish(subject, payload)
    await nc.flush()
    t1 = await asyncio.wait_for(done, 30.0)
    await sub.unsubscribe()
    return (t1 - t0) * 1e3


async def _measure(url: str) -> dict[int, float]:
    from services.common import bus

    nc = await bus.connect(url, "bench-e3-bus")
    try:
        per: dict[int, float] = {}
        for k, size in enumerate(SIZES_BYTES):
            payload = bytes(size)
            n = count_of(size)
            times = [await _timed(nc, f"bench.e3.bus.{k}.{r}", payload, n)
                     for r in range(REPEATS)]
            per[size] = min(times) / n
        return per
    finally:
        await bus.close(nc)


def fit(per_message_ms: dict[int, float]) -> tuple[float, float]:
    """(fixed_ms, ms_per_byte) of the line through (bytes, ms) with the least squared
    relative error (so the small messages that pin the fixed cost count as much as the
    large ones), both floored at 0."""
    x = np.array(sorted(per_message_ms), dtype=np.float64)
    y = np.array([per_message_ms[int(b)] for b in x])
    slope, icpt = np.polyfit(x, y, 1, w=1.0 / np.maximum(y, 1e-9))
    return max(float(icpt), 0.0), max(float(slope), 0.0)


def measured_bus(cache: Path) -> dict[str, Any]:
    """The cached measurement, else a new one (raises RuntimeError/OSError on failure)."""
    path = cache / "bus.json"
    if path.is_file():
        return json.loads(path.read_text()) | {"cached": True, "cache": str(path)}
    from services.launcher.natsserver import EmbeddedNats

    with tempfile.TemporaryDirectory() as tmp, EmbeddedNats(Path(tmp)) as srv:
        per = asyncio.run(_measure(srv.url))
    fixed, per_byte = fit(per)
    doc = {"measured_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
           "fixed_ms": fixed, "ms_per_byte": per_byte,
           "per_message_ms": {str(b): ms for b, ms in per.items()},
           "how": f"up to {COUNT} pipelined messages (16 MiB) per size on a private nats-server (loopback), "
                  f"fastest of {REPEATS}, a line through (bytes, ms) by least relative squares"}
    path.write_text(json.dumps(doc, indent=1) + "\n")
    return doc | {"cached": False, "cache": str(path)}

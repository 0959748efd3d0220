"""Run a service coroutine under uvloop until SIGINT/SIGTERM, then shut it down cleanly."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from collections.abc import Awaitable, Callable

from services.common import metrics
from services.common.memory import keep_large_buffers

PARENT_PID_ENV = "OFFRAMP_PARENT_PID"  # set by `offramp up` for the services it starts
PARENT_CHECK_S = 0.5


def run_service(main: Callable[[asyncio.Event], Awaitable[None]]) -> None:
    """``main(stop)`` runs until ``stop`` is set by a signal, or by the death of the
    ``offramp up`` that started it, and returns after cleanup."""
    keep_large_buffers()  # also for processes not started through the CLI (bench echo)

    async def runner() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        watch = None
        if (parent := os.environ.get(PARENT_PID_ENV, "")).isdigit():
            watch = asyncio.ensure_future(stop_when_orphaned(int(parent), stop))
        try:
            await main(stop)
        finally:
            if watch is not None:
                watch.cancel()

    try:
        import uvloop

        uvloop.run(runner())
    except ImportError:
        asyncio.run(runner())


async def stop_when_orphaned(parent: int, stop: asyncio.Event) -> None:
    """Set ``stop`` once ``parent`` is no longer this process's parent. A SIGKILLed (or
    OOM-killed) ``offramp up`` cannot stop its services, and its home lock dies with it: the
    services would serve on as orphans beside the next stack on the same store."""
    while not stop.is_set():
        if os.getppid() != parent:
            logging.getLogger("offramp").warning(
                "the offramp up that started this service (pid %d) is gone: stopping", parent)
            stop.set()
            return
        await asyncio.sleep(PARENT_CHECK_S)


def spawn(coro: Awaitable[None], tasks: set[asyncio.Task], log=None) -> asyncio.Task:
    """Start a background task, keep a reference, and log if it dies with an error."""
    task = asyncio.ensure_future(coro)
    tasks.add(task)

    def done(t: asyncio.Task) -> None:
        tasks.discard(t)
        if not t.cancelled() and t.exception() is not None and log is not None:
            log.error("background task failed: %r", t.exception(), exc_info=t.exception())

    task.add_done_callback(done)
    return task


RESTART_FIRST_S = 0.1   # wait before restarting a failed loop, doubled per failure in a row
RESTART_MAX_S = 5.0
HEALTHY_S = 60.0        # a loop that ran this long before failing starts from the first wait
restarts: dict[str, int] = {}  # loop name -> restarts since the process started (also a metric)


def supervise(name: str, make: Callable[[], Awaitable[None]], tasks: set[asyncio.Task],
              log) -> asyncio.Task:
    """Run the background loop ``make()`` returns; when it fails, log why and start it again
    after a wait that doubles (up to ``RESTART_MAX_S``), so no loop dies silently while the
    service goes on. A loop that returns (its stop event was set) ends."""

    async def run() -> None:
        wait = RESTART_FIRST_S
        while True:
            started = time.monotonic()
            try:
                await make()
                return
            except Exception as exc:  # any failure restarts the loop
                if time.monotonic() - started >= HEALTHY_S:
                    wait = RESTART_FIRST_S
                restarts[name] = restarts.get(name, 0) + 1
                metrics.RESTARTS.labels(name).inc()
                log.error("background loop failed, restarting %s", f"loop={name} "
                          f"in_s={wait:g} restarts={restarts[name]}", exc_info=exc)
            await asyncio.sleep(wait)
            wait = min(2 * wait, RESTART_MAX_S)

    return spawn(run(), tasks, log)

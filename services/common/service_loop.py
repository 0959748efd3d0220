"""Run a service coroutine under uvloop until SIGINT/SIGTERM, then shut it down cleanly."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Awaitable, Callable

from services.common.memory import keep_large_buffers


def run_service(main: Callable[[asyncio.Event], Awaitable[None]]) -> None:
    """``main(stop)`` runs until ``stop`` is set by a signal and returns after cleanup."""
    keep_large_buffers()  # also for processes not started through the CLI (bench echo)

    async def runner() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await main(stop)

    try:
        import uvloop

        uvloop.run(runner())
    except ImportError:
        asyncio.run(runner())


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

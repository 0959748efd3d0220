"""`offramp up` supervises its embedded nats-server: killed, it comes back on the same port
and store, and the stack serves again within seconds (tiny)."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import numpy as np

from services.common import bus
from services.common.client import infer
from tests.e2e.conftest import wait_for

MODEL = "tiny"


def _one(url: str, rid: str) -> bool:
    async def run() -> bool:
        try:
            nc = await bus.connect(url, "e2e-nats", connect_timeout=0.5)
        except Exception:  # noqa: BLE001 - the server is not back yet
            return False
        try:
            reply = await infer(nc, MODEL, {"x": np.zeros(16, "<f4")}, 1000, request_id=rid,
                                timeout=1.0)
            return reply["id"] == rid
        except Exception:  # noqa: BLE001 - services still reconnecting
            return False
        finally:
            await nc.close()

    return asyncio.run(run())


def test_a_killed_nats_server_is_restarted_and_serving_resumes(stack):
    assert _one(stack.url, "before")
    old = stack.pids["nats"]
    os.kill(old, signal.SIGKILL)
    killed = time.monotonic()
    n = [0]

    def serving() -> bool:
        n[0] += 1
        return _one(stack.url, f"after-{n[0]}")

    assert wait_for(serving, timeout=30)
    back_s = time.monotonic() - killed
    print(f"serving again {back_s:.2f} s after the kill")
    assert stack.proc.poll() is None  # `up` itself kept running
    # the acceptance target is 2 s; the test allows for a loaded CI machine
    assert back_s < 15, back_s

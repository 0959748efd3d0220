"""One of two routers killed under a backlog: nothing is lost. Requests it had sent to a
worker are answered by that worker (with their rows); those it still queued are resent by
the client (same id, the contract's resend rule) and served by the other router. Every
request ends with exactly one reply per attempt, and exactly one row with the status the
client got."""

from __future__ import annotations

import asyncio
import os
import signal
import uuid

import numpy as np
import pytest

from schemas.codec import pack, unpack
from tests.e2e.conftest import wait_for

pytestmark = pytest.mark.e2e
MODEL = "tiny"
STACK_ARGS = ["--routers", "2"]
# one request per batch: the two routers build a backlog of a few seconds
STACK_ENV = {"OFFRAMP_MAX_BATCH": "1", "OFFRAMP_QUEUE_LIMIT": "4096"}
N = 3000
SLO_MS = 6000.0
RESEND_AFTER_S = SLO_MS / 1e3 + 1.0


async def _load_and_kill(stack, tag: str) -> dict[str, list[tuple[int, dict]]]:
    """Send N requests at once, kill router-2 while they queue, resend the unanswered."""
    nc = await stack.connect("client", "e2e-router-loss")
    replies: dict[str, list[tuple[int, dict]]] = {}

    async def on_reply(msg) -> None:
        _, i, attempt = msg.subject.rsplit(".", 2)
        replies.setdefault(i, []).append((int(attempt), unpack(msg.data)))

    await nc.subscribe(f"_INBOX.client.rl{tag}.>", cb=on_reply)
    await nc.flush()
    x = np.random.default_rng(3).standard_normal((N, 16)).astype(np.float32)
    bodies = [pack({"v": 1, "id": f"rl{tag}-{i}", "inputs": {"x": x[i]}, "slo_ms": SLO_MS})
              for i in range(N)]

    def send(i: int, attempt: int):
        return nc.publish(f"offramp.infer.{MODEL}", bodies[i],
                          reply=f"_INBOX.client.rl{tag}.{i}.{attempt}")

    for i in range(N):
        await send(i, 0)
    await nc.flush()
    await asyncio.sleep(0.3)
    os.kill(stack.pids["router-2"], signal.SIGKILL)
    await asyncio.sleep(RESEND_AFTER_S)
    unanswered = [i for i in range(N) if str(i) not in replies]
    for i in unanswered:
        await send(i, 1)
    await nc.flush()
    await asyncio.sleep(RESEND_AFTER_S + 4)
    await nc.close()
    return replies, unanswered


def test_killing_one_of_two_routers_under_a_backlog_loses_nothing(stack):
    tag = uuid.uuid4().hex[:6]
    replies, resent = asyncio.run(_load_and_kill(stack, tag))
    assert resent, "the killed router held no queued request: the test proved nothing"
    lost = [i for i in range(N) if str(i) not in replies]
    assert lost == [], f"{len(lost)} requests got no reply after a resend"
    per_attempt = [n for got in replies.values()
                   for n in np.bincount([a for a, _ in got]) if n > 1]
    assert per_attempt == [], "an attempt got two replies"
    client = {}
    for i, got in replies.items():
        first = min(got, key=lambda g: g[0])[1]  # what the client kept: its first answer
        client[f"rl{tag}-{i}"] = (first.get("error") or {}).get("code", "ok")

    def rows() -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for rid, status in stack.sql("select request_id, status from requests "
                                     "where request_id like ?", f"rl{tag}-%"):
            out.setdefault(rid, []).append(status)
        return out

    assert wait_for(lambda: len(rows()) == N, timeout=60), len(rows())
    stored = rows()
    assert {r: s for r, s in stored.items() if len(s) > 1} == {}, "a request has two rows"
    assert {r: s[0] for r, s in stored.items()} == client

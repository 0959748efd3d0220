"""The client's resend rule (schemas/README.md, "Resending") against a real nats-server: a
request its router never answers is sent again with the same id and a new reply subject,
and the first answer to any attempt is returned; without the option it times out."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from schemas.codec import pack, unpack
from services.common import bus
from services.common.client import InferError, infer
from services.launcher.natsserver import EmbeddedNats


@pytest.fixture()
def server(tmp_path):
    with EmbeddedNats(tmp_path / "nats") as srv:
        yield srv


async def _serve_all_but_the_first(url: str, attempts: list[tuple[str, str]]):
    """A router that 'dies holding' each request's first attempt: it answers only resends."""
    nc = await bus.connect(url, "t-router")

    async def on(msg) -> None:
        req = unpack(msg.data)
        attempts.append((req["id"], msg.reply))
        if sum(rid == req["id"] for rid, _ in attempts) > 1:
            await nc.publish(msg.reply, pack({"v": 1, "id": req["id"], "label": 7}))

    await nc.subscribe("offramp.infer.m", cb=on)
    await nc.flush()
    return nc


def test_an_unanswered_request_is_resent_with_its_id(server):
    async def go():
        attempts: list[tuple[str, str]] = []
        router = await _serve_all_but_the_first(server.url, attempts)
        nc = await bus.connect(server.url, "t-client")
        x = {"x": np.zeros(4, np.float32)}
        reply = await infer(nc, "m", x, timeout=3.0, request_id="r-1", resend_after_s=0.3)
        with pytest.raises(InferError) as refused:
            await infer(nc, "m", x, timeout=0.5, request_id="r-2")  # no resend: a timeout
        await nc.close()
        await router.close()
        return reply, attempts, refused.value

    reply, attempts, refused = asyncio.run(asyncio.wait_for(go(), 30))
    assert reply["id"] == "r-1" and reply["label"] == 7
    r1 = [reply_to for rid, reply_to in attempts if rid == "r-1"]
    assert len(r1) == 2 and r1[0] != r1[1]  # same id, a new reply subject
    assert refused.code == "timeout" and [rid for rid, _ in attempts].count("r-2") == 1


def test_a_request_over_the_servers_payload_limit_is_named_not_raised(server):
    async def go():
        nc = await bus.connect(server.url, "t-client")
        try:
            big = np.zeros(nc.max_payload, np.uint8)  # an input alone larger than the limit
            with pytest.raises(InferError) as err:
                await infer(nc, "m", {"x": big}, timeout=2.0)
            return err.value
        finally:
            await nc.close()

    err = asyncio.run(go())
    assert err.code == "payload_too_large" and "the server takes at most" in err.message

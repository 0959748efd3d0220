"""End to end, generation: `offramp up --models tiny-llm` streams tokens to `offramp generate`
and to a plain nats-py client written from schemas/README.md ("Generation"); bad requests
get their codes; a killed LLM worker's open stream ends with no_workers, never silently."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import uuid

import msgpack
import pytest

from tests.e2e.conftest import wait_for

pytestmark = pytest.mark.e2e
MODEL = "tiny-llm"


def test_offramp_generate_streams_tokens_and_a_summary(stack):
    done = stack.cli("generate", MODEL, "Once upon a time", "--max-tokens", "8", "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    msgs = [json.loads(line) for line in done.stdout.splitlines()]
    chunks, last = msgs[:-1], msgs[-1]
    assert last["done"] and last["usage"]["completion_tokens"] == sum(
        len(c["tokens"]) for c in chunks) <= 8
    assert [c["seq"] for c in chunks] == list(range(len(chunks)))
    assert last["finish"] in ("stop", "length") and last["depth"] == 6


async def _readme_client(stack, body: dict, kill_after: int | None = None) -> list[dict]:
    """A client from the README alone: subscribe an inbox, publish with it as the reply
    subject, read until a message with "done" or "error"."""
    nc = await stack.connect("client", "e2e-generate")
    inbox = f"_INBOX.client.{uuid.uuid4().hex}"
    sub = await nc.subscribe(inbox)
    await nc.publish(f"offramp.generate.{body.get('model', MODEL)}",
                     msgpack.packb({"v": 1, **body}), reply=inbox)
    got: list[dict] = []
    try:
        while True:
            msg = msgpack.unpackb((await sub.next_msg(timeout=15)).data, raw=False,
                                  strict_map_key=False)
            got.append(msg)
            if kill_after is not None and len(got) == kill_after:
                os.kill(stack.pids[f"worker-{MODEL}-s0-r0"], signal.SIGKILL)
            if msg.get("done") or "error" in msg:
                return got
    finally:
        await nc.close()


def test_a_plain_client_gets_chunks_then_done(stack):
    got = asyncio.run(_readme_client(stack, {"id": "g1", "prompt": "def add(x, y):",
                                             "max_tokens": 5, "stop": ["zzz-never"]}))
    assert got[-1]["done"] and all(m["id"] == "g1" for m in got)
    assert "".join(m["text"] for m in got[:-1]) and got[-1]["model"] == MODEL


@pytest.mark.parametrize("body,code", [
    ({"id": "b1", "model": "no-such-llm", "prompt": "x", "max_tokens": 4}, "unknown_model"),
    ({"id": "b2", "prompt": "", "max_tokens": 4}, "bad_request"),
    ({"id": "b3", "prompt": "x", "max_tokens": 0}, "bad_request"),
    ({"id": "b4", "prompt_tokens": [1] * 600, "max_tokens": 4}, "bad_request"),  # context
])
def test_bad_requests_get_their_code(stack, body, code):
    (err,) = asyncio.run(_readme_client(stack, body))
    assert err["error"]["code"] == code and err["id"] == body["id"]


def test_a_killed_llm_worker_ends_its_streams_with_an_error(stack):
    got = asyncio.run(_readme_client(stack, {"id": "k1", "prompt": "The sea",
                                             "max_tokens": 400}, kill_after=3))
    assert got[-1].get("error", {}).get("code") == "no_workers", got[-1]
    assert "lost" in got[-1]["error"]["message"]
    # the supervisor brings a worker back, and streams flow again
    assert wait_for(lambda: asyncio.run(_readme_client(
        stack, {"id": f"k2-{uuid.uuid4().hex[:4]}", "prompt": "hi", "max_tokens": 2}
    ))[-1].get("done"), timeout=90, interval=2)


def test_generation_requests_are_stored_with_what_served_them(stack):
    """Every generation request gets a `requests` row: the worker's for the streams it ends
    (the candidate and depth that served it as variant), the router's for errors it answers
    itself (runs after the tests above, in file order)."""
    rid = f"row-{uuid.uuid4().hex[:6]}"
    assert asyncio.run(_readme_client(stack, {"id": rid, "prompt": "hi",
                                              "max_tokens": 3}))[-1].get("done")
    expected = {rid: ("ok", f"{MODEL}@6"), "b2": ("bad_request", None),
                "k1": ("no_workers", None)}

    def rows() -> dict:
        got = stack.sql("SELECT request_id, status, variant, latency_ms FROM requests "
                        "WHERE model = ?", MODEL)
        return {r[0]: r for r in got if r[0] in expected}

    assert wait_for(lambda: len(rows()) == len(expected), timeout=60, interval=1), rows()
    for request_id, (status, variant) in expected.items():
        row = rows()[request_id]
        assert (row[1], row[2]) == (status, variant) and row[3] >= 0, row

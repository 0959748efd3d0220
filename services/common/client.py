"""A Python client of the public contract (``schemas/README.md``): what ``offramp infer``,
the demo and the benchmarks use. It speaks only the documented wire format."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
from nats.aio.client import Client
from nats.errors import MaxPayloadError, NoRespondersError
from nats.errors import TimeoutError as NatsTimeout

from schemas import errors, subjects
from schemas.codec import SCHEMA_VERSION, pack, unpack
from services.common.bus import is_no_responders
from services.common.hotpath import requester


class InferError(Exception):
    def __init__(self, code: str, message: str, reply: dict | None = None) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.reply = reply or {}


async def infer(nc: Client, model: str, inputs: dict[str, np.ndarray], slo_ms: float | None = None,
                timeout: float = 5.0, request_id: str | None = None,
                resend_after_s: float | None = None) -> dict[str, Any]:
    """Send one request; return the success reply map or raise :class:`InferError`.

    ``resend_after_s``: with no reply by then (its router died holding it, or none was up),
    send it again, same id, until ``timeout`` (the contract's resend rule)."""
    msg: dict[str, Any] = {"v": SCHEMA_VERSION, "id": request_id or uuid.uuid4().hex,
                           "model": model, "inputs": inputs}
    if slo_ms is not None:
        msg["slo_ms"] = float(slo_ms)
    data = pack(msg)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    last: InferError | None = None
    while True:
        left = deadline - loop.time()
        if last is not None and left <= 0.05:
            raise last  # what the last try met, not a try with no time left
        try:
            reply = await request_raw(nc, subjects.infer(model), data,
                                      min(left, resend_after_s or left))
            break
        except InferError as exc:
            if resend_after_s is None or exc.code not in RESENDABLE or \
                    loop.time() >= deadline - 0.05:
                raise
            last = exc
            if exc.code == "no_responders":  # a router restarting: give it a moment
                await asyncio.sleep(min(0.2, max(0.0, deadline - loop.time())))
    if "error" in reply:
        err = reply["error"] or {}
        raise InferError(err.get("code", errors.INTERNAL), err.get("message", ""), reply)
    return reply


RESENDABLE = ("timeout", "no_responders")


async def request_raw(nc: Client, subject: str, data: bytes, timeout: float) -> dict[str, Any]:
    try:
        resp = await (await requester(nc)).request(subject, data, timeout)
    except NoRespondersError:
        raise InferError("no_responders", f"nothing serves {subject}: is `offramp up` running?") from None
    except MaxPayloadError:
        raise InferError(errors.PAYLOAD_TOO_LARGE, f"the request is {len(data):,} bytes; the "
                         f"server takes at most {nc.max_payload:,}") from None
    except NatsTimeout:
        raise InferError("timeout", f"no reply on {subject} within {timeout:.3g} s") from None
    return unpack(resp.data)


async def models(nc: Client, timeout: float = 2.0) -> list[dict[str, Any]]:
    return (await request_raw(nc, subjects.MODELS, b"", timeout))["models"]


async def generate(nc: Client, model: str, prompt: str | None = None,
                   prompt_tokens: list[int] | None = None, max_tokens: int = 64,
                   stop: tuple[str, ...] = (), chat: bool = False,
                   ttft_slo_ms: float | None = None, request_id: str | None = None,
                   silence_s: float = 10.0) -> AsyncIterator[dict[str, Any]]:
    """Stream a generation (``offramp.generate.<model>``): yields each token chunk and then
    the done message; raises :class:`InferError` for an error reply, or when nothing comes
    for ``silence_s`` (the router or the whole stack is gone)."""
    msg: dict[str, Any] = {"v": SCHEMA_VERSION, "id": request_id or uuid.uuid4().hex,
                           "model": model, "max_tokens": int(max_tokens)}
    if prompt is not None:
        msg["prompt"] = prompt
    if prompt_tokens is not None:
        msg["prompt_tokens"] = list(prompt_tokens)
    if stop:
        msg["stop"] = list(stop)
    if chat:
        msg["chat"] = True
    if ttft_slo_ms is not None:
        msg["ttft_slo_ms"] = float(ttft_slo_ms)
    inbox = nc.new_inbox()
    sub = await nc.subscribe(inbox)  # before the request: the first chunk may come at once
    try:
        await nc.publish(subjects.generate(model), pack(msg), reply=inbox)
        while True:
            try:
                got_msg = await sub.next_msg(timeout=silence_s)
            except NatsTimeout:
                raise InferError("timeout", f"nothing on the stream for {silence_s} s: is "
                                 "`offramp up` running?") from None
            if is_no_responders(got_msg):  # no router is up
                raise InferError("no_responders", f"nothing serves {subjects.generate(model)}:"
                                 " is `offramp up` running?")
            got = unpack(got_msg.data)
            if "error" in got:
                err = got["error"] or {}
                raise InferError(err.get("code", errors.INTERNAL), err.get("message", ""), got)
            yield got
            if got.get("done"):
                return
    finally:
        await sub.unsubscribe()

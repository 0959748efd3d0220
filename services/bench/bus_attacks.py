"""The five attacks a holder of CLIENT credentials might try on the bus, and the
permission errors the server must answer each with (``schemas/roles.py``):

1. forged exit config: publish version 999999 on ``offramp.config.<model>``;
2. fake worker: heartbeat as a worker and subscribe to batches (``offramp.work.*``);
3. stolen router queue: join the routers' queue group on ``offramp.infer.*``;
4. forged telemetry: publish request records on ``offramp.telemetry.requests.<model>``;
5. stream deletion: delete the JetStream stream that holds the telemetry.

Used by ``offramp bench chaos`` and by the e2e test of the bus's permissions."""

from __future__ import annotations

import asyncio
import contextlib
import time

import nats
from nats.aio.client import Client

from schemas import subjects
from schemas.codec import pack
from schemas.heartbeat import Heartbeat
from schemas.messages import ExitConfig
from schemas.roles import inbox_prefix
from services.common.credentials import Login, url_user

FORGED_VERSION = 999999


def fake_worker(model: str, tag: str) -> str:
    return f"{model}-s0-evil{tag}"


def forged_request_id(tag: str) -> str:
    """The id the forged telemetry records: no row may ever carry it."""
    return f"evil{tag}-0"


def expected_refusals(model: str, tag: str) -> dict[str, list[str]]:
    """Per attack, the (lower-case) permission errors the server must report."""
    deny = "permissions violation for"
    return {
        "forged-config": [f'{deny} publish to "{subjects.exit_config(model)}"'],
        "fake-worker": [f'{deny} publish to "{subjects.HEARTBEAT}"',
                        f'{deny} subscription to "{subjects.work(fake_worker(model, tag))}"',
                        f'{deny} subscription to "{subjects.work("*")}"'],
        "router-queue": [(f'{deny} subscription to "{subjects.INFER_ALL}" using queue '
                         f'"{subjects.ROUTER_QUEUE}"')],
        "forged-telemetry": [f'{deny} publish to "{subjects.telemetry_requests(model)}"'],
        "stream-delete": [(f'{deny} publish to "$js.api.stream.delete.'
                          f'{subjects.TELEMETRY_STREAM.lower()}"')],
    }


def refused(errors: list[str], model: str, tag: str) -> dict[str, bool]:
    """Per attack: did the server refuse every step of it?"""
    seen = " | ".join(errors).lower()
    return {attack: all(e in seen for e in expect)
            for attack, expect in expected_refusals(model, tag).items()}


async def connect_attacker(url: str, login: Login | None, name: str,
                           errors: list[str]) -> Client:
    """A plain nats-py connection whose asynchronous errors (the server's permission
    violations arrive that way) are appended to ``errors``."""
    async def on_error(exc: Exception) -> None:
        errors.append(str(exc))

    user = url_user(url) or (login.user if login else None)
    auth = {"user": login.user, "password": login.password} if login and not url_user(url) else {}
    if user:
        auth["inbox_prefix"] = inbox_prefix(user)
    return await nats.connect(url, name=name, error_cb=on_error, allow_reconnect=False,
                              connect_timeout=5, **auth)


async def _ignore(msg) -> None:
    pass


async def attack(nc: Client, model: str, tag: str) -> None:
    """Every attack through ``nc``; the refusals reach its error callback."""
    forged = ExitConfig(model, FORGED_VERSION, "latency", {0: 0.0}, [0])
    await nc.publish(subjects.exit_config(model), forged.encode())
    evil = fake_worker(model, tag)
    await nc.publish(subjects.HEARTBEAT, Heartbeat(
        worker=evil, model=model, stage=0, stages=1, capacity=8).encode())
    await nc.subscribe(subjects.work(evil), cb=_ignore)
    await nc.subscribe(subjects.work("*"), cb=_ignore)
    await nc.subscribe(subjects.INFER_ALL, queue=subjects.ROUTER_QUEUE, cb=_ignore)
    record = {"id": forged_request_id(tag), "t": time.time(), "latency_ms": 1.0, "status": "ok",
              "exit": -1, "early": False, "label": 0, "config_version": FORGED_VERSION}
    await nc.publish(subjects.telemetry_requests(model),
                     pack({"v": 1, "model": model, "router": "router-evil", "records": [record]}),
                     headers={"Nats-Msg-Id": f"evil:{tag}"})
    with contextlib.suppress(Exception):  # refused: its reply never comes (a timeout)
        await nc.jetstream(timeout=1).delete_stream(subjects.TELEMETRY_STREAM)
    await nc.flush()
    await asyncio.sleep(0.5)  # the last refusals arrive after the flush's PONG

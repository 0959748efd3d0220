"""The bus `offramp up` starts admits only its roles: anonymous or wrong logins are refused,
and a client's five attacks (forged exit config, fake worker, stolen router queue, forged
telemetry, stream deletion) each fail with a permission error while serving goes on with
configs, routing, telemetry rows and the stream unchanged."""

from __future__ import annotations

import asyncio
import contextlib
import uuid

import numpy as np
import pytest

from schemas import subjects
from schemas.codec import pack
from schemas.heartbeat import Heartbeat
from schemas.messages import ExitConfig
from services.common import bus
from services.common.credentials import Login
from services.loadgen.drive import drive
from tests.e2e.conftest import wait_for

pytestmark = pytest.mark.e2e
MODEL = "tiny"
ATTACKS = True  # the server logs the violations this module provokes


def _inputs(n: int, seed: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [{"x": rng.standard_normal(16).astype(np.float32)} for _ in range(n)]


def test_anonymous_and_wrong_logins_are_refused(stack):
    async def run():
        with pytest.raises(bus.AuthorizationError, match="anonymous"):
            await bus.connect(stack.url, "e2e-anon", connect_timeout=3)
        with pytest.raises(bus.AuthorizationError, match="'client'"):
            await bus.connect(stack.url, "e2e-bad", connect_timeout=3,
                              login=Login("client", "not-the-password"))

    asyncio.run(run())


def test_the_cli_prints_a_client_url_that_serves(stack):
    out = stack.cli("credentials", "client")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == stack.client_url and "client:" in stack.client_url
    out = stack.cli("infer", MODEL)  # the CLI finds the client login in OFFRAMP_HOME
    assert out.returncode == 0 and '"label"' in out.stdout, out.stdout + out.stderr


async def _attack(stack, tag: str) -> tuple[list[str], object]:
    """Each attack through one client connection; the permission errors it got back."""
    errors: list[str] = []
    nc = await bus.connect(stack.client_url, f"e2e-attacker-{tag}")
    nc._error_cb = _collect(errors)
    forged = ExitConfig(MODEL, 999999, "latency", {0: 0.0}, [0])
    await nc.publish(subjects.exit_config(MODEL), forged.encode())
    await nc.publish(subjects.HEARTBEAT, Heartbeat(
        worker=f"{MODEL}-s0-evil{tag}", model=MODEL, stage=0, stages=1, capacity=8).encode())
    await nc.subscribe(subjects.work(f"{MODEL}-s0-evil{tag}"), cb=_ignore)
    await nc.subscribe(subjects.INFER_ALL, queue=subjects.ROUTER_QUEUE, cb=_ignore)
    await nc.publish(subjects.telemetry_requests(MODEL), pack({"v": 1, "records": []}),
                     headers={"Nats-Msg-Id": f"evil:{tag}"})
    with contextlib.suppress(Exception):  # refused: its reply never comes (a timeout)
        await nc.jetstream(timeout=1).delete_stream(subjects.TELEMETRY_STREAM)
    await nc.flush()
    await asyncio.sleep(0.5)
    return errors, nc


def _collect(errors: list[str]):
    async def on_error(exc: Exception) -> None:
        errors.append(str(exc))

    return on_error


async def _ignore(msg) -> None:
    pass


def test_each_client_attack_is_refused_and_serving_is_unaffected(stack):
    tag = uuid.uuid4().hex[:6]

    async def run():
        errors, attacker = await _attack(stack, tag)
        client = await stack.connect("client", "e2e-victim")
        outcomes = await drive(client, MODEL, _inputs(200, 1), concurrency=8, slo_ms=5000)
        await client.close()
        await attacker.close()
        return errors, outcomes

    errors, outcomes = asyncio.run(run())
    refused = " | ".join(errors).lower()
    for what in (f'publish to "{subjects.exit_config(MODEL)}"',
                 f'publish to "{subjects.HEARTBEAT}"',
                 f'subscription to "{subjects.work(f"{MODEL}-s0-evil{tag}")}"',
                 f'subscription to "{subjects.INFER_ALL}" using queue "{subjects.ROUTER_QUEUE}"',
                 f'publish to "{subjects.telemetry_requests(MODEL)}"',
                 f'publish to "$js.api.stream.delete.{subjects.TELEMETRY_STREAM.lower()}"'):
        assert f"permissions violation for {what}".lower() in refused, (what, errors)
    # every request answered by the real pipeline, on the real config
    assert [o.code for o in outcomes if not o.ok] == []
    assert {o.config_version for o in outcomes} == {1}
    ids = {o.request_id for o in outcomes}
    rows = wait_for(lambda: len(ids & {r for (r,) in stack.sql(
        "select request_id from requests")}) == len(ids), timeout=20)
    assert rows
    assert stack.sql("select max(version) from exit_configs where model = ?", MODEL)[0][0] == 1
    assert stack.sql("select count(*) from requests where request_id like 'evil%'")[0][0] == 0
    assert _stream_messages(stack) > 0  # the stream is still there, with its telemetry


def _stream_messages(stack) -> int:
    async def check():
        nc = await stack.connect("monitor", "e2e-stream")
        try:
            return (await nc.jetstream().stream_info(subjects.TELEMETRY_STREAM)).state.messages
        finally:
            await nc.close()

    return asyncio.run(check())

"""The bus `offramp up` starts admits only its roles: anonymous or wrong logins are refused,
and a client's five attacks (forged exit config, fake worker, stolen router queue, forged
telemetry, stream deletion) each fail with a permission error while serving goes on with
configs, routing, telemetry rows and the stream unchanged."""

from __future__ import annotations

import asyncio
import uuid

import numpy as np
import pytest

from schemas import subjects
from services.bench import bus_attacks
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


def test_each_client_attack_is_refused_and_serving_is_unaffected(stack):
    tag = uuid.uuid4().hex[:6]

    async def run():
        errors: list[str] = []
        attacker = await bus_attacks.connect_attacker(stack.client_url, None,
                                                      f"e2e-attacker-{tag}", errors)
        await bus_attacks.attack(attacker, MODEL, tag)
        client = await stack.connect("client", "e2e-victim")
        outcomes = await drive(client, MODEL, _inputs(200, 1), concurrency=8, slo_ms=5000)
        await client.close()
        await attacker.close()
        return errors, outcomes

    errors, outcomes = asyncio.run(run())
    assert bus_attacks.refused(errors, MODEL, tag) == dict.fromkeys(
        bus_attacks.expected_refusals(MODEL, tag), True), errors
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


def test_an_application_login_added_while_up_runs_serves_and_reads_only_its_inbox(stack):
    out = stack.cli("credentials", "client", "--name", "shop")
    assert out.returncode == 0, out.stderr
    url = out.stdout.strip()
    assert url.startswith("nats://client-shop:")

    async def run():
        for _ in range(50):  # `up` reloads the server's logins within its 0.2 s poll
            try:
                nc = await bus.connect(url, "e2e-app", connect_timeout=2)
                break
            except bus.AuthorizationError:
                await asyncio.sleep(0.1)
        errors: list[str] = []

        async def refused(exc: Exception) -> None:
            errors.append(str(exc))

        async def ignore(msg) -> None:
            pass

        nc._error_cb = refused
        outcomes = await drive(nc, MODEL, _inputs(20, 2), concurrency=4, slo_ms=5000)
        await nc.subscribe("_INBOX.client.>", cb=ignore)  # another application's replies
        await nc.flush()
        await asyncio.sleep(0.3)
        await nc.close()
        return outcomes, errors

    outcomes, errors = asyncio.run(run())
    assert [o.code for o in outcomes] == ["ok"] * 20
    assert any('subscription to "_inbox.client.>"' in e.lower() for e in errors), errors

"""The tuner's HELIOS breach loop on a real bus: it follows the optimizer's decisions,
counts the breaches in generation telemetry, publishes one BreachAlert when the Confidence
Breach Counter trips, and shrugs off messages it cannot decode."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from schemas import subjects
from schemas.codec import SCHEMA_VERSION, pack, unpack
from schemas.helios import BreachAlert, GenerationRecord, GenerationTelemetry, HeliosChoice
from services.common import bus, config
from services.launcher.natsserver import EmbeddedNats
from services.tuner.breach_counter import CBC_MAX
from services.tuner.service import Tuner

MODEL = "llm"


def telemetry(n: int, tokens: int, breached: int, depth: int = 6,
              judged: float | None = None) -> bytes:
    """``n`` streams of ``tokens`` tokens, the first ``breached`` of each breaching
    (``judged``: records that complete streams sent before, with that judged score)."""
    recs = [GenerationRecord(id=f"s{i}", t=0.0, candidate="a", depth=depth, assessment=1,
                             prompt_tokens=4, tokens=tokens, ttft_ms=1.0, tpot_ms=1.0,
                             duration_ms=1.0, logprob=-1.0, exits={depth: tokens},
                             breach_at=list(range(breached)), judged_logprob=judged)
            for i in range(n)]
    return GenerationTelemetry(MODEL, "w1", recs).encode()


async def settle(nc) -> None:
    await nc.flush()
    await asyncio.sleep(0.2)


async def scenario(tmp_path: Path) -> list[BreachAlert]:
    with EmbeddedNats(tmp_path / "nats") as srv:
        nc = await bus.connect(srv.url, "test")
        tuner = Tuner(nc, config.load(), None, logging.getLogger("test.tuner"))
        await nc.subscribe(subjects.helios_decision("*"), cb=tuner.on_decision)
        await nc.subscribe(subjects.telemetry_generation("*"), cb=tuner.on_generation)
        got: list[BreachAlert] = []

        async def on_alert(msg) -> None:
            got.append(BreachAlert.decode(unpack(msg.data)))

        await nc.subscribe(subjects.helios_breach("*"), cb=on_alert)
        gen, dec = subjects.telemetry_generation(MODEL), subjects.helios_decision(MODEL)
        await nc.publish(gen, telemetry(10, 20, 20))  # before any decision: not counted
        await nc.publish(dec, b"\x93garbage")
        await nc.publish(gen, pack({"v": SCHEMA_VERSION, "model": MODEL}))
        await nc.publish(dec, HeliosChoice(MODEL, 1, "load", "a", 6, 1).encode())
        await nc.publish(gen, telemetry(4, 10, 10, depth=12))  # the old depth: not counted
        await nc.publish(gen, telemetry(5, 20, 10))  # 50 of 100: tolerated
        await nc.publish(gen, telemetry(5, 20, 20, judged=-2.0))  # completions: not again
        await settle(nc)
        assert got == []
        await nc.publish(gen, telemetry(5, 20, 20))  # trips, then silent until a decision
        await nc.publish(dec, HeliosChoice(MODEL, 1, "load", "a", 6, 1).encode())  # repeated
        await nc.publish(gen, telemetry(5, 20, 20))
        await settle(nc)
        assert len(got) == 1
        await nc.publish(dec, HeliosChoice(MODEL, 2, "stay", "a", 6, 1).encode())
        await nc.publish(gen, telemetry(3, 20, 20))  # counted afresh: 60 > 50
        await settle(nc)
        await bus.close(nc)
        return got


def test_the_tuner_alerts_once_per_decision_when_the_counter_trips(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="test.tuner")
    got = asyncio.run(scenario(tmp_path))
    assert [(a.decision, a.candidate, a.depth) for a in got] == [(1, "a", 6), (2, "a", 6)]
    assert all(a.breaches == CBC_MAX + 1 and a.window == 100 for a in got)
    errors = sorted(r.getMessage() for r in caplog.records if r.levelno == logging.ERROR)
    assert len(errors) == 2  # each subscription has its own task: no order between them
    assert errors[0].startswith("bad HELIOS decision")
    assert errors[1].startswith("bad generation telemetry")
    assert any("confidence breach" in r.getMessage() for r in caplog.records)

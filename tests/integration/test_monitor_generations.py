"""The monitor stores LLM workers' generation telemetry (schemas/README.md, "Generation
telemetry") from the JetStream telemetry stream of a real nats-server into a real store: one
``generations`` row per stream, each message acked once committed, a poison message acked
and dropped, the count in the status reply."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from datetime import UTC, datetime
from pathlib import Path

from schemas import subjects
from schemas.codec import pack, unpack
from schemas.helios import GenerationRecord, GenerationTelemetry
from services.common import bus, config
from services.launcher.natsserver import EmbeddedNats
from services.monitor.service import MSG_ID, Monitor, subscribe
from services.store import Store

LOG = logging.getLogger("test")
T = 1_900_000_000.25
SERVED = GenerationRecord("g-1", T, "opt-1.3b", 12, 3, prompt_tokens=7, tokens=5, ttft_ms=40.0,
                          tpot_ms=20.0, duration_ms=120.0, logprob=-2.5, exits={6: 3, 12: 2},
                          breach_at=[1, 4], memory_bytes=3_000_000_000, judging=True)
OUTSIDE = dataclasses.replace(SERVED, id="g-2", assessment=None, breach_at=[], judging=False)
JUDGED = dataclasses.replace(SERVED, judged_logprob=-3.5, judging=False)  # completes g-1


async def _publish_and_store(url: str, store: Store) -> tuple[dict, dict]:
    nc = await bus.connect(url, "test")
    psub = await subscribe(nc)  # the monitor's stream and durable consumer
    js = nc.jetstream()
    subject = subjects.telemetry_generation("chat")
    report = GenerationTelemetry("chat", "chat-s0-abcdef", [SERVED, OUTSIDE]).encode()
    await js.publish(subject, report, headers={MSG_ID: "chat-s0-abcdef:1"})
    await js.publish(subject, pack({"v": 1, "model": "chat"}), headers={MSG_ID: "bad:1"})
    await js.publish(subject, report, headers={MSG_ID: "chat-s0-abcdef:2"})  # a resend
    await js.publish(subject, GenerationTelemetry("chat", "chat-s0-abcdef", [JUDGED]).encode(),
                     headers={MSG_ID: "chat-s0-abcdef:j3"})
    monitor = Monitor(nc, config.load(), store, LOG)
    for msg in await psub.fetch(4, timeout=5.0):
        await monitor.handle(msg)
    await nc.subscribe(subjects.STATUS_MONITOR, cb=monitor.on_status)
    status = unpack((await nc.request(subjects.STATUS_MONITOR, b"", timeout=5.0)).data)
    info = await js.consumer_info(subjects.TELEMETRY_STREAM, subjects.MONITOR_DURABLE)
    await bus.close(nc)
    return status, {"ack_pending": info.num_ack_pending, "pending": info.num_pending}


def test_generation_telemetry_becomes_rows_once(store: Store, tmp_path: Path) -> None:
    with EmbeddedNats(tmp_path / "nats") as srv:
        status, consumer = asyncio.run(asyncio.wait_for(_publish_and_store(srv.url, store), 30))
    assert consumer == {"ack_pending": 0, "pending": 0}  # the poison message too
    (served,) = store.generations("chat", 3)
    assert {k: served[k] for k in ("request_id", "worker", "candidate", "depth", "tokens",
                                   "exits", "breaches", "memory_bytes", "logprob",
                                   "judged_logprob")} == {
        "request_id": "g-1", "worker": "chat-s0-abcdef", "candidate": "opt-1.3b", "depth": 12,
        "tokens": 5, "exits": {6: 3, 12: 2}, "breaches": 2, "memory_bytes": 3_000_000_000,
        "logprob": -2.5, "judged_logprob": -3.5}
    assert served["received_at"] == datetime.fromtimestamp(T, UTC).replace(tzinfo=None)
    with store.engine.connect() as conn:  # g-2 is stored too, outside any assessment
        rows = conn.exec_driver_sql(
            "SELECT request_id, assessment FROM generations ORDER BY id").fetchall()
    assert [tuple(r) for r in rows] == [("g-1", 3), ("g-2", None)]  # the resend added nothing
    # streams offered, the resend included; the record completing g-1 is no new stream
    assert status["generations_stored"] == 4 and status["requests_stored"] == 0

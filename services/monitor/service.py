"""Exit monitor: consumes telemetry from JetStream, keeps windows, writes the store:
sample telemetry into windows (``exit_profiles``), request telemetry into ``requests`` and
LLM workers' generation telemetry into ``generations`` (what the profiler builds HELIOS's
Performance History Table from).

Telemetry is acked only after the rows derived from it are committed, and each window,
request batch or generation batch carries a stable ingest key (the publisher's message id),
so a monitor that is killed and restarted, or a stream that is re-created, neither loses nor
double-counts committed telemetry.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.errors import NotFoundError

from schemas import subjects
from schemas.codec import pack
from schemas.helios import GenerationRecord, GenerationTelemetry
from schemas.messages import decode_map
from schemas.telemetry import RequestTelemetry, SampleTelemetry
from services.common import bus, gc_pauses, logs, metrics
from services.common.config import Config
from services.common.readiness import mark_ready
from services.common.stats import wilson_interval
from services.monitor.profile_windows import ProfileWindow, SampleBatch, WindowTracker, utc_datetime
from services.store.repository import Store

FETCH_BATCH = 256
IDLE_FLUSH_S = 2.0      # close partial windows when telemetry stops
ACK_WAIT_S = 60.0
MSG_ID = "Nats-Msg-Id"  # set by the publishers of telemetry
STREAM_CHECK_S = 5.0    # how often the stream and consumer are checked while fetches succeed
PRUNE_EVERY_S = 3600.0
KEEP_KEYS_S = 86400.0   # ingest keys kept this long (redeliveries come within minutes)

Handler = Callable[[Msg, Any, str], Awaitable[None]]  # (message, decoded telemetry, ingest key)


class Monitor:
    def __init__(self, nc: Client, cfg: Config, store, log) -> None:
        self.nc = nc
        self.store = store
        self.log = log
        self.windows = WindowTracker(cfg.monitor_window)
        self.unacked: dict[str, list[Msg]] = {}    # window first key -> messages in it
        self.last_sample = time.monotonic()
        self.requests_stored = 0
        self.generations_stored = 0
        self.windows_stored = 0
        self.agreement = metrics.Children(metrics.AGREEMENT)
        self.exit_rate = metrics.Children(metrics.EXIT_RATE)
        self.windows_closed = metrics.Children(metrics.WINDOWS)

    async def handle(self, msg: Msg) -> None:
        # the publisher's message id: stable across redeliveries and across a re-created
        # stream, whose sequence numbers start again at 1
        key = (msg.headers or {}).get(MSG_ID) or f"seq:{msg.metadata.sequence.stream}"
        decode, handler = self._route(msg.subject)
        try:
            telemetry = decode(decode_map(msg.data))
        except Exception as exc:  # noqa: BLE001 - poison message: log and drop it from the stream
            self.log.error("undecodable telemetry key=%s: %r", key, exc)
            await msg.ack()
            return
        await handler(msg, telemetry, key)

    def _route(self, subject: str) -> tuple[Callable[[dict], Any], Handler]:
        """The decoder and the handler of the telemetry on ``subject``."""
        if subject.startswith(subjects.telemetry_requests("")):
            return RequestTelemetry.decode, self._store_requests
        if subject.startswith(subjects.telemetry_generation("")):
            return GenerationTelemetry.decode, self._store_generations
        return SampleTelemetry.decode, self._add_samples

    async def _store_requests(self, msg: Msg, telemetry: RequestTelemetry, key: str) -> None:
        rows = [{"request_id": r.id or "", "model": telemetry.model, "received_at": utc_datetime(r.t),
                 "latency_ms": r.latency_ms, "status": r.status, "exit": r.exit,
                 "early": r.early, "label": r.label, "config_version": r.config_version,
                 "variant": r.variant}
                for r in telemetry.records]
        await asyncio.to_thread(self.store.add_requests, rows, f"req:{key}")
        self.requests_stored += len(rows)
        await msg.ack()

    async def _store_generations(self, msg: Msg, telemetry: GenerationTelemetry,
                                 key: str) -> None:
        rows = [generation_row(telemetry, r) for r in telemetry.records]
        await asyncio.to_thread(self.store.add_generations, rows, f"gen:{key}")
        self.generations_stored += sum(not r.completes for r in telemetry.records)
        await msg.ack()

    async def _add_samples(self, msg: Msg, telemetry: SampleTelemetry, key: str) -> None:
        self.last_sample = time.monotonic()
        batch = SampleBatch.of(key, telemetry)
        closed = self.windows.add(batch)
        # The message belongs to the window still open after add, or else to the last one it closed.
        win = self.windows.open.get(batch.model) or closed[-1]
        self.unacked.setdefault(win.first_key, []).append(msg)
        for w in closed:
            await self._commit(w)

    async def _commit(self, win: ProfileWindow) -> None:
        key = f"win:{win.model}:{win.first_key}"
        await asyncio.to_thread(self.store.add_exit_profiles, win.rows(), key)
        self.windows_stored += 1
        self.agreement[win.model].set(win.agreement)
        self.exit_rate[win.model].set(win.exit_rate)
        self.windows_closed[win.model].inc()
        for m in self.unacked.pop(win.first_key, []):
            await m.ack()

    async def idle_flush(self) -> None:
        if self.windows.open and time.monotonic() - self.last_sample > IDLE_FLUSH_S:
            for w in self.windows.flush():
                await self._commit(w)

    async def on_status(self, msg: Msg) -> None:
        out = {m: {"config_version": w.config_version, "samples": w.samples,
                   "agreement": w.agreement,
                   "agreement_ci": list(wilson_interval(w.agree, w.samples) or (1.0, 1.0)),
                   "exit_rate": w.exit_rate,
                   "ramp_exit_rates": {r: c / w.samples for r, c in w.exits.items()},
                   "window_end": w.end}
               for m, w in self.windows.latest.items()}
        await msg.respond(pack({"v": 1, "models": out, "requests_stored": self.requests_stored,
                                "generations_stored": self.generations_stored,
                                "windows_stored": self.windows_stored}))


def generation_row(telemetry: GenerationTelemetry, r: GenerationRecord) -> dict:
    """The ``generations`` row of one stream a worker reported."""
    return {"request_id": r.id, "model": telemetry.model, "worker": telemetry.worker,
            "received_at": utc_datetime(r.t), "candidate": r.candidate, "depth": r.depth,
            "assessment": r.assessment, "prompt_tokens": r.prompt_tokens, "tokens": r.tokens,
            "ttft_ms": r.ttft_ms, "tpot_ms": r.tpot_ms, "duration_ms": r.duration_ms,
            "logprob": r.logprob, "exits": r.exits, "breaches": len(r.breach_at),
            "memory_bytes": r.memory_bytes, "checked": r.checked, "agreed": r.agreed,
            "first_deviation": r.first_deviation, "judged_logprob": r.judged_logprob,
            "judging": r.judging, "decode_ms": r.decode_ms}


async def subscribe(nc: Client):
    """The monitor's pull subscription on the telemetry stream (both made if missing)."""
    await bus.ensure_telemetry_stream(nc)
    consumer = ConsumerConfig(durable_name=subjects.MONITOR_DURABLE, ack_policy=AckPolicy.EXPLICIT,
                              deliver_policy=DeliverPolicy.ALL, ack_wait=ACK_WAIT_S,
                              max_ack_pending=100_000, max_deliver=-1)
    return await nc.jetstream().pull_subscribe(
        subjects.TELEMETRY_ALL, durable=subjects.MONITOR_DURABLE,
        stream=subjects.TELEMETRY_STREAM, config=consumer)


class Upkeep:
    """The monitor's periodic chores between fetches: re-create a telemetry stream or
    consumer that disappeared (else telemetry would pile up nowhere), and forget ingest
    keys older than any redelivery."""

    def __init__(self, nc: Client, store, log) -> None:
        self.nc, self.store, self.log = nc, store, log
        self.checked = time.monotonic()
        self.pruned = 0.0

    async def stream_gone(self) -> bool:
        try:
            await self.nc.jetstream().consumer_info(subjects.TELEMETRY_STREAM,
                                                    subjects.MONITOR_DURABLE)
            return False
        except NotFoundError:
            return True

    async def due(self, psub, failed: bool):
        """The subscription to fetch from next: a new one when the stream or the consumer
        is gone (checked after a failed fetch, else every ``STREAM_CHECK_S``)."""
        now = time.monotonic()
        if failed or now - self.checked > STREAM_CHECK_S:
            self.checked = now
            if await self.stream_gone():
                self.log.warning("telemetry stream or consumer missing: re-creating them")
                psub = await subscribe(self.nc)
        if now - self.pruned > PRUNE_EVERY_S:
            self.pruned = now
            before = datetime.now(UTC) - timedelta(seconds=KEEP_KEYS_S)
            n = await asyncio.to_thread(self.store.prune_ingested, before)
            if n:
                self.log.info("ingest keys pruned %s", logs.kv(rows=n))
        return psub


async def serve(cfg: Config, stop: asyncio.Event) -> None:
    log = logs.setup("monitor", cfg.log_level)
    store = Store(cfg.database_url)
    nc = await bus.connect_as(cfg, "monitor", "offramp-monitor")
    psub = await subscribe(nc)
    monitor = Monitor(nc, cfg, store, log)
    upkeep = Upkeep(nc, store, log)
    await nc.subscribe(subjects.STATUS_MONITOR, cb=monitor.on_status)
    gc_pauses.settle(cfg.gc_freeze)  # the startup heap: out of every later collection
    log.info("monitor ready %s", logs.kv(window=cfg.monitor_window))
    mark_ready()
    while not stop.is_set():
        failed = False
        try:
            msgs = await psub.fetch(FETCH_BATCH, timeout=0.5)
        except TimeoutError:
            msgs = []
        except Exception as exc:  # noqa: BLE001 - e.g. while reconnecting
            log.warning("fetch failed: %r", exc)
            msgs, failed = [], True
        for m in msgs:
            try:
                await monitor.handle(m)
            except Exception:
                log.exception("telemetry not stored (will be redelivered)")
        try:
            await monitor.idle_flush()
            psub = await upkeep.due(psub, failed)
        except Exception:
            log.exception("idle flush or upkeep failed")
            await asyncio.sleep(0.5)
    # Partial windows stay unacked: the next monitor rebuilds them from the stream. The pull
    # inbox may hold replies to fetches that timed out, which nothing takes: a drain would
    # wait its whole timeout for them, so it goes first (its durable consumer stays).
    with contextlib.suppress(Exception):
        await psub.unsubscribe()
    await bus.close(nc)
    store.close()

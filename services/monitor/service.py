"""Exit monitor: consumes telemetry from JetStream, keeps windows, writes the store.

Telemetry is acked only after the rows derived from it are committed, and each
window / request batch carries a stable ingest key, so a monitor that is killed and
restarted neither loses nor double-counts committed telemetry.
"""

from __future__ import annotations

import asyncio
import time

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from schemas import subjects
from schemas.codec import pack
from schemas.messages import decode_map
from schemas.telemetry import RequestTelemetry, SampleTelemetry
from services.common import bus, logs
from services.common.config import Config
from services.monitor.profile_windows import ProfileWindow, SampleBatch, WindowTracker, utc_datetime
from services.store.repository import Store

FETCH_BATCH = 256
IDLE_FLUSH_S = 2.0      # close partial windows when telemetry stops
ACK_WAIT_S = 60.0


class Monitor:
    def __init__(self, nc: Client, cfg: Config, store, log) -> None:
        self.nc = nc
        self.store = store
        self.log = log
        self.windows = WindowTracker(cfg.monitor_window)
        self.unacked: dict[str, list[Msg]] = {}    # window first key -> messages in it
        self.last_sample = time.monotonic()
        self.requests_stored = 0
        self.windows_stored = 0

    async def handle(self, msg: Msg) -> None:
        seq = msg.metadata.sequence.stream
        requests = msg.subject.startswith(subjects.telemetry_requests(""))
        try:
            data = decode_map(msg.data)
            telemetry = RequestTelemetry.decode(data) if requests else SampleTelemetry.decode(data)
        except Exception as exc:  # noqa: BLE001 - poison message: log and drop it from the stream
            self.log.error("undecodable telemetry seq=%s: %r", seq, exc)
            await msg.ack()
            return
        if requests:
            await self._store_requests(msg, telemetry, seq)
        else:
            await self._add_samples(msg, telemetry, seq)

    async def _store_requests(self, msg: Msg, telemetry: RequestTelemetry, seq: int) -> None:
        rows = [{"request_id": r.id or "", "model": telemetry.model, "received_at": utc_datetime(r.t),
                 "latency_ms": r.latency_ms, "status": r.status, "exit": r.exit,
                 "early": r.early, "label": r.label, "config_version": r.config_version}
                for r in telemetry.records]
        await asyncio.to_thread(self.store.add_requests, rows, f"req:{seq}")
        self.requests_stored += len(rows)
        await msg.ack()

    async def _add_samples(self, msg: Msg, telemetry: SampleTelemetry, seq: int) -> None:
        self.last_sample = time.monotonic()
        batch = SampleBatch.of(str(seq), telemetry)
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
        for m in self.unacked.pop(win.first_key, []):
            await m.ack()

    async def idle_flush(self) -> None:
        if self.windows.open and time.monotonic() - self.last_sample > IDLE_FLUSH_S:
            for w in self.windows.flush():
                await self._commit(w)

    async def on_status(self, msg: Msg) -> None:
        out = {m: {"config_version": w.config_version, "samples": w.samples,
                   "agreement": w.agreement, "exit_rate": w.exit_rate,
                   "ramp_exit_rates": {r: c / w.samples for r, c in w.exits.items()},
                   "window_end": w.end}
               for m, w in self.windows.latest.items()}
        await msg.respond(pack({"v": 1, "models": out, "requests_stored": self.requests_stored,
                                "windows_stored": self.windows_stored}))


async def serve(cfg: Config, stop: asyncio.Event) -> None:
    log = logs.setup("monitor", cfg.log_level)
    store = Store(cfg.database_url)
    nc = await bus.connect(cfg.nats_url or "nats://127.0.0.1:4222", "offramp-monitor")
    await bus.ensure_telemetry_stream(nc)
    js = nc.jetstream()
    consumer = ConsumerConfig(durable_name=subjects.MONITOR_DURABLE, ack_policy=AckPolicy.EXPLICIT,
                              deliver_policy=DeliverPolicy.ALL, ack_wait=ACK_WAIT_S,
                              max_ack_pending=100_000, max_deliver=-1)
    psub = await js.pull_subscribe(subjects.TELEMETRY_ALL, durable=subjects.MONITOR_DURABLE,
                                   stream=subjects.TELEMETRY_STREAM, config=consumer)
    monitor = Monitor(nc, cfg, store, log)
    await nc.subscribe(subjects.STATUS_MONITOR, cb=monitor.on_status)
    log.info("monitor ready %s", logs.kv(window=cfg.monitor_window))
    while not stop.is_set():
        try:
            msgs = await psub.fetch(FETCH_BATCH, timeout=0.5)
        except TimeoutError:
            msgs = []
        except Exception as exc:  # noqa: BLE001 - e.g. while reconnecting
            log.warning("fetch failed: %r", exc)
            await asyncio.sleep(0.5)
            continue
        for m in msgs:
            try:
                await monitor.handle(m)
            except Exception:
                log.exception("telemetry not stored (will be redelivered)")
        try:
            await monitor.idle_flush()
        except Exception:
            log.exception("idle flush failed")
    # Partial windows stay unacked: the next monitor rebuilds them from the stream.
    await bus.close(nc)
    store.close()

"""NATS connection handling shared by every service."""

from __future__ import annotations

import asyncio
import logging

import nats
import nats.aio.client as nats_client_module
from nats.aio.client import Client
from nats.js.api import RetentionPolicy, StorageType, StreamConfig

from schemas import subjects

log = logging.getLogger("offramp.bus")

# nats-py reads the socket 32 KiB at a time; an image request or a batch of activations
# (0.5-8 MB) then costs dozens of event-loop round trips per message. The read loop looks
# this module global up on every read, so a larger value takes effect for every client.
nats_client_module.DEFAULT_BUFFER_SIZE = max(nats_client_module.DEFAULT_BUFFER_SIZE, 1 << 20)

# Telemetry kept for replay and monitor restarts: bounded so a stopped monitor cannot
# fill the disk; a running monitor acks well within these limits.
TELEMETRY_MAX_BYTES = 512 * 1024 * 1024
TELEMETRY_MAX_AGE_S = 24 * 3600


async def connect(url: str, name: str, connect_timeout: float = 10.0) -> Client:
    """Connect with reconnect-forever, callbacks that log, and a bounded first attempt."""

    async def error_cb(exc: Exception) -> None:
        log.warning("nats error client=%s error=%r", name, exc)

    holder: list[Client] = []

    async def disconnected_cb() -> None:
        if holder and (holder[0].is_closed or holder[0].is_draining):
            return  # our own close, not a fault
        log.warning("nats disconnected client=%s", name)

    async def reconnected_cb() -> None:
        log.info("nats reconnected client=%s", name)

    deadline = asyncio.get_running_loop().time() + connect_timeout
    while True:
        try:
            nc = await nats.connect(
                url, name=name, error_cb=error_cb, disconnected_cb=disconnected_cb,
                reconnected_cb=reconnected_cb, max_reconnect_attempts=-1,
                reconnect_time_wait=0.25, ping_interval=10, max_outstanding_pings=3,
                connect_timeout=2, allow_reconnect=True,
                pending_size=64 * 1024 * 1024,
            )
            holder.append(nc)
            return nc
        except Exception as exc:
            if asyncio.get_running_loop().time() > deadline:
                raise RuntimeError(f"cannot reach NATS at {url}: {exc}") from exc
            await asyncio.sleep(0.2)


DUPLICATE_WINDOW_S = 120.0  # a resent message id within this is dropped by the stream


async def ensure_telemetry_stream(nc: Client) -> None:
    """Create (or keep) the JetStream stream that stores telemetry until the monitor acks it."""
    js = nc.jetstream()
    config = StreamConfig(name=subjects.TELEMETRY_STREAM, subjects=[subjects.TELEMETRY_ALL],
                          retention=RetentionPolicy.LIMITS, storage=StorageType.FILE,
                          max_bytes=TELEMETRY_MAX_BYTES, max_age=TELEMETRY_MAX_AGE_S,
                          duplicate_window=DUPLICATE_WINDOW_S)
    try:
        await js.add_stream(config)
    except Exception as exc:  # noqa: BLE001 - already exists with other limits: keep it
        log.debug("telemetry stream exists or could not be created: %r", exc)
        await js.stream_info(subjects.TELEMETRY_STREAM)


async def close(nc: Client) -> None:
    """Drain (flushes pending publishes and lets handlers finish), then close."""
    try:
        await asyncio.wait_for(nc.drain(), timeout=5)
    except Exception:  # noqa: BLE001 - shutting down anyway
        await nc.close()

"""NATS connection handling shared by every service."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from urllib.parse import urlsplit

import nats.aio.client as nats_client_module
from nats.aio.client import NO_RESPONDERS_STATUS, Client
from nats.aio.msg import Msg
from nats.js.api import Header, RetentionPolicy, StorageType, StreamConfig

from schemas import subjects
from schemas.roles import inbox_prefix
from services.common.config import Config
from services.common.credentials import Login, login_for, server_url, url_user
from services.common.logs import Repeats

log = logging.getLogger("offramp.bus")

# nats-py reads the socket 32 KiB at a time; an image request or a batch of activations
# (0.5-8 MB) then costs dozens of event-loop round trips per message. The read loop looks
# this module global up on every read, so a larger value takes effect for every client.
nats_client_module.DEFAULT_BUFFER_SIZE = max(nats_client_module.DEFAULT_BUFFER_SIZE, 1 << 20)

# Telemetry kept for replay and monitor restarts: bounded so a stopped monitor cannot
# fill the disk; a running monitor acks well within these limits.
TELEMETRY_MAX_BYTES = 512 * 1024 * 1024
TELEMETRY_MAX_AGE_S = 24 * 3600


class AuthorizationError(RuntimeError):
    """The server refused the login: retrying with the same one cannot help."""


class BusUnreachable(RuntimeError):
    """No NATS server answered at the URL within the time given."""


async def connect_as(cfg: Config, role: str, name: str, connect_timeout: float = 10.0) -> Client:
    """Connect to ``OFFRAMP_NATS_URL`` as ``role`` (``schemas/roles.py``), with that role's
    credentials when there are any."""
    return await connect(server_url(cfg), name, connect_timeout,
                         login=login_for(cfg, role))


async def connect(url: str, name: str, connect_timeout: float = 10.0,
                  login: Login | None = None) -> Client:
    """Connect with reconnect-forever and callbacks that log. The first connection must
    succeed within ``connect_timeout`` (nats-py itself would retry it forever), and a
    refused login fails at once. A login in the URL wins over ``login``; either way the
    connection uses its user's inbox prefix, the only inbox offramp's permissions let it read."""
    nc = Client()
    refused: asyncio.Future = asyncio.get_running_loop().create_future()

    repeats = Repeats()  # a reconnect loop fails 4 times a second while the server is down

    async def error_cb(exc: Exception) -> None:
        if repeats.due(repr(exc), time.monotonic()):
            log.warning("nats error client=%s error=%r suppressed=%d", name, exc,
                        repeats.take_hidden())
        if "authorization violation" in str(exc).lower() and not refused.done():
            refused.set_result(exc)

    async def disconnected_cb() -> None:
        if nc.is_closed or nc.is_draining:
            return  # our own close, not a fault
        log.warning("nats disconnected client=%s", name)

    async def reconnected_cb() -> None:
        log.info("nats reconnected client=%s", name)

    user = url_user(url) or (login.user if login else None)
    auth = {"user": login.user, "password": login.password} if login and not url_user(url) else {}
    if user:
        auth["inbox_prefix"] = inbox_prefix(user)
    first = asyncio.ensure_future(nc.connect(
        url, name=name, error_cb=error_cb, disconnected_cb=disconnected_cb,
        reconnected_cb=reconnected_cb, max_reconnect_attempts=-1, reconnect_time_wait=0.25,
        ping_interval=10, max_outstanding_pings=3, connect_timeout=2, allow_reconnect=True,
        pending_size=64 * 1024 * 1024, **auth))
    await asyncio.wait((first, refused), timeout=connect_timeout,
                       return_when=asyncio.FIRST_COMPLETED)
    if first.done() and first.exception() is None:
        return nc
    why = repr(first.exception()) if first.done() else repr(nc.last_error)
    first.cancel()
    with contextlib.suppress(Exception):
        await nc.close()
    if refused.done():
        who = f"user {user!r}" if user else "an anonymous connection"
        raise AuthorizationError(
            f"NATS at {_public(url)} refused {who} ({name}): give this role's credentials "
            f"(`offramp credentials ROLE`, OFFRAMP_NATS_CREDENTIALS)")
    raise BusUnreachable(f"cannot reach NATS at {_public(url)} within {connect_timeout:g}s: {why}")


def is_no_responders(msg: Msg) -> bool:
    """The server's "no responders" notice (an empty message, status 503) on an inbox read
    by hand: ``request()`` turns it into NoRespondersError, a subscription does not."""
    return bool(msg.headers) and msg.headers.get(Header.STATUS) == NO_RESPONDERS_STATUS


def _public(url: str) -> str:
    """``url`` without its password, for messages and logs."""
    return url.replace(f":{urlsplit(url).password}@", ":***@") if urlsplit(url).password else url


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

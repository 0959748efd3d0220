"""The transport floor for ``offramp bench overhead``: the pipeline's message path with no
work in it. ``relay`` forwards each request to ``echo`` keeping the client's reply subject
(like the router dispatching to a worker), and ``echo`` answers the client directly with
a reply of a given size (like a worker's result), both over the same request-path
transport as the services (``services.common.hotpath``). Run as separate processes: ``python -m services.bench.echo relay|echo URL [REPLY_BYTES]``."""

from __future__ import annotations

import asyncio
import sys

from services.common import bus
from services.common import config as config_mod
from services.common.credentials import login_for
from services.common.hotpath import publish_now, subscribe_direct
from services.common.service_loop import run_service

RELAY = "offramp.bench.relay"
ECHO = "offramp.bench.echo"


async def _serve(role: str, url: str, reply_bytes: int, stop: asyncio.Event) -> None:
    nc = await bus.connect(url, f"offramp-bench-{role}",
                           login=login_for(config_mod.load(), "bench"))
    answer = b"\0" * reply_bytes

    def relay(msg) -> None:
        publish_now(nc, ECHO, msg.data, reply=msg.reply)

    def echo(msg) -> None:
        publish_now(nc, msg.reply, answer)

    await subscribe_direct(nc, RELAY if role == "relay" else ECHO, relay if role == "relay" else echo)
    await nc.flush()
    print("ready", flush=True)
    await stop.wait()
    await bus.close(nc)


def main() -> None:
    role, url = sys.argv[1], sys.argv[2]
    reply_bytes = int(sys.argv[3]) if len(sys.argv) > 3 else 64
    if role not in ("relay", "echo"):
        raise SystemExit("usage: python -m services.bench.echo relay|echo URL [REPLY_BYTES]")
    run_service(lambda stop: _serve(role, url, reply_bytes, stop))


if __name__ == "__main__":
    main()

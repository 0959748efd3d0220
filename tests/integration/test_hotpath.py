"""The request path's transport (services/common/hotpath.py) against a real nats-server:
order, delivery, no slow-consumer drops, request-reply, errors, reconnects."""

from __future__ import annotations

import asyncio

import nats
import pytest
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeout

from services.common import bus
from services.common.hotpath import (
    flush_now,
    publish_many,
    publish_now,
    requester,
    subscribe_direct,
)
from services.launcher.natsserver import EmbeddedNats


@pytest.fixture()
def server(tmp_path):
    with EmbeddedNats(tmp_path / "nats") as srv:
        yield srv


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 30))


async def collect(nc, subject: str, n: int) -> list[bytes]:
    got: list[bytes] = []
    done = asyncio.get_running_loop().create_future()

    async def cb(msg) -> None:
        got.append(msg.data)
        if len(got) == n and not done.done():
            done.set_result(None)

    await nc.subscribe(subject, cb=cb)
    # nats-py writes flush()'s PING straight to the socket, so it can overtake the SUB
    # still in its buffer; by the second round trip the SUB has certainly gone out.
    await nc.flush()
    await nc.flush()
    return got, done


def test_publish_now_keeps_order_with_nats_py_publishes(server):
    async def main():
        sub_nc = await bus.connect(server.url, "t-sub")
        pub_nc = await bus.connect(server.url, "t-pub")
        got, done = await collect(sub_nc, "t.order", 300)
        for i in range(100):  # nats-py's buffered publish, then ours: order must hold
            await pub_nc.publish("t.order", b"%d" % (3 * i))
            publish_now(pub_nc, "t.order", b"%d" % (3 * i + 1))
            publish_many(pub_nc, [("t.order", b"%d" % (3 * i + 2))])
        await asyncio.wait_for(done, 10)
        assert [int(x) for x in got] == list(range(300))
        await sub_nc.close()
        await pub_nc.close()

    run(main())


def test_direct_handler_gets_every_message_survives_errors_and_never_counts_pending(server):
    async def main():
        nc = await bus.connect(server.url, "t-direct")
        pub = await bus.connect(server.url, "t-pub")
        seen: list[int] = []

        def handler(msg) -> None:
            n = int(msg.data[:4])
            seen.append(n)
            if n % 10 == 0:
                raise RuntimeError("a handler bug")  # logged; delivery goes on

        sub = await subscribe_direct(nc, "t.direct", handler)
        sub._pending_bytes_limit = 4096  # nats-py would drop as a slow consumer past this
        await nc.flush()
        for i in range(200):
            await pub.publish("t.direct", b"%04d" % i + b"x" * 100)
        await pub.flush()
        for _ in range(100):
            if len(seen) == 200:
                break
            await asyncio.sleep(0.05)
        assert seen == list(range(200))
        assert sub.pending_bytes == 0 and sub.pending_msgs == 0
        await sub.drain()  # a drained direct subscription closes cleanly
        await nc.close()
        await pub.close()

    run(main())


def test_replies_published_in_a_direct_handler_reach_the_requester(server):
    async def main():
        srv = await bus.connect(server.url, "t-echo")
        cli = await bus.connect(server.url, "t-cli")

        def echo(msg) -> None:
            publish_now(srv, msg.reply, b"re:" + msg.data)
            flush_now(srv)  # written at once, not only when the read chunk is parsed
            publish_now(srv, "t.after", b"bookkeeping")

        await subscribe_direct(srv, "t.echo", echo)
        await srv.flush()
        req = await requester(cli)
        assert req is await requester(cli)  # one per connection
        replies = await asyncio.gather(*(req.request("t.echo", b"%d" % i, 5) for i in range(50)))
        assert [r.data for r in replies] == [b"re:%d" % i for i in range(50)]
        assert not req.waiting
        await srv.close()
        await cli.close()

    run(main())


def test_request_errors_are_nats_errors(server):
    async def main():
        cli = await bus.connect(server.url, "t-cli")
        srv = await bus.connect(server.url, "t-mute")
        await subscribe_direct(srv, "t.mute", lambda msg: None)  # never answers
        await srv.flush()
        req = await requester(cli)
        with pytest.raises(NoRespondersError):
            await req.request("t.nobody", b"x", 2)
        with pytest.raises(NatsTimeout):
            await req.request("t.mute", b"x", 0.2)
        assert not req.waiting
        await cli.close()
        await srv.close()

    run(main())


def test_publish_now_while_disconnected_is_sent_after_reconnect(tmp_path):
    async def main():
        srv = EmbeddedNats(tmp_path / "nats")
        url = srv.start()
        try:
            # The subscriber comes back well before the publisher sends what it held
            # (core NATS delivers only to subscriptions that exist at that moment).
            sub_nc = await nats.connect(url, reconnect_time_wait=0.05, max_reconnect_attempts=-1)
            pub_nc = await nats.connect(url, reconnect_time_wait=2.0, max_reconnect_attempts=-1)
            got: list[bytes] = []
            done = asyncio.get_running_loop().create_future()

            def on_msg(msg) -> None:  # a direct subscription must survive the reconnect
                got.append(msg.data)
                if len(got) == 2 and not done.done():
                    done.set_result(None)

            await subscribe_direct(sub_nc, "t.re", on_msg)
            await sub_nc.flush()
            srv.stop()
            for _ in range(100):
                if not pub_nc.is_connected:
                    break
                await asyncio.sleep(0.05)
            assert not pub_nc.is_connected
            publish_now(pub_nc, "t.re", b"held-1")
            publish_many(pub_nc, [("t.re", b"held-2")])
            srv.start()
            await asyncio.wait_for(done, 15)
            assert got == [b"held-1", b"held-2"]
            await sub_nc.close()
            await pub_nc.close()
        finally:
            srv.stop()

    run(main())


def test_large_payloads_arrive_intact_between_small_ones(server):
    """Payloads from 64 KiB on go out as their own buffers, not copied into one frame."""
    big = [bytes([i]) * (700 * 1024 + i) for i in range(3)]

    async def main():
        sub_nc = await bus.connect(server.url, "t-sub")
        pub_nc = await bus.connect(server.url, "t-pub")
        got, done = await collect(sub_nc, "t.big", 6)
        publish_now(pub_nc, "t.big", big[0])
        publish_many(pub_nc, [("t.big", b"small"), ("t.big", big[1]), ("t.big", b"")])
        publish_now(pub_nc, "t.big", big[2])
        await pub_nc.publish("t.big", b"after")
        await pub_nc.flush()
        await asyncio.wait_for(done, 10)
        assert got == [big[0], b"small", big[1], b"", big[2], b"after"]
        await sub_nc.close()
        await pub_nc.close()

    run(main())


def test_a_message_id_travels_as_a_header_and_the_stream_drops_a_resent_copy(server):
    async def main():
        nc = await bus.connect(server.url, "t-id")
        js = nc.jetstream()
        await js.add_stream(name="T_IDS", subjects=["t.ids"], duplicate_window=60)
        sub_nc = await bus.connect(server.url, "t-id-sub")
        got_headers: list = []
        done = asyncio.get_running_loop().create_future()

        async def cb(msg) -> None:
            got_headers.append((msg.data, msg.headers))
            if len(got_headers) == 3 and not done.done():
                done.set_result(None)

        await sub_nc.subscribe("t.ids", cb=cb)
        await sub_nc.flush()
        await sub_nc.flush()
        publish_many(nc, [("t.ids", b"a", "w1:1"), ("t.ids", b"b"), ("t.ids", b"a", "w1:1")])
        await asyncio.wait_for(done, 10)
        assert got_headers == [(b"a", {"Nats-Msg-Id": "w1:1"}), (b"b", None),
                               (b"a", {"Nats-Msg-Id": "w1:1"})]
        info = await js.stream_info("T_IDS")
        assert info.state.messages == 2  # the copy with a seen id was not stored again
        await sub_nc.close()
        await nc.close()

    run(main())

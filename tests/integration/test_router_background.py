"""The router's background work: request records of a burst go out in messages under the
bus's max_payload, none lost; a failed background loop is restarted, not left dead."""

from __future__ import annotations

import asyncio
import logging
import time
from types import SimpleNamespace

import numpy as np

from schemas import subjects
from schemas.messages import decode_map
from schemas.telemetry import OK, RequestRecord, RequestTelemetry
from services.common import config as config_mod
from services.common import service_loop
from services.router.edf_queue import Pending
from services.router.policy import make_policy
from services.router.service import Router


class FakeBus:
    max_payload = 64 * 1024

    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes]] = []
        self.ids: list[str] = []

    async def publish(self, subject: str, data: bytes, headers: dict | None = None) -> None:
        if len(data) > self.max_payload:  # what nats-py raises
            raise ValueError("max payload exceeded")
        self.sent.append((subject, data))
        self.ids.append((headers or {}).get("Nats-Msg-Id"))


def _router() -> Router:
    cfg = config_mod.load()
    return Router(FakeBus(), cfg, {"tiny": SimpleNamespace(full_ms=1.0)},
                  make_policy("fixed", cfg.max_batch, 0), logging.getLogger("test"))


def _capture_writes(monkeypatch) -> list[list[tuple]]:
    """Each write the router's outbox makes: the messages it holds, in order."""
    import services.router.outbox as outbox_module

    writes: list[list[tuple]] = []

    def publish_all(nc, messages, log):
        assert all(len(m[1]) <= nc.max_payload for m in messages)  # what nats-py refuses
        writes.append(list(messages))

    monkeypatch.setattr(outbox_module, "publish_all", publish_all)
    return writes


def test_a_burst_of_records_goes_out_under_max_payload_and_complete(monkeypatch):
    writes = _capture_writes(monkeypatch)

    async def run() -> Router:
        router = _router()
        for i in range(20_000):
            router.outbox.answer("tiny", RequestRecord(f"req-{i:05d}-" + "x" * 40, 1.0 + i,
                                                       2.0, OK, 1, True, 3, 7), None, b"")
        await asyncio.sleep(0)  # the outbox writes at the end of the loop iteration
        return router

    asyncio.run(run())
    assert len(writes) == 1
    sent = writes[0]
    assert len(sent) > 1 and all(m[0] == subjects.telemetry_requests("tiny") for m in sent)
    ids = [r.id for m in sent for r in RequestTelemetry.decode(decode_map(m[1])).records]
    assert ids == [f"req-{i:05d}-" + "x" * 40 for i in range(20_000)]
    # every message has its own id: the stream drops a resent copy, the monitor stores it once
    assert len({m[2] for m in sent}) == len(sent)


def test_an_answer_never_leaves_without_its_row(monkeypatch):
    """A refusal and the record that stores it go out in one write, record first: a router
    killed at any point leaves no client holding an answer the history lacks."""
    writes = _capture_writes(monkeypatch)

    async def run() -> Router:
        router = _router()
        entry = Pending(id="r1", model="tiny", reply="_INBOX.client.a.1",
                        inputs={"x": np.zeros(16, "<f4")}, arrival=0.0, deadline=1e9)
        router.pending["r1"] = entry
        router.reply_error(entry, "deadline_exceeded", "too late")
        await asyncio.sleep(0)
        return router

    router = asyncio.run(run())
    (write,) = writes
    assert [m[0] for m in write] == [subjects.telemetry_requests("tiny"), "_INBOX.client.a.1"]
    (record,) = RequestTelemetry.decode(decode_map(write[0][1])).records
    assert (record.id, record.status) == ("r1", "deadline_exceeded")
    assert decode_map(write[1][1])["error"]["code"] == "deadline_exceeded"
    assert router.models["tiny"].records[0].status == "deadline_exceeded"  # for the metrics


def test_a_failed_background_loop_is_restarted(monkeypatch, caplog):
    monkeypatch.setattr(service_loop, "RESTART_FIRST_S", 0.01)
    runs = []

    async def flaky() -> None:
        runs.append(1)
        if len(runs) < 3:
            raise RuntimeError(f"failure {len(runs)}")

    async def run() -> None:
        tasks: set[asyncio.Task] = set()
        await service_loop.supervise("flaky-test", flaky, tasks, logging.getLogger("test"))

    with caplog.at_level(logging.ERROR):
        asyncio.run(run())
    assert len(runs) == 3  # failed twice, restarted each time, then returned
    assert service_loop.restarts["flaky-test"] == 2
    assert caplog.text.count("background loop failed, restarting") == 2
    assert "failure 2" in caplog.text


def test_a_batch_over_max_payload_is_halved_and_the_rest_requeued(monkeypatch):
    import services.router.service as router_service

    published: list[bytes] = []
    monkeypatch.setattr(router_service, "publish_now",
                        lambda nc, subject, data: published.append(data))

    async def run():
        router = _router()
        router.nc.max_payload = 6000
        state = router.models["tiny"]
        state.spec = SimpleNamespace(full_ms=1.0, input_names=["x"])
        # long ids and reply subjects: the cap's typical envelope underestimates them
        batch = [Pending(id=f"r{i}-" + "y" * 200, model="tiny", reply=f"_INBOX.{'z' * 300}.{i}",
                         inputs={"x": np.zeros(16, "<f4")}, arrival=0.0, deadline=1e9)
                 for i in range(16)]
        router.registry.workers["w"] = SimpleNamespace(inflight={})
        router._send("tiny", state, "w", batch, 0.0)
        return router, state

    router, state = asyncio.run(run())
    assert published and all(len(d) <= 6000 for d in published)
    sent = [e for i in router.registry.workers["w"].inflight.values() for e in i.entries]
    assert 0 < len(sent) < 16 and len(sent) + len(state.queue) == 16
    assert all(e.attempts == 1 for e in sent)


def test_a_batch_its_worker_never_got_is_taken_back():
    """After a NATS restart a batch can vanish on its way (the server died with it, or the
    worker had not subscribed again): a heartbeat sent well after the dispatch that does not
    list it gives its credit back and re-queues its requests, instead of waiting forever."""
    from schemas.heartbeat import Heartbeat
    from services.router.workers import Inflight

    async def run():
        router = _router()
        router.registry.heartbeat("w", "tiny", 0, 1, 2, time.monotonic())
        w = router.registry.workers["w"]
        entries = [Pending(id=f"r{i}", model="tiny", reply=f"_INBOX.client.{i}",
                           inputs={"x": np.zeros(16, "<f4")}, arrival=0.0, deadline=1e12)
                   for i in range(3)]
        for e in entries:
            router.pending[e.id] = e
        old = time.monotonic() - 5.0
        w.inflight["lost"] = Inflight("lost", "w", "tiny", entries[:2], old, 2)
        w.inflight["held"] = Inflight("held", "w", "tiny", entries[2:], old, 1)
        w.inflight["fresh"] = Inflight("fresh", "w", "tiny", [], time.monotonic(), 0)

        def beat(held):
            msg = SimpleNamespace(data=Heartbeat("w", "tiny", 0, 1, 2, held=held).encode())
            return router.on_heartbeat(msg)

        beat(None)                # a worker that does not say what it holds: nothing moves
        assert set(w.inflight) == {"lost", "held", "fresh"}
        beat(("held",))           # "fresh" was sent too recently to be judged
        return router, w

    router, w = asyncio.run(run())
    assert set(w.inflight) == {"held", "fresh"} and w.credit == 0
    assert [e.id for e in router.models["tiny"].queue.drain()] == ["r0", "r1"]


def test_a_router_behind_on_its_reading_does_not_take_live_workers_for_dead():
    """Worker silence counts only up to the last tick of the router's that came back
    through the server: heartbeats queued behind a burst of requests have not been read
    yet, and taking the worker for dead would run its batches twice (two answers)."""
    from services.router.workers import Inflight

    router = _router()
    t0 = router.heard_until
    router.registry.heartbeat("w", "tiny", 0, 1, 2, t0)
    entry = Pending(id="r0", model="tiny", reply="_INBOX.client.0",
                    inputs={"x": np.zeros(16, "<f4")}, arrival=t0, deadline=t0 + 1e6)
    router.pending[entry.id] = entry
    router.registry.workers["w"].inflight["b"] = Inflight("b", "w", "tiny", [entry], t0, 1)
    router._sweep(t0 + 5.0)      # 5 s without a heartbeat read, but nothing heard since t0
    assert "w" in router.registry.workers and len(router.models["tiny"].queue) == 0
    router.on_tick(SimpleNamespace(data=repr(t0 + 5.0).encode()))  # caught up to t0 + 5 s
    router.on_tick(SimpleNamespace(data=b"garbage"))                # logged, not raised
    assert router.heard_until == t0 + 5.0
    router._sweep(t0 + 5.1)      # now the silence is real: its batch comes back
    assert "w" not in router.registry.workers
    assert [e.id for e in router.models["tiny"].queue.drain()] == ["r0"]


def test_an_estimate_inflated_by_a_backlog_does_not_refuse_everything_forever(monkeypatch):
    """After a backlog, dispatch -> release times include the wait behind other batches
    (seen: 2.3 s on EfficientNet), and a 1 s request was refused as too late before it
    was sent; with nothing sent, no release came to correct the estimate. A worker that
    holds nothing is screened with the estimate of batches sent to idle workers."""
    import services.router.service as router_service
    from schemas import errors

    published: list[bytes] = []
    monkeypatch.setattr(router_service, "publish_now",
                        lambda nc, subject, data: published.append(data))
    router = _router()
    state = router.models["tiny"]
    state.spec = SimpleNamespace(full_ms=1.0, input_names=["x"])
    router.registry.heartbeat("w", "tiny", 0, 1, 2, time.monotonic())
    state.service_ms, state.alone_ms = 2300.0, 40.0
    now = time.monotonic()
    entry = Pending(id="r0", model="tiny", reply="_INBOX.client.0",
                    inputs={"x": np.zeros(16, "<f4")}, arrival=now, deadline=now + 1.0)
    router.pending[entry.id] = entry
    state.queue.push(entry)
    router._dispatch_ready("tiny", state)
    assert len(published) == 1 and not entry.replied           # sent, not refused
    inflight = next(iter(router.registry.workers["w"].inflight.values()))
    assert inflight.alone
    # the same estimate still screens for a busy worker: it would wait behind a batch
    late = Pending(id="r1", model="tiny", reply="_INBOX.client.1",
                   inputs={"x": np.zeros(16, "<f4")}, arrival=now, deadline=now + 1.0)
    router.pending[late.id] = late
    state.queue.push(late)
    replies = []
    monkeypatch.setattr(router, "reply_error", lambda e, code, message: replies.append(code))
    router._dispatch_ready("tiny", state)
    assert replies == [errors.DEADLINE_EXCEEDED] and len(published) == 1


def test_requests_a_first_stage_released_and_no_later_stage_answered_get_an_error(monkeypatch):
    """A later stage's worker lost with the rows it held: its requests are answered
    deadline_exceeded once their deadline is well past, exactly once; answered ones are
    left alone."""
    from schemas.messages import Results
    from services.router import admission
    from services.router.workers import Inflight

    writes = _capture_writes(monkeypatch)

    async def run() -> Router:
        router = _router()
        entries = [Pending(id=f"r{i}", model="tiny", reply=f"_INBOX.client.a.{i}",
                           inputs={"x": np.zeros(16, "<f4")}, arrival=0.0, deadline=10.0)
                   for i in range(3)]
        for e in entries:
            router.pending[e.id] = e
        router.registry.workers["w0"] = SimpleNamespace(
            inflight={"b1": Inflight("b1", "w0", "tiny", entries, 0.0, 3)})
        monkeypatch.setattr(router.registry, "release",
                            lambda w, b: router.registry.workers[w].inflight.pop(b, None))
        empty = np.zeros(0, np.int32)
        router.on_results(SimpleNamespace(data=Results(
            "b1", "w0", 0, [], empty, empty.astype(np.float32), empty, None, False, 1,
            release=True).encode()))  # stage 0 forwarded all three and released
        router.on_results(SimpleNamespace(data=Results(
            "b1", "w1", 1, ["r0"], np.array([3], np.int32), np.array([0.1], np.float32),
            np.array([-1], np.int32), None, False, 1).encode()))  # a later stage answered r0
        router.registry.workers.clear()  # (the stand-in has no heartbeat to expire by)
        router._sweep(10.0 + admission.DOWNSTREAM_GRACE_S - 0.1)  # not yet
        before = sum(len(w) for w in writes)
        router._sweep(10.0 + admission.DOWNSTREAM_GRACE_S + 0.1)
        router._sweep(10.0 + admission.DOWNSTREAM_GRACE_S + 1.0)  # once only
        await asyncio.sleep(0)
        router.before = before
        return router

    router = asyncio.run(run())
    errors_sent = [decode_map(m[1]) for w in writes for m in w
                   if m[0].startswith("_INBOX.client.a.")]
    codes = {e["id"]: (e.get("error") or {}).get("code", "ok") for e in errors_sent}
    assert codes == {"r0": "ok", "r1": "deadline_exceeded", "r2": "deadline_exceeded"}
    assert len(errors_sent) == 3 and not router.downstream


def test_a_request_sent_again_after_a_worker_loss_is_answered_by_the_router_once(monkeypatch):
    """The worker taken for lost may be alive (a stalled event loop) and answer its copy:
    the second dispatch carries no reply subjects, so both answers reach the router, which
    replies to the client once."""
    import services.router.service as router_service
    from schemas.messages import Batch, Results

    published: list[bytes] = []
    monkeypatch.setattr(router_service, "publish_now",
                        lambda nc, subject, data: published.append(data))
    writes = _capture_writes(monkeypatch)

    async def run() -> Router:
        router = _router()
        state = router.models["tiny"]
        state.spec = SimpleNamespace(full_ms=1.0, input_names=["x"])
        first = Pending(id="r0", model="tiny", reply="_INBOX.client.0",
                        inputs={"x": np.zeros(16, "<f4")}, arrival=0.0, deadline=1e12)
        again = Pending(id="r1", model="tiny", reply="_INBOX.client.1",
                        inputs={"x": np.zeros(16, "<f4")}, arrival=0.0, deadline=1e12,
                        attempts=1)  # back from a worker the router took for lost
        for e in (first, again):
            router.pending[e.id] = e
        for w in ("old", "new"):
            router.registry.heartbeat(w, "tiny", 0, 1, 2, time.monotonic())
        router._send("tiny", state, "new", [first], 0.0)
        router._send("tiny", state, "new", [again], 0.0)
        logits = np.zeros((1, 4), np.float32)
        for worker in ("old", "new"):  # both copies of r1 are answered, through the router
            router.on_results(SimpleNamespace(data=Results(
                "b", worker, 0, ["r1"], np.array([3]), np.array([0.9], np.float32),
                np.array([-1]), logits, False, 1).encode()))
        await asyncio.sleep(0)
        return router

    asyncio.run(run())
    batches = [Batch.decode(decode_map(d)) for d in published]
    assert [b.replies for b in batches] == [["_INBOX.client.0"], []]
    replies = [m for w in writes for m in w if m[0] == "_INBOX.client.1"]
    assert len(replies) == 1 and decode_map(replies[0][1])["label"] == 3

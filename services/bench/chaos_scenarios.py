"""The chaos bench's scenarios, each under load with request ids of its own: kill a worker,
a router (with a backlog), the monitor (three times) and the nats-server; a burst; fuzzed
messages; the five client attacks on the bus. The client follows the contract's resend
rule everywhere (schemas/README.md, "Resending"): a request unanswered after
``resend_after`` s is sent once more, same id. Each returns
the load it tracked and the facts only it can measure; ``services.bench.chaos`` sets the
replies against the store and reports."""

from __future__ import annotations

import asyncio
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from nats.aio.client import Client

from schemas import subjects
from schemas.codec import pack
from services.bench import bus_attacks
from services.bench.chaos_tally import (
    NO_RESPONDERS,
    OK,
    hint_ratio_summary,
    retry_hint_accuracy,
    tally,
)
from services.bench.metrics_scrape import histogram_buckets
from services.bench.request_fuzz import mutated
from services.bench.stack_keeper import Keeper
from services.bench.tracked_load import TrackedLoad
from services.common import bus
from services.common.config import Config
from services.common.credentials import login_for
from services.store.repository import Store

RATE = 300.0  # requests/s of the steady load the kills happen under
SLO_MS = 1000.0  # every request's; the router's default
# Loads that check serving is unaffected (by attacks, after fuzzing) give a slow machine
# room: a deadline missed because another process took the CPU would read as damage.
CALM_SLO_MS = 5000.0
GRACE_S = 10.0  # no reply this long after the SLO of the last attempt: a silent loss
SILENT_AFTER_S = SLO_MS / 1e3 + GRACE_S


@dataclass
class Chaos:
    """What every scenario works with: the private stack, a client connection and the
    bench's settings."""

    cfg: Config
    keeper: Keeper
    nc: Client
    url: str
    inbox: str
    model: str
    inputs: list[dict[str, np.ndarray]]
    quick: bool
    resend_after: float
    seed: int = 0
    burst: int | None = None      # requests of the burst scenario (default by --quick)
    slo_ms: float = SLO_MS
    silent_after_s: float = SILENT_AFTER_S

    def say(self, msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    def tag(self) -> str:
        return "c" + uuid.uuid4().hex[:8]

    def valid(self, tag: str, slo_ms: float | None = None) -> Callable[[int], tuple[str, bytes]]:
        def make(i: int) -> tuple[str, bytes]:
            rid = f"{tag}-{i}"
            return rid, pack({"v": 1, "id": rid, "model": self.model,
                              "inputs": self.inputs[i % len(self.inputs)],
                              "slo_ms": slo_ms or self.slo_ms})

        return make

    async def load(self, tag: str, resend: bool = True) -> TrackedLoad:
        load = TrackedLoad(self.nc, subjects.infer(self.model), self.inbox, tag,
                           self.resend_after if resend else None)
        await load.start()
        return load


@dataclass
class Staged:
    """A scenario's load and its own facts; rows are matched by the prefix ``tag-`` (and,
    ``by_reply_id``, by the ids the replies carry)."""

    load: TrackedLoad
    tag: str
    facts: dict = field(default_factory=dict)
    by_reply_id: bool = False


def first_ok_after(load: TrackedLoad, t: float) -> float | None:
    """Seconds from ``t`` until the first ok reply to a request first sent at or after it."""
    times = [r.t for q in load.requests if q.sent[0] >= t for r in q.replies if r.code == OK]
    return min(times) - t if times else None


async def steady_kills(c: Chaos, tag: str, seconds: float,
                       victims: list[tuple[float, str]]) -> tuple[TrackedLoad, list[dict]]:
    """``RATE`` requests/s for ``seconds``, SIGKILLing ``victims`` (offset s, service) on
    the way; waits for the replies. The kills: service, pid, time (None: not running)."""
    kills: list[dict] = []

    def killer(name: str) -> Callable[[], None]:
        def fire() -> None:
            done = c.keeper.kill(name)
            kills.append({"service": name, "pid": done and done[0], "t": done and done[1]})
            c.say(f"  SIGKILL {name} (pid {done and done[0]})")

        return fire

    load = await c.load(tag)
    events = {int(at * RATE): killer(name) for at, name in victims}
    await load.send_many(c.valid(tag), int(seconds * RATE), RATE, events)
    await load.wait(c.silent_after_s, c.say)
    await load.stop()
    return load, kills


def first_worker(c: Chaos) -> str:
    return min(n for n in c.keeper.pids() if n.startswith("worker-"))


async def worker_kill(c: Chaos) -> Staged:
    tag, name = c.tag(), first_worker(c)
    seconds, at = (4.0, 1.0) if c.quick else (8.0, 2.0)
    load, kills = await steady_kills(c, tag, seconds, [(at, name)])
    t = kills[0]["t"]
    return Staged(load, tag, {"killed": name, "rate_rps": RATE, "load_s": seconds,
                              "service_back_s": t and c.keeper.back_after(name, t),
                              "first_ok_after_kill_s": t and first_ok_after(load, t)})


async def monitor_kill(c: Chaos) -> Staged:
    tag = c.tag()
    seconds, ats = (5.0, (1.0, 2.5, 4.0)) if c.quick else (8.0, (1.5, 3.5, 5.5))
    t0 = time.monotonic()
    load, kills = await steady_kills(c, tag, seconds, [(at, "monitor") for at in ats])
    back = await running_again(c)  # the last restart comes after a backoff of seconds
    return Staged(load, tag, {"kills": sum(k["pid"] is not None for k in kills),
                              "rate_rps": RATE, "load_s": seconds,
                              "monitor_restarts": c.keeper.restarts_since(t0).get("monitor", 0),
                              "monitor_running_again": back})


async def running_again(c: Chaos, timeout_s: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not c.keeper.all_running():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.1)
    return True


async def nats_restart(c: Chaos) -> Staged:
    tag = c.tag()
    seconds, at = (5.0, 1.5) if c.quick else (8.0, 2.0)
    load, kills = await steady_kills(c, tag, seconds, [(at, "nats")])
    t = kills[0]["t"] or 0.0
    recovery = first_ok_after(load, t) if t else None
    any_reply = [r.t - t for q in load.requests for r in q.replies if t and r.t > t]
    lost = [q for q in load.requests if not q.replies]
    refused = [q.first.t - t for q in load.requests if q.first and q.first.code == NO_RESPONDERS]
    return Staged(load, tag, {
        "rate_rps": RATE, "load_s": seconds,
        "nats_back_s": t and c.keeper.back_after("nats", t),
        "recovery_s": recovery, "recovered": recovery is not None,
        "within_2s": recovery is not None and recovery <= 2.0,
        "first_reply_after_kill_s": min(any_reply) if any_reply else None,
        # lost in flight (sent before the kill) or sent while the server was away
        "silent_sent_before_kill": sum(q.sent[0] < t for q in lost),
        "silent_sent_after_kill": sum(q.sent[0] >= t for q in lost),
        "silent_sent_at_s": [round(q.sent[0] - t, 4) for q in lost[:10]],  # from the kill
        # the restarted server answered "no responders" until the routers had resubscribed
        "no_responders_until_s": max(refused) if refused else None})


async def router_kill(c: Chaos) -> Staged:
    """Requests as fast as the client can send them (beyond what the stack serves, so the
    routers hold a backlog), one router SIGKILLed halfway; the client resends a request
    with no reply after ``resend_after`` s."""
    tag, name = c.tag(), "router"
    n = 4000 if c.quick else 10000
    load = await c.load(tag)
    at_kill: dict = {}

    def kill() -> None:
        at_kill["outstanding"] = load.unanswered()
        done = c.keeper.kill(name)
        at_kill["pid"], at_kill["t"] = done if done else (None, None)
        c.say(f"  SIGKILL {name} (pid {at_kill['pid']}) with {at_kill['outstanding']} "
              "requests unanswered")

    sent_s = await load.send_many(c.valid(tag), n, None, {n // 2: kill})
    await load.wait(c.silent_after_s, c.say)
    await load.stop()
    t = at_kill.get("t")
    resent = [q for q in load.requests if len(q.subjects) > 1]
    return Staged(load, tag, {"killed": name, "send_rate_rps": n / sent_s,
                              "unanswered_at_kill": at_kill.get("outstanding"),
                              "resend_after_s": c.resend_after,
                              # resent requests whose first attempt never got a reply: lost
                              # by the system, answered only because the client resent them
                              "first_attempt_lost": sum(
                                  not any(r.subject == q.subjects[0] for r in q.replies)
                                  for q in resent),
                              "service_back_s": t and c.keeper.back_after(name, t)})


async def burst(c: Chaos) -> Staged:
    tag = c.tag()
    n = c.burst or (5000 if c.quick else 20000)
    load = await c.load(tag)
    before = await router_hint_buckets(c)
    sent_s = await load.send_many(c.valid(tag), n)
    await load.wait(c.silent_after_s, c.say)
    await load.stop()
    return Staged(load, tag, {"burst": n, "sent_in_s": sent_s,
                              "retry_hint": hint_ratio_summary(before,
                                                               await router_hint_buckets(c)),
                              "retry_hint_client_side": retry_hint_accuracy(load.requests)})


async def router_hint_buckets(c: Chaos) -> dict[float, float]:
    """The routers' ``offramp_retry_hint_ratio`` buckets for the bench's model."""
    return await asyncio.to_thread(histogram_buckets, c.keeper.metrics_urls("router"),
                                   "offramp_retry_hint_ratio", {"model": c.model})


async def fuzz(c: Chaos) -> Staged:
    """2,000 mutated messages, then valid requests that must all be answered ok."""
    tag = c.tag()
    t0 = time.monotonic()
    bodies = mutated(c.model, c.inputs, 2000, tag, c.seed)
    load = await c.load(tag)
    await load.send_many(lambda i: (None, bodies[i][2]), len(bodies), 2000.0)
    await load.wait(c.silent_after_s, c.say)
    await load.stop()
    kinds: dict[str, dict[str, int]] = {}
    for (kind, _, _), q in zip(bodies, load.requests, strict=True):
        code = q.first.code if q.first else "no_reply"
        kinds.setdefault(kind, {}).setdefault(code, 0)
        kinds[kind][code] += 1
    follow_tag = c.tag()
    follow = await c.load(follow_tag)
    await follow.send_many(c.valid(follow_tag, CALM_SLO_MS), 200, RATE)
    await follow.wait(CALM_SLO_MS / 1e3 + GRACE_S, c.say)
    await follow.stop()
    after = tally(follow.requests, [])
    return Staged(load, tag, {
        "codes_by_mutation": kinds, "strays": load.strays,
        "followup": {k: after[k] for k in ("requests", "ok", "errors", "silent_losses",
                                           "duplicate_replies")},
        "services_restarted": c.keeper.restarts_since(t0)}, by_reply_id=True)


async def attacks(c: Chaos) -> Staged:
    """The five client attacks while steady load runs; then configs, replies, rows and the
    telemetry stream must be as if nothing happened."""
    tag = c.tag()
    with Store(c.cfg.database_url) as store:
        version = store.latest_exit_config(c.model).version
    stream = await stream_state(c)
    load = await c.load(tag)
    seconds = 2.0 if c.quick else 4.0
    sending = asyncio.ensure_future(load.send_many(c.valid(tag, CALM_SLO_MS),
                                                   int(seconds * RATE), RATE))
    await asyncio.sleep(0.5)
    errors: list[str] = []
    attacker = await bus_attacks.connect_attacker(c.url, login_for(c.cfg, "client"),
                                                  f"offramp-chaos-attacker-{tag}", errors)
    await bus_attacks.attack(attacker, c.model, tag)
    await attacker.close()
    await sending
    await load.wait(CALM_SLO_MS / 1e3 + GRACE_S, c.say)
    await load.stop()
    with Store(c.cfg.database_url) as store:
        after = store.latest_exit_config(c.model).version
        forged = len(store.request_statuses(bus_attacks.forged_request_id(tag)))
    stream_after = await stream_state(c)
    versions = sorted({r.config_version for q in load.requests for r in q.replies
                       if r.code == OK})
    return Staged(load, tag, {
        "refused": bus_attacks.refused(errors, c.model, tag), "violations": errors,
        "config_version_before": version, "config_version_after": after,
        "reply_config_versions": versions, "forged_rows": forged,
        # the same stream (created at the same time), still holding all it held
        "stream_kept": stream is not None and stream_after is not None
        and stream_after[0] == stream[0] and stream_after[1] >= stream[1],
        "stream_messages_before": stream and stream[1],
        "stream_messages_after": stream_after and stream_after[1]})


async def stream_state(c: Chaos) -> tuple[str, int] | None:
    """(created, messages) of the telemetry stream, None if it is gone. Read as the monitor:
    the one role allowed to look at the stream's state."""
    nc = await bus.connect(c.url, "offramp-chaos-stream", login=login_for(c.cfg, "monitor"))
    try:
        info = await nc.jetstream(timeout=5).stream_info(subjects.TELEMETRY_STREAM)
        return str(info.created), int(info.state.messages)
    except Exception:  # noqa: BLE001 - not found (or not answering): the stream is not kept
        return None
    finally:
        await nc.close()


SCENARIOS: dict[str, Callable] = {
    "worker-kill": worker_kill, "router-kill": router_kill, "monitor-kill": monitor_kill,
    "nats-restart": nats_restart, "burst": burst, "fuzz": fuzz, "attacks": attacks,
}

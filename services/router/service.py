"""Router service: request intake, EDF queues, credit-based dispatch, reply routing.

Every accepted request gets exactly one reply: a result (early or final), or an
explicit error (``overloaded``, ``deadline_exceeded``, ``no_workers``, ``internal``).
A sweeper enforces deadlines for queued and in-flight requests alike, and work held
by a worker that stops heart-beating goes back to the queue.
"""

from __future__ import annotations

import asyncio
import heapq
import time
import uuid
from collections import Counter, deque
from dataclasses import dataclass, field

import numpy as np
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import MaxPayloadError

from schemas import errors, subjects
from schemas.codec import pack
from schemas.errors import ServingError
from schemas.heartbeat import Heartbeat, transit_margin_s, worker_timeout_s
from schemas.messages import (
    Batch,
    Results,
    decode_infer_request,
    decode_map,
    encode_error,
    encode_reply,
    request_id_of,
)
from schemas.telemetry import OK, RequestRecord
from services.common import bus, gc_pauses, logs, metrics
from services.common.config import Config
from services.common.hotpath import publish_now, subscribe_direct
from services.common.readiness import mark_ready
from services.common.service_loop import supervise
from services.router import admission, retry_hint
from services.router.edf_queue import EDFQueue, Pending, QueueFull
from services.router.generation import GenerationIntake
from services.router.model_specs import ModelSpec, llm_models, load_specs
from services.router.outbox import Outbox
from services.router.policy import Policy, make_policy
from services.router.variant_policies import make_variant_policy
from services.router.variant_table import VariantProfile
from services.router.workers import Inflight, WorkerRegistry

SWEEP_S = 0.05
METER_S = 0.25               # how often the answers seen are counted in the metrics
DISPATCH_RETRY_S = 0.05      # after a dispatch pass failed unexpectedly
VARIANT_REFRESH_S = 2.0      # variant tables are re-read this often (the profiler moves them)


@dataclass
class ModelState:
    spec: ModelSpec
    queue: EDFQueue
    service_ms: float                         # estimate of dispatch -> release per batch
    # ... of a batch sent to a worker that held nothing else: without the wait behind its
    # other batches. Screening for an idle worker uses it, so an estimate inflated by a
    # backlog cannot refuse every request as too late forever (nothing sent, no release,
    # no update); starts at service_ms
    alone_ms: float = field(init=False)
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    no_worker_since: float | None = None
    latencies: deque = field(default_factory=lambda: deque(maxlen=2000))
    served: int = 0
    failed: int = 0
    early: int = 0
    records: list[RequestRecord] = field(default_factory=list)
    dispatching: bool = False                 # a dispatch pass is running (at most one)
    drained: retry_hint.DrainRate = field(default_factory=retry_hint.DrainRate)
    audit: retry_hint.HintAudit = field(default_factory=retry_hint.HintAudit)
    tail: Pending | None = None  # the queued request with the latest deadline
    waits_ms: list[list[float]] = field(default_factory=list)  # queue waits of batches sent
    policy: Policy | None = None  # a model served by variant: its own variant policy
    variants: dict[str, VariantProfile] = field(default_factory=dict)  # ... and its table
    slowdown: float = 1.0  # live over profiled batch time of its variant batches (EWMA)

    def __post_init__(self) -> None:
        self.alone_ms = self.service_ms


class ModelMetrics:
    """One model's metric children. Updated from the records and queue waits kept anyway,
    once per flush: nothing per request on the hot path."""

    def __init__(self, model: str) -> None:
        self.requests = metrics.Children(metrics.REQUESTS, model)
        self.exits = metrics.Children(metrics.EXITS, model)
        self.latency = metrics.REQUEST_SECONDS.labels(model)
        self.waits = metrics.QUEUE_SECONDS.labels(model)
        self.queued = metrics.QUEUED.labels(model)
        self.hint_ratio = metrics.RETRY_HINT_RATIO.labels(model)

    def count(self, records: list[RequestRecord], waits_ms: list[list[float]],
              queued: int) -> None:
        for code, n in Counter(r.status for r in records).items():
            self.requests[code].inc(n)
        ok = [r for r in records if r.status == OK]
        for ramp, n in Counter(r.exit for r in ok).items():
            self.exits[metrics.FINAL if ramp is None or ramp < 0 else ramp].inc(n)
        self.latency.observe_many([r.latency_ms for r in ok], scale=1e-3)
        self.waits.observe_many([w for batch in waits_ms for w in batch], scale=1e-3)
        self.queued.set(queued)


class Router:
    def __init__(self, nc: Client, cfg: Config, specs: dict[str, ModelSpec], policy: Policy,
                 log, llm_models: set[str] | None = None) -> None:
        self.nc = nc
        self.cfg = cfg
        self.log = log
        self.id = f"router-{uuid.uuid4().hex[:8]}"
        self.policy = policy
        self.models = {name: ModelState(spec, EDFQueue(cfg.queue_limit),
                                        admission.initial_service_ms(spec.full_ms))
                       for name, spec in specs.items()}
        self.metered = {name: ModelMetrics(name) for name in specs}
        self.registry = WorkerRegistry(timeout_s=worker_timeout_s(cfg.heartbeat_ms))
        self.pending: dict[str, Pending] = {}
        # (give-up time, id) of requests a first stage released unanswered: in later stages
        self.downstream: list[tuple[float, str]] = []
        self.tasks: set[asyncio.Task] = set()
        self.started = time.monotonic()
        self.heard_until = self.started  # see on_tick
        self.tick_subject = ""            # set once subscribed
        self.batches = 0
        self.outbox = Outbox(nc, self.id, log)
        self.generation = GenerationIntake(nc, cfg, llm_models or set(),
                                           subjects.results(self.id), log, self.outbox)

    # ------------------------------------------------------------------ intake

    def on_infer(self, msg: Msg) -> None:
        now = time.monotonic()
        subject_model = msg.subject.rsplit(".", 1)[-1]
        rid = None
        try:
            raw = decode_map(msg.data)
            rid = raw.get("id") if isinstance(raw.get("id"), str) else None
            state = self.models.get(subject_model)
            if state is None:
                raise ServingError(errors.UNKNOWN_MODEL, f"unknown model {subject_model!r}; "
                                   f"served: {', '.join(sorted(self.models)) or 'none'}")
            req = decode_infer_request(raw, subject_model)
            state.spec.check_inputs(req.inputs)
            if not msg.reply:
                raise ServingError(errors.BAD_REQUEST, "request has no reply subject: use request-reply")
            held = self.pending.get(req.id)
            if held is not None:
                if held.model != subject_model:
                    raise ServingError(errors.BAD_REQUEST,
                                       f"request id {req.id!r} is in flight for {held.model!r}")
                held.reply = msg.reply  # a client's resend: its newest attempt gets the answer
                return
            if admission.refuse_for_no_workers(self.registry.has_stage0(subject_model), now,
                                               self.started):
                raise ServingError(errors.NO_WORKERS, f"no live worker serves {subject_model!r}")
            deadline = admission.request_deadline(now, req.slo_ms, self.cfg.default_slo_ms)
            entry = Pending(id=req.id, model=subject_model, reply=msg.reply, inputs=req.inputs,
                            arrival=now, deadline=deadline, received_wall=time.time())
            try:
                state.queue.push(entry)
            except QueueFull:
                retry = self._retry_after_ms(subject_model, state, now)
                raise ServingError(errors.OVERLOADED,
                                   f"queue for {subject_model!r} is full ({state.queue.limit} waiting)",
                                   retry_after_ms=retry) from None
            self.pending[req.id] = entry
            if state.tail is None or state.tail.replied or deadline >= state.tail.deadline:
                state.tail = entry
            self.kick(subject_model, state)
        except ServingError as exc:
            if rid is None:
                rid = request_id_of(msg.data)
            self._reply_error_raw(msg.reply, rid, subject_model, exc, now)
        except Exception as exc:
            self.log.exception("intake failed")
            self._reply_error_raw(msg.reply, rid, subject_model,
                                  ServingError(errors.INTERNAL, f"router error: {exc!r}"), now)

    def _retry_after_ms(self, model: str, state: ModelState, now: float) -> float:
        """The hint of an ``overloaded`` reply, noted for the router's own check of it."""
        workers = sum(w.stage == 0 for w in self.registry.for_model(model))
        tail = state.tail if state.tail is not None and not state.tail.replied else None
        retry = retry_hint.retry_after_ms(
            state.service_ms, len(state.queue), self.policy_batch(),
            state.drained.hint_rate(now), workers * self.cfg.worker_credit,
            None if tail is None else
            max(0.0, tail.deadline - now - state.service_ms / 1e3) + SWEEP_S)
        if tail is not None:
            state.audit.note(tail.id, now, retry)
        return retry

    def _settle_hints(self, state: ModelState, rid: str, now: float) -> None:
        """``rid`` is answered: if it was the tail some refusals met, their hints meet the
        drain they predicted."""
        if state.audit.waiting:
            self.metered[state.spec.name].hint_ratio.observe_many(
                state.audit.settle(rid, now))

    def policy_batch(self) -> int:
        return getattr(self.policy, "max_batch", 1)

    def _reply_error_raw(self, reply: str | None, rid: str | None, model: str,
                         exc: ServingError, start: float) -> None:
        data = encode_error(rid, exc.code, exc.message, **exc.extra)
        if model not in self.models:  # no model, no history: only the answer
            if reply:
                self.outbox.reply(reply, data)
            return
        record = self._count_error(model, rid, time.time(), start, exc.code)
        self.outbox.answer(model, record, reply, data)

    def _count_error(self, model: str, rid: str | None, received_wall: float, start: float,
                     code: str) -> RequestRecord:
        """An error answer in the status counts and the metrics; its record, to store."""
        state = self.models[model]
        state.failed += 1
        record = RequestRecord(rid, received_wall, (time.monotonic() - start) * 1e3, code)
        state.records.append(record)
        return record

    # ------------------------------------------------------------------ replies

    def reply_error(self, entry: Pending, code: str, message: str, send: bool = True,
                    **extra) -> None:
        """Answer ``entry`` with an error and record it (``send`` False: a worker has sent
        the client this error itself; only record it)."""
        if entry.replied:
            return
        entry.replied = True
        self.pending.pop(entry.id, None)
        self._settle_hints(self.models[entry.model], entry.id, time.monotonic())
        record = self._count_error(entry.model, entry.id, entry.received_wall, entry.arrival,
                                   code)
        if send:  # else the worker answered and stored it: only counted here
            self.outbox.answer(entry.model, record, entry.reply,
                               encode_error(entry.id, code, message, **extra))

    def _results_error(self, res: Results) -> None:
        code = admission.client_error_code(res.error.get("code"))
        for rid in res.ids:
            entry = self.pending.get(rid)
            if entry is None:
                continue
            message = f"worker {res.worker} failed: {res.error.get('message')}"
            if res.direct and entry.sent_reply != entry.reply:  # resent: as below
                self.outbox.reply(entry.reply, encode_error(rid, code, message))
            self.reply_error(entry, code, message, send=not res.direct)

    def on_results(self, msg: Msg) -> None:
        try:
            res = Results.decode(decode_map(msg.data))
        except Exception as exc:  # noqa: BLE001
            self.log.error("bad results message: %r", exc)
            return
        now = time.monotonic()
        if res.release and not res.ids and self.generation.on_release(res.worker, res.batch_id):
            return  # a generation stream's end
        if res.error:
            self._results_error(res)
        else:
            for i, rid in enumerate(res.ids):
                entry = self.pending.pop(rid, None)
                if entry is None or entry.replied:
                    continue
                entry.replied = True
                latency = (now - entry.arrival) * 1e3
                label, score, exit_ = int(res.labels[i]), float(res.scores[i]), int(res.exits[i])
                state = self.models[entry.model]
                self._settle_hints(state, rid, now)
                state.served += 1
                state.early += int(res.early)
                state.latencies.append(latency)
                record = RequestRecord(rid, entry.received_wall, latency, OK, exit_, res.early,
                                       label, res.config_version, res.variant)
                state.records.append(record)
                resent = res.direct and entry.sent_reply != entry.reply
                if res.direct and not resent:
                    continue  # the worker has answered and stored it itself
                data = encode_reply(rid, entry.model, {} if res.logits is None else
                                    {"logits": res.logits[i]}, label, score, exit_, res.early,
                                    latency, res.config_version, res.variant)
                if resent:  # while its worker held it: the worker answered the abandoned
                    # attempt and stored the row; the newest attempt gets the same answer
                    self.outbox.reply(entry.reply, data)
                else:
                    self.outbox.answer(entry.model, record, entry.reply, data)
        if res.release:
            inflight = self.registry.release(res.worker, res.batch_id)
            if inflight is not None:
                for e in inflight.entries:
                    if not e.replied:
                        heapq.heappush(self.downstream,
                                       (e.deadline + admission.DOWNSTREAM_GRACE_S, e.id))
                state = self.models[inflight.model]
                elapsed = (now - inflight.dispatched) * 1e3
                state.service_ms = admission.updated_service_ms(state.service_ms, elapsed)
                if inflight.alone:
                    state.alone_ms = admission.updated_service_ms(state.alone_ms, elapsed)
                    state.slowdown = admission.updated_slowdown(state.slowdown, elapsed,
                                                                inflight.expected_ms)
                state.drained.add(now, inflight.size)
                self.kick(inflight.model, state)

    # ------------------------------------------------------------------ dispatch

    def kick(self, model: str, state: ModelState) -> None:
        """Dispatch right here when nothing else is dispatching (saves a task switch on
        the latency path); a policy that wants to wait hands over to the dispatch loop."""
        if state.dispatching:
            state.wake.set()
            return
        if self._dispatch_pass(model, state) is not None:
            state.wake.set()

    def _dispatch_pass(self, model: str, state: ModelState) -> float | None:
        state.dispatching = True
        try:
            return self._dispatch_ready(model, state)
        except Exception:
            self.log.exception("dispatch failed model=%s", model)
            return DISPATCH_RETRY_S
        finally:
            state.dispatching = False

    async def dispatch_loop(self, model: str, stop: asyncio.Event) -> None:
        state = self.models[model]
        timeout: float | None = None
        while not stop.is_set():
            try:
                await asyncio.wait_for(state.wake.wait(), timeout)
            except TimeoutError:
                pass
            state.wake.clear()
            timeout = None
            if state.dispatching:
                continue  # the running pass re-checks the queue before it ends
            timeout = self._dispatch_pass(model, state)

    def _dispatch_ready(self, model: str, state: ModelState) -> float | None:
        while len(state.queue):
            worker = self.registry.pick(model)
            if worker is None:
                return None  # woken again by a heartbeat or a released credit
            now = time.monotonic()
            policy = state.policy or self.policy
            # variant policies fit profiled times into the slack over the live slowdown,
            # with headroom for the scatter around it, and drain the queue over the
            # first-stage workers (the fixed policy reads none of these)
            variants = state.policy is not None
            decision = policy.decide(admission.queue_view(
                state.queue, now, state.service_ms,
                state.slowdown * self.cfg.variant_headroom,
                self.registry.stage0_count(model) if variants else 1,
                self.cfg.max_batch if variants else 0))
            if decision.batch_size <= 0:
                return admission.reask_after_s(decision.wait_ms)
            # requests of one batch are stacked, so they share the head's input sizes
            sample_bytes = sum(a.nbytes for a in state.queue.peek().inputs.values())
            size = admission.payload_batch_cap(decision.batch_size, sample_bytes,
                                               self.nc.max_payload)
            estimate = admission.dispatch_estimate_ms(
                state.service_ms if worker.inflight else state.alone_ms, bool(worker.inflight),
                state.variants.get(decision.variant) if decision.variant else None, size,
                state.slowdown, self.cfg.variant_overhead_ms)
            screened = admission.screen_for_dispatch(state.queue.pop(size), now, estimate)
            for entry, refusal in screened.refuse:
                self.reply_error(entry, refusal.code, refusal.message)
            if screened.send:
                self._send(model, state, worker.id, screened.send, now, decision.variant)
        return None

    def _send(self, model: str, state: ModelState, worker_id: str, batch: list[Pending],
              now: float, variant: str | None = None) -> None:
        self.batches += 1
        # unique across routers (random router id) and within one (counter); no uuid per batch
        batch_id = f"{self.id.removeprefix('router-')}-{self.batches:x}"
        names = state.spec.input_names
        inputs = ({n: batch[0].inputs[n][None] for n in names} if len(batch) == 1 else
                  {n: np.stack([e.inputs[n] for e in batch]) for n in names})
        # Workers answer clients directly (one hop less on every request); the router
        # still learns of each answer from the Results message and records it. Requests
        # sent again after a worker loss are answered here: the worker thought lost may be
        # alive and answer them too, and only the router can tell the second answer.
        ages_ms = [(now - e.arrival) * 1e3 for e in batch]
        again = any(e.attempts for e in batch)
        msg = Batch(batch_id=batch_id, model=model, stage=0, router=subjects.results(self.id),
                    ids=[e.id for e in batch], config_version=0, inputs=inputs,
                    replies=[] if again else [e.reply for e in batch], ages_ms=ages_ms,
                    slos_ms=[(e.deadline - e.arrival) * 1e3 for e in batch], variant=variant)
        data = msg.encode()
        if len(data) > self.nc.max_payload and len(batch) > 1:
            # the cap counts a typical envelope; long ids or reply subjects made it larger:
            # send the first half, the rest goes back to the queue (already admitted)
            for e in batch[len(batch) // 2:]:
                state.queue.push(e, force=True)
            self._send(model, state, worker_id, batch[:len(batch) // 2], now, variant)
            return
        for e in batch:
            e.attempts += 1
            e.sent_reply = e.reply
        state.waits_ms.append(ages_ms)  # the queue-time metric, observed at the next flush
        w = self.registry.workers[worker_id]
        profiled = state.variants.get(variant) if variant is not None else None
        w.inflight[batch_id] = Inflight(batch_id, worker_id, model, batch, now, len(batch),
                                        alone=not w.inflight,
                                        expected_ms=profiled.latency(len(batch)) if profiled
                                        else 0.0)
        try:
            publish_now(self.nc, subjects.work(worker_id), data)
        except Exception as exc:  # noqa: BLE001 - fail these requests clearly, never silently
            w.inflight.pop(batch_id, None)
            code = errors.PAYLOAD_TOO_LARGE if isinstance(exc, MaxPayloadError) else errors.INTERNAL
            for e in batch:
                self.reply_error(e, code, f"cannot send batch of {len(batch)} to a worker "
                                 f"({len(data)} bytes): {exc!r}")

    # ------------------------------------------------------------------ liveness

    def on_heartbeat(self, msg: Msg) -> None:
        """Runs in the read loop (direct), in order with the router's ticks, so that
        ``heard_until`` covers every heartbeat the server passed on before a tick."""
        try:
            hb = Heartbeat.decode(decode_map(msg.data))
            if hb.llm:
                self.generation.on_heartbeat(hb, time.monotonic())
                return
            if hb.model not in self.models:
                return
            new = self.registry.heartbeat(hb.worker, hb.model, hb.stage, hb.stages, hb.capacity,
                                          time.monotonic(), hb.pid, hb.config_version,
                                          hb.set_aside, hb.gave_way, hb.late)
            if new:
                self.log.info("worker joined %s", logs.kv(worker=hb.worker, model=hb.model,
                                                         stage=hb.stage))
                self.models[hb.model].wake.set()
            # e.g. sent just before a NATS restart, or before the worker subscribed again
            # judged at heard_until: a heartbeat read late (a backlog of intake ahead of
            # it) may have been sent before a batch reached its worker
            lost = self.registry.lost_in_transit(hb.worker, hb.held, self.heard_until,
                                                 transit_margin_s(self.cfg.heartbeat_ms))
            if lost:
                self.log.warning("batches lost in transit %s", logs.kv(
                    worker=hb.worker, batches=len(lost)))
                self._take_back(lost)
        except Exception as exc:  # noqa: BLE001
            self.log.warning("bad heartbeat: %r", exc)

    def _take_back(self, batches) -> None:
        """Work a worker will never answer: its unanswered requests go back to the queue."""
        for inflight in batches:
            state = self.models[inflight.model]
            outcome = admission.after_worker_loss(inflight.entries)
            for e, refusal in outcome.give_up:
                self.reply_error(e, refusal.code, refusal.message)
            for e in outcome.requeue:
                state.queue.push(e, force=True)   # already admitted: not bounced by the limit
            state.wake.set()

    def on_tick(self, msg: Msg) -> None:
        """A tick of this router's came back through the server: every message the server
        passed on before it has been read (heartbeats are handled as they are read)."""
        try:
            self.heard_until = max(self.heard_until, float(msg.data))
        except ValueError:
            self.log.warning("bad tick %r", msg.data[:40])

    def tick(self) -> None:
        if self.tick_subject:
            publish_now(self.nc, self.tick_subject, repr(time.monotonic()).encode())

    async def sweep_loop(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await asyncio.sleep(SWEEP_S)
            try:
                self.tick()
                self._sweep(time.monotonic())
            except Exception:
                self.log.exception("sweep failed")

    def _sweep(self, now: float) -> None:
        # Silence is measured up to heard_until, not now: a router that has not yet read
        # its backlog (a burst of requests ahead of the heartbeats) must not take live
        # workers for dead and run their batches twice.
        self.generation.sweep(now, self.heard_until)
        for dead in self.registry.expire(self.heard_until):
            self.log.warning("worker lost %s", logs.kv(worker=dead.id, model=dead.model,
                                                       stage=dead.stage, inflight=len(dead.inflight)))
            self._take_back(dead.inflight.values())
        while self.downstream and self.downstream[0][0] <= now:
            _, rid = heapq.heappop(self.downstream)
            e = self.pending.get(rid)
            if e is not None and not e.replied:
                self.reply_error(e, errors.DEADLINE_EXCEEDED, "no answer by its deadline: "
                                 "its batch left the first stage and no later stage answered "
                                 "(a stage worker was lost)")
        for name, state in self.models.items():
            for e in state.queue.expire(now):
                self.reply_error(e, errors.DEADLINE_EXCEEDED, "deadline passed while queued")
            absence = admission.track_worker_absence(self.registry.has_stage0(name),
                                                     state.no_worker_since, now, len(state.queue))
            state.no_worker_since = absence.since
            if absence.drain:
                for e in state.queue.drain():
                    self.reply_error(e, errors.NO_WORKERS, f"no live worker serves {name!r}")
        # nothing in flight is answered here: a request dispatched with its reply subject is
        # its worker's to answer, late or not (one reply per request); a lost worker's come
        # back through its loss above

    # ------------------------------------------------------------------ telemetry + status

    async def meter_loop(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await asyncio.sleep(METER_S)
            self.meter()

    def meter(self) -> None:
        """Count the answers seen since the last call in the metrics (their rows left with
        them: through the outbox, or from the worker that answered)."""
        for name, state in self.models.items():
            records, state.records = state.records, []
            waits, state.waits_ms = state.waits_ms, []
            self.metered[name].count(records, waits, len(state.queue))

    async def on_models(self, msg: Msg) -> None:
        models = [dict(state.spec.describe(), ready=self.registry.ready(name))
                  for name, state in sorted(self.models.items())]
        models += [{"name": name, "kind": "llm", "ready": self.generation.desk.has_worker(name)}
                   for name in sorted(self.generation.served_models())]
        await msg.respond(pack({"v": 1, "models": models}))

    async def on_status(self, msg: Msg) -> None:
        out = {}
        for name, state in self.models.items():
            lat = np.array(state.latencies) if state.latencies else None
            out[name] = {
                "ready": self.registry.ready(name), "queue": len(state.queue),
                "served": state.served, "errors": state.failed, "early": state.early,
                "service_ms": round(state.service_ms, 2),
                "p50_ms": None if lat is None else float(np.percentile(lat, 50)),
                "p95_ms": None if lat is None else float(np.percentile(lat, 95)),
                "workers": [{"id": w.id, "stage": w.stage, "pid": w.pid, "credit": w.credit,
                             "config_version": w.config_version, "set_aside": w.set_aside,
                             "gave_way": w.gave_way, "late": w.late}
                            for w in self.registry.for_model(name)],
            }
        await msg.respond(pack({"v": 1, "router": self.id, "models": out}))


def variant_tables(cfg: Config, names: list[str]) -> dict[str, list[VariantProfile]]:
    """Each model's variant frontier in the store (none: the model is not served by
    variant); a store read, run in a thread."""
    from services.store.repository import Store

    with Store(cfg.database_url) as store:
        return {name: [VariantProfile.from_table(r["variant"], r["accuracy"], r["latency_ms"])
                       for r in store.subnet_profiles(name) if r["latency_ms"]]
                for name in names}


def use_variant_policies(router: Router, cfg: Config, tables: dict[str, list[VariantProfile]],
                         log) -> None:
    """Give each model with variant profiles (its frontier) the variant policy
    ``OFFRAMP_ROUTER_POLICY`` names, rebuilt when its table changed; the others keep the
    router's batching."""
    for name, variants in tables.items():
        state = router.models[name]
        if not variants:
            if state.policy is None:
                log.info("no variant profiles, batching as prepared %s", logs.kv(model=name))
            continue
        if {v.key: v for v in variants} == state.variants:
            continue
        state.policy = make_variant_policy(cfg.router_policy, variants, cfg.max_batch,
                                           cfg.variant_overhead_ms)
        state.variants = {v.key: v for v in variants}
        log.info("variant policy %s", logs.kv(model=name, policy=cfg.router_policy,
                                              variants=len(variants)))


async def refresh_variants(router: Router, cfg: Config, stop: asyncio.Event, log) -> None:
    """Variant tables change as the profiler measures them (an early-exit model's depth
    caps follow its feedback): re-read them every ``VARIANT_REFRESH_S``."""
    while not stop.is_set():
        try:
            await asyncio.wait_for(stop.wait(), VARIANT_REFRESH_S)
        except TimeoutError:
            pass
        if not stop.is_set():
            tables = await asyncio.to_thread(variant_tables, cfg, list(router.models))
            use_variant_policies(router, cfg, tables, log)


async def serve(cfg: Config, stop: asyncio.Event) -> None:
    log = logs.setup("router", cfg.log_level)
    specs, llms = load_specs(cfg), llm_models(cfg)
    nc = await bus.connect_as(cfg, "router", "offramp-router")
    await bus.ensure_telemetry_stream(nc)
    router = Router(nc, cfg, specs, make_policy("fixed", cfg.max_batch, cfg.batch_timeout_ms), log,
                    llms)
    if cfg.router_policy != "fixed":
        use_variant_policies(router, cfg, await asyncio.to_thread(
            variant_tables, cfg, list(router.models)), log)
        supervise("variants", lambda: refresh_variants(router, cfg, stop, log), router.tasks,
                  log)
    await subscribe_direct(nc, subjects.INFER_ALL, router.on_infer, queue=subjects.ROUTER_QUEUE)
    await subscribe_direct(nc, subjects.GENERATE_ALL, router.generation.on_generate,
                           queue=subjects.ROUTER_QUEUE)
    await nc.subscribe(subjects.MODELS, queue=subjects.ROUTER_QUEUE, cb=router.on_models)
    await nc.subscribe(subjects.STATUS_ROUTER, cb=router.on_status)
    await subscribe_direct(nc, subjects.HEARTBEAT, router.on_heartbeat)
    router.tick_subject = nc.new_inbox()
    await subscribe_direct(nc, router.tick_subject, router.on_tick)
    await subscribe_direct(nc, subjects.results(router.id), router.on_results)
    supervise("sweep", lambda: router.sweep_loop(stop), router.tasks, log)
    supervise("metrics", lambda: router.meter_loop(stop), router.tasks, log)
    for name in router.models:
        supervise(f"dispatch-{name}", lambda name=name: router.dispatch_loop(name, stop),
                  router.tasks, log)
    gc_pauses.settle(cfg.gc_freeze)  # the startup heap: out of every later collection
    log.info("router ready %s", logs.kv(id=router.id, models=",".join(router.models)))
    mark_ready()
    await stop.wait()
    # Answer everything still pending so no client waits for a reply that never comes.
    for entry in list(router.pending.values()):
        router.reply_error(entry, errors.NO_WORKERS, "router shutting down")
    router.outbox.flush()
    router.meter()
    for t in list(router.tasks):
        t.cancel()
    await bus.close(nc)

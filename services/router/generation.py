"""Generation intake (``offramp.generate.<model>``): the router checks a request, waits for
a free slot of an LLM worker of the model, and hands the request over; the worker streams
to the client. Every request gets a terminal message: the worker's, or an error from here
(bad input, unknown model, no worker, a full queue, no slot before its first-token SLO, or
its worker lost mid-stream). The bookkeeping is ``llm_desk.LlmDesk``. Errors answered here
are stored as request rows (through the router's outbox); the worker stores the streams it
ends."""

from __future__ import annotations

import time

from nats.aio.msg import Msg

from schemas import errors, subjects
from schemas.errors import ServingError
from schemas.generation import LlmWork, decode_generate_request
from schemas.heartbeat import Heartbeat, transit_margin_s, worker_timeout_s
from schemas.messages import decode_map, encode_error, request_id_of
from schemas.telemetry import RequestRecord
from services.common.config import Config
from services.common.hotpath import publish_now
from services.router.admission import NO_WORKER_GRACE_S
from services.router.llm_desk import LlmDesk, Stream

# A generation request waits this long for a slot unless it sets ttft_slo_ms: streams last
# seconds, so the classifier's default SLO would refuse most of a burst.
DEFAULT_WAIT_S = 30.0


class GenerationIntake:
    def __init__(self, nc, cfg: Config, llm_models: set[str], results_subject: str,
                 log, outbox=None) -> None:
        self.nc, self.log, self.outbox = nc, log, outbox
        self.llm_models = llm_models          # configured: served even before a worker joins
        self.results_subject = results_subject
        self.desk = LlmDesk(worker_timeout_s(cfg.heartbeat_ms),
                            transit_margin_s(cfg.heartbeat_ms), cfg.queue_limit)
        self.started = time.monotonic()

    def _error(self, reply: str, rid: str | None, code: str, message: str,
               model: str | None = None, arrival: float | None = None) -> None:
        """Answer with an error; for a model served here, store its request row too
        (``arrival``: monotonic time the request came)."""
        data = encode_error(rid, code, message)
        if self.outbox is not None and model is not None and model in self.served_models():
            now = time.monotonic()
            came = now if arrival is None else arrival
            record = RequestRecord(rid, time.time() - (now - came), (now - came) * 1e3, code)
            self.outbox.answer(model, record, reply or None, data)
        elif reply:
            publish_now(self.nc, reply, data)

    def on_generate(self, msg: Msg) -> None:
        now = time.monotonic()
        model = msg.subject.rsplit(".", 1)[-1]
        try:
            if not msg.reply:
                raise ServingError(errors.BAD_REQUEST, "request has no reply subject")
            if model not in self.llm_models and not self.desk.serves(model):
                raise ServingError(errors.UNKNOWN_MODEL, f"unknown model {model!r} for "
                                   "generation; served: "
                                   f"{', '.join(sorted(self.served_models())) or 'none'}")
            req = decode_generate_request(decode_map(msg.data), model)
            if req.id in self.desk.open:
                raise ServingError(errors.BAD_REQUEST, f"request id {req.id!r} is in flight")
            if not self.desk.has_worker(model) and now - self.started > NO_WORKER_GRACE_S:
                raise ServingError(errors.NO_WORKERS, f"no live LLM worker serves {model!r}")
            wait_s = (req.ttft_slo_ms / 1e3 if req.ttft_slo_ms else DEFAULT_WAIT_S)
            if not self.desk.enqueue(Stream(req.id, model, msg.reply, msg.data, now,
                                            now + wait_s)):
                raise ServingError(errors.OVERLOADED, f"{self.desk.queue_limit} generation "
                                   f"requests for {model!r} already wait for a slot")
        except ServingError as exc:
            self._error(msg.reply, request_id_of(msg.data), exc.code, exc.message, model, now)
            return
        self.dispatch(model, now)

    def served_models(self) -> set[str]:
        return self.llm_models | self.desk.models_seen

    def dispatch(self, model: str, now: float) -> None:
        for s in self.desk.assign(model, now):
            publish_now(self.nc, subjects.llm_work(s.worker), LlmWork(
                self.results_subject, s.reply, s.data, (now - s.arrival) * 1e3).encode())

    def on_heartbeat(self, hb: Heartbeat, now: float) -> None:
        new = hb.worker not in self.desk.workers
        self.desk.heartbeat(hb.worker, hb.model, hb.capacity, now, hb.held)
        if new:
            self.log.info("llm worker joined worker=%s model=%s slots=%d", hb.worker, hb.model,
                          hb.capacity)
        self.dispatch(hb.model, now)

    def on_release(self, worker: str, rid: str) -> bool:
        """A worker's release of a stream; False when ``worker`` is no LLM worker here."""
        if worker not in self.desk.workers:
            return False
        s = self.desk.release(worker, rid)
        if s is not None:
            self.dispatch(s.model, time.monotonic())
        return True

    def sweep(self, now: float, heard_until: float) -> None:
        for s in self.desk.lost(heard_until):
            self.log.warning("llm worker lost, stream ended id=%s worker=%s", s.id, s.worker)
            self._error(s.reply, s.id, errors.NO_WORKERS, f"the LLM worker serving it "
                        f"({s.worker}) was lost; tokens already streamed stand", s.model,
                        s.arrival)
        for s in self.desk.late(now):  # waits judged on the router's own clock
            self._error(s.reply, s.id, errors.DEADLINE_EXCEEDED, "no LLM worker slot was free "
                        "before its first-token deadline", s.model, s.arrival)

"""LLM worker (``offramp serve worker --model M`` for a generative model): continuous
batching of generation streams over one ``LlmDecoder`` with exit heads.

A router hands it requests (``offramp.llm.<worker_id>``) while it has free slots: the KV
budget (``OFFRAMP_KV_BUDGET_MB``) over one stream's KV (``OFFRAMP_LLM_SLOT_TOKENS`` tokens at
every layer). Each decoding round prefills the streams that joined and advances every other
stream by one token, in one torch call off the event loop; a token that an exit head is
sure of (``OFFRAMP_LLM_THRESHOLD``) is emitted at once and its deeper layers' KV is filled
in the next round (Apparate's parallel decoding). Chunks go straight to each client; the
stream's request row (``requests``: status, latency, and the candidate and depth that served
it as ``variant``), its terminal message and the router's release leave in one write.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import socket
import time
import uuid
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
from nats.aio.client import Client
from nats.aio.msg import Msg

from schemas import errors, subjects
from schemas.errors import ServingError
from schemas.generation import LlmWork, decode_generate_request
from schemas.heartbeat import Heartbeat
from schemas.helios import GenerationRecord, GenerationTelemetry, HeliosChoice
from schemas.messages import (
    GENERATION,
    ExitConfig,
    Results,
    decode_map,
    encode_error,
    request_id_of,
)
from schemas.telemetry import OK, RequestRecord, RequestTelemetry
from services.common import bus, gc_pauses, logs
from services.common.config import Config
from services.common.hotpath import publish_all, subscribe_direct
from services.common.readiness import mark_ready
from services.common.service_loop import supervise
from services.runtime.llm_decoder import LlmDecoder, Sequence, StepResult
from services.runtime.llm_layers import LayerLoader, Move
from services.runtime.llm_model import LoadedLlm, load
from services.worker.llm_candidates import (
    Draining,
    Held,
    depth_problem,
    hold,
    judged_logprob,
    read_candidate,
    switch_problem,
)
from services.worker.llm_streams import GenStream, prompt_problem


def slots_for(llm: LoadedLlm, budget_mb: float, slot_tokens: int, layers: int = 0) -> int:
    """Streams whose KV (and kept hidden states) at every loaded layer (``layers``, 0: all)
    fit the budget."""
    cfg = llm.model.config
    heads = cfg.num_attention_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    kv_heads = getattr(cfg, "num_key_value_heads", heads)
    per_token = 4 * (2 * (layers or cfg.num_hidden_layers) * kv_heads * head_dim
                     + cfg.hidden_size)
    return max(1, int(budget_mb * 2**20 // (per_token * slot_tokens)))


def heads_in_use(setting: str, llm: LoadedLlm, strict: bool = True) -> list[int]:
    """The exit heads ``OFFRAMP_LLM_HEADS`` names: none by default, since each costs a
    vocabulary projection (about five of SmolLM2's layers at batch 1) on every token it sees.
    Not ``strict`` (a candidate switched to): the named layers where it has a head."""
    if not setting:
        return []
    if setting == "all":
        return list(llm.heads.layers)
    if setting == "last":  # each candidate's deepest head, wherever its layers end
        return list(llm.heads.layers[-1:])
    try:
        layers = [int(x) for x in setting.split(",") if x.strip()]
    except ValueError:
        raise SystemExit(f"OFFRAMP_LLM_HEADS={setting!r}: give `all`, `last` or head layers such as "
                         f"{','.join(map(str, llm.heads.layers[-2:]))}") from None
    unknown = sorted(set(layers) - set(llm.heads.layers))
    if not strict:
        return [k for k in layers if k not in unknown]
    if unknown:
        raise SystemExit(f"OFFRAMP_LLM_HEADS names layers {unknown} without an exit head; "
                         f"the heads are after layers {llm.heads.layers}")
    return layers


def loaded_depth(setting: int, llm: LoadedLlm) -> int:
    """The depth ``OFFRAMP_LLM_DEPTH`` asks for (0: every layer); a partial depth needs an
    exit head there, to answer the tokens that reach it."""
    n = int(llm.model.config.num_hidden_layers)
    if setting in (0, n):
        return n
    if setting not in llm.heads.layers:
        raise SystemExit(f"OFFRAMP_LLM_DEPTH={setting}: load all {n} layers (0) or up to an "
                         f"exit head: {', '.join(map(str, llm.heads.layers))}")
    return setting


class LlmWorker:
    def __init__(self, nc: Client, cfg: Config, name: str, llm: LoadedLlm, log) -> None:
        self.nc, self.cfg, self.name, self.llm, self.log = nc, cfg, name, llm, log
        self.id = f"{name}-llm-{uuid.uuid4().hex[:6]}"
        self.candidate = name  # the candidate held: HELIOS may switch to another of its family
        self.old: Draining | None = None  # the candidate switched from, ending its streams
        self.started = 0  # streams started under the decision in force
        self.judge: LoadedLlm | None = None  # the served model, kept while others are evaluated
        self.decoder = LlmDecoder(llm.model, llm.heads, loaded_depth(cfg.llm_depth, llm))
        self.tuned: dict[int, float] = {}  # per head: the tuner's generation exit config
        self.config_version = 0
        self.threshold = cfg.llm_threshold  # what a token needs at the loaded depth's head
        self.heads = heads_in_use(cfg.llm_heads, llm)
        self.thresholds = self._thresholds()
        self.slots = slots_for(llm, cfg.kv_budget_mb, cfg.llm_slot_tokens, self.decoder.depth)
        self.weight_bytes = self.decoder.weight_bytes()  # changes only with the depth
        self.slot_tokens = min(cfg.llm_slot_tokens, llm.context)
        self.eos = llm.eos
        self.waiting: deque[GenStream] = deque()
        self.active: dict[str, tuple[GenStream, Sequence]] = {}
        self.wake = asyncio.Event()
        self.rounds = 0
        # every round from one thread: torch keeps an intra-op thread team per calling
        # thread, and rounds hopping between pool threads would wake a second team
        self.decoding = ThreadPoolExecutor(1, thread_name_prefix="llm-decode")
        self.records_sent = 0  # request-row messages, numbered for the monitor's dedup
        self.choice: HeliosChoice | None = None  # HELIOS's decision being served
        self.next_choice: HeliosChoice | None = None  # received, applied between rounds
        self.loader: LayerLoader | None = None
        # layers (a Move) or another candidate (a Held) being read
        self.loading: tuple[HeliosChoice, asyncio.Future] | None = None

    @property
    def open_ids(self) -> tuple[str, ...]:
        return tuple([s.id for s in self.waiting] + list(self.active))

    # ------------------------------------------------------------------ intake

    def on_work(self, msg: Msg) -> None:
        try:
            work = LlmWork.decode(decode_map(msg.data))
        except ServingError as exc:
            self.log.error("dropping malformed llm work: %s", exc.message)
            return
        rid = request_id_of(work.request)
        received = time.time() - work.waited_ms / 1e3
        try:
            req = decode_generate_request(decode_map(work.request), self.name)
            prompt = self._tokenize(req)
            problem = prompt_problem(prompt, req.max_tokens, self.llm.model.config.vocab_size,
                                     self.slot_tokens)
            if problem:
                raise ServingError(errors.BAD_REQUEST, problem)
        except ServingError as exc:
            self._end(work.reply, work.router, rid or "", encode_error(rid, exc.code, exc.message),
                      self._row(rid, received, exc.code))
            return
        except Exception as exc:  # noqa: BLE001 - a tokenizer failure is the request's error
            self._end(work.reply, work.router, rid or "", encode_error(
                rid, errors.BAD_REQUEST, f"cannot tokenise the prompt: {exc!r}"),
                self._row(rid, received, errors.BAD_REQUEST))
            return
        self.waiting.append(GenStream(req, work.reply, work.router, prompt, time.monotonic(),
                                      min(req.max_tokens, self.slot_tokens - len(prompt)),
                                      received))
        self.wake.set()

    def _tokenize(self, req) -> list[int]:
        if req.prompt_tokens is not None:
            return list(req.prompt_tokens)
        tok = self.llm.tokenizer
        if req.chat and getattr(tok, "chat_template", None):
            return list(tok.apply_chat_template([{"role": "user", "content": req.prompt}],
                                                add_generation_prompt=True, tokenize=True,
                                                return_dict=False))
        return list(tok.encode(req.prompt))

    def _end(self, reply: str, router: str, rid: str, terminal: bytes,
             record: RequestRecord, generation: GenerationRecord | None = None) -> None:
        """A stream's request row (and generation record), terminal message and the
        router's release, in one write."""
        empty = np.zeros(0, np.int32)
        release = Results(rid, self.id, 0, [], empty, empty.astype(np.float32), empty, None,
                          False, 0, release=True).encode()
        self.records_sent += 1
        row = RequestTelemetry(self.name, self.id, [record]).encode()
        # the rows first, as every answer's record (schemas/README.md, "Request telemetry")
        messages = [(subjects.telemetry_requests(self.name), row,
                     f"{self.id}:r{self.records_sent}")]
        if generation is not None:
            messages.append((subjects.telemetry_generation(self.name),
                             GenerationTelemetry(self.name, self.id, [generation]).encode(),
                             f"{self.id}:g{self.records_sent}"))
        publish_all(self.nc, [*messages, (reply, terminal), (router, release)], self.log)

    def _row(self, rid: str | None, received: float, status: str,
             stream: GenStream | None = None) -> RequestRecord:
        """The request row of a request received at ``received`` (unix s) ending now with
        ``status``; an answered one names the candidate and the depth it started on."""
        served = f"{stream.candidate}@{stream.depth}" if status == OK and stream else None
        return RequestRecord(rid, received, (time.time() - received) * 1e3, status,
                             variant=served)

    # ------------------------------------------------------------------ decoding

    async def run(self, stop: asyncio.Event) -> None:
        loop = asyncio.get_running_loop()
        while not stop.is_set():
            self._follow_choices(loop)
            if self._evaluated_enough():  # before admitting: new streams go to the judge
                self._back_to_judge()
            if not self.waiting and not self.active:
                self.wake.clear()
                await self.wake.wait()
                continue
            new = [self.waiting.popleft() for _ in range(min(len(self.waiting), self._room()))]
            seqs = {s.id: Sequence(s.id, list(s.prompt)) for s in new}
            running = list(self.active.values())
            for s in new:  # open from here on: heartbeats list them
                self.active[s.id] = (s, seqs[s.id])
                s.candidate, s.depth = self.candidate, self.decoder.depth
                s.assessment = getattr(self.choice, "assessment", None)
            self.started += len(new)
            try:
                out = await loop.run_in_executor(self.decoding, self._round, list(seqs.values()),
                                                 [q for _, q in running])
            except Exception as exc:  # the round's streams fail; the worker lives on
                self.log.error("decoding round failed: %r", exc, exc_info=exc)
                for s in [s for s, _ in self.active.values()]:  # each was in the round
                    self.active.pop(s.id, None)
                    self._end(s.reply, s.router, s.id, encode_error(
                        s.id, errors.INTERNAL, f"decoding failed: {exc!r}"),
                        self._row(s.id, s.received, errors.INTERNAL))
                continue
            self._publish_round(*out)

    def _round(self, new: list[Sequence], running: list[Sequence],
               ) -> tuple[list[StepResult], dict[str, float]]:
        """In a thread: first tokens of ``new``, the next token of ``running``; and the ms
        each stream spent in the call of its own candidate's decoder (the PHT's speed must
        not charge a candidate for the other one's steps sharing the round)."""
        old = self.old
        theirs = [q for q in running if old is not None and q.request_id in old.ids]
        mine = [q for q in running if old is None or q.request_id not in old.ids]
        results: list[StepResult] = []
        spent: dict[str, float] = {}
        for seqs, call in ((new, lambda: self.decoder.prefill(new)),
                           (mine, lambda: self.decoder.step(mine, self.thresholds)),
                           (theirs, lambda: old.decoder.step(theirs, old.thresholds))):
            if seqs:
                started = time.perf_counter()
                results += call()
                ms = (time.perf_counter() - started) * 1e3
                spent.update((q.request_id, ms) for q in seqs)
        self.rounds += 1
        return results, spent

    def _publish_round(self, out: list[StepResult], spent: dict[str, float]) -> None:
        now = time.monotonic()
        for rid, ms in spent.items():
            if rid in self.active:
                self.active[rid][0].decode_ms += ms
        messages: list[tuple[str, bytes]] = []
        ended: list[tuple[GenStream, Sequence, Any]] = []
        for r in out:
            rid, token, layers, confidence = r.request_id, r.token, r.exit_layer, r.confidence
            stream, seq = self.active[rid]
            by = self.old if self.old is not None and rid in self.old.ids else self
            n_layers, depth = by.decoder.n_layers, by.decoder.depth
            for f in r.feedback:  # early tokens whose positions reached the last layer
                stream.check(f.position - len(stream.prompt), f.exit_layer,
                             f.emitted_token == f.full_token)
            # a token that reached a partial depth's head unsure needed layers not loaded
            need = self.tuned.get(depth, self.threshold)  # the loaded depth's head, as tuned
            breach = layers == depth < n_layers and confidence < need
            messages.append((stream.reply, stream.add(token, layers, now,
                                                      by.llm.tokenizer.decode, by.eos,
                                                      confidence, breach)))
            if stream.finish:
                ended.append((stream, seq, by))
        publish_all(self.nc, messages, self.log)
        for stream, seq, by in ended:
            del self.active[stream.id]
            memory = by.weight_bytes + by.decoder.kv_bytes(seq)
            self._drained(stream.id, now)
            record = stream.record(now, memory)
            judge = self._judge_for(stream)
            record.judging = judge is not None  # on record now; its score completes it later
            self._end(stream.reply, stream.router, stream.id, stream.done(now),
                      self._row(stream.id, stream.received, OK, stream), record)
            if judge is not None:
                self._send_judged(record, judge, stream)

    def _judge_for(self, stream: GenStream) -> LoadedLlm | None:
        """The served model, fully loaded, to score a stream another candidate answered."""
        if stream.candidate == self.name:
            return None
        if self.candidate == self.name:
            return self.llm if self.decoder.depth == self.decoder.n_layers else None
        return self.judge

    def _send_judged(self, record: GenerationRecord, judge: LoadedLlm,
                     stream: GenStream) -> None:
        """The record that completes ``record`` (sent with ``judging``) with the judge's
        log-probability of its tokens, once the decoding thread scored them (between
        rounds); none if scoring fails, so the stream stays out of the PHT."""
        future = asyncio.get_running_loop().run_in_executor(
            self.decoding, judged_logprob, judge, list(stream.prompt), list(stream.tokens))

        def send(done: asyncio.Future) -> None:
            try:
                score = done.result()
            except Exception as exc:  # noqa: BLE001 - the stream is on record, unjudged
                self.log.error("cannot judge stream %s: %r", record.id, exc)
                return
            completing = dataclasses.replace(record, judged_logprob=score, judging=False)
            self.records_sent += 1
            publish_all(self.nc, [(subjects.telemetry_generation(self.name),
                                   GenerationTelemetry(self.name, self.id, [completing]).encode(),
                                   f"{self.id}:j{self.records_sent}")], self.log)

        future.add_done_callback(send)

    # ------------------------------------------------------------------ thresholds

    def _thresholds(self) -> dict[int, float]:
        """The heads scored below the loaded depth, each at its tuned threshold (else the
        configured one)."""
        return {k: self.tuned.get(k, self.threshold) for k in self.heads
                if k < self.decoder.depth}

    def on_config(self, msg: Msg) -> None:
        """The tuner's per-head thresholds (an exit config in ``generation`` mode), from the
        next round on; older versions and other modes are ignored."""
        try:
            config = ExitConfig.decode(decode_map(msg.data))
        except ServingError as exc:
            self.log.error("ignoring malformed exit config: %s", exc.message)
            return
        if config.mode != GENERATION or config.version <= self.config_version:
            return
        self.config_version, self.tuned = config.version, dict(config.thresholds)
        self.thresholds = self._thresholds()
        self.log.info("exit config %s", logs.kv(version=config.version, thresholds=",".join(
            f"{k}:{t:.3f}" for k, t in sorted(self.thresholds.items())) or "none"))

    # ------------------------------------------------------------------ HELIOS

    def on_choice(self, msg: Msg) -> None:
        """The optimizer's decision (re-broadcast periodically): adopted between rounds."""
        try:
            choice = HeliosChoice.decode(decode_map(msg.data))
        except ServingError as exc:
            self.log.error("ignoring malformed HELIOS decision: %s", exc.message)
            return
        newest = self.next_choice or self.choice
        if newest is not None and choice.decision <= newest.decision:
            return
        problem = self._choice_problem(choice)
        if problem:
            self.log.error("ignoring HELIOS decision %s: %s", choice.decision, problem)
            return
        self.next_choice = choice
        self.wake.set()

    def _choice_problem(self, choice: HeliosChoice) -> str | None:
        if choice.candidate != self.candidate:
            return switch_problem(self.cfg.models_dir, choice.candidate, choice.depth,
                                  self.llm.manifest)
        return depth_problem(self.candidate, self.decoder.n_layers, self.llm.heads.layers,
                             choice.depth)

    def _follow_choices(self, loop: asyncio.AbstractEventLoop) -> None:
        """Between rounds: serve a decision whose layers are in, and start on the next one.
        Loading is pipelined with decoding: layers above the depth in use are read back in
        another thread while rounds go on (a round never touches them), and the decoder
        goes deeper at the first round after; a shallower depth takes effect at once and
        its released layers' memory returns in the background."""
        if self.loading is not None and self.loading[1].done():
            choice, future = self.loading
            self.loading = None
            try:
                done = future.result()
                if isinstance(done, Held):
                    self._switch(done, choice.kind == "evaluate")
                self._serve(choice, None if isinstance(done, Held) else done)
            except Exception as exc:  # noqa: BLE001 - keep serving what is loaded
                self.log.error("cannot load %s to depth %s: %r", choice.candidate,
                               choice.depth, exc)
        if self.loading is not None or self.next_choice is None:
            return
        choice, self.next_choice = self.next_choice, None
        if choice.candidate != self.candidate:
            if self.old is not None:  # one candidate drains at a time
                if self.old.name == choice.candidate:  # wanted again: no read
                    self._take_back()
                self.next_choice = choice
                return
            if choice.candidate == self.name and self.judge is not None:  # back: no read
                # in the decoding thread: the judge may be scoring a stream
                future = loop.run_in_executor(self.decoding, hold, self.name, self.judge,
                                              choice.depth)
            else:
                future = loop.run_in_executor(None, read_candidate, self.cfg.models_dir,
                                              choice.candidate, choice.depth,
                                              self.cfg.ort_threads, self.llm.tokenizer)
            future.add_done_callback(lambda _f: self.wake.set())
            self.loading = (choice, future)
            return
        if self.loader is None:
            self.loader = LayerLoader(self.llm.model, Path(self.llm.manifest.base["fp32"]))
        if choice.depth < self.decoder.depth:
            self._serve(choice, None)
        future = loop.run_in_executor(None, self.loader.load_to, choice.depth)
        future.add_done_callback(lambda _f: self.wake.set())
        self.loading = (choice, future)

    def _switch(self, held: Held, evaluating: bool, keep: frozenset[str] = frozenset()) -> None:
        """Between rounds: new streams start on ``held`` from the next round on; the open
        ones (but ``keep``, already ``held``'s) end on the candidate they started on, beside
        it. While ``evaluating`` another candidate the served model stays as judge (fully
        loaded only)."""
        old = self.candidate
        if held.name == self.name or not evaluating:
            self.judge = None
        elif old == self.name and self.decoder.depth == self.decoder.n_layers:
            self.judge = self.llm
        draining = set(self.active) - keep
        if draining:
            self.old = Draining(old, self.llm, self.decoder, dict(self.thresholds),
                                self.weight_bytes, self.eos, draining, time.monotonic())
        self.llm, self.candidate, self.loader = held.llm, held.name, held.loader
        self.decoder = LlmDecoder(held.llm.model, held.llm.heads, held.depth)
        self.heads = heads_in_use(self.cfg.llm_heads, held.llm, strict=False)
        self.eos = held.llm.eos
        self.log.info("helios switch %s", logs.kv(
            previous=old, candidate=held.name, depth=held.depth, read_ms=round(held.ms, 1),
            draining=len(draining)))

    def _take_back(self) -> None:
        """The candidate draining is wanted again: it takes new streams at once (no read)
        and keeps its open ones; the current candidate's streams end on it instead."""
        old, self.old = self.old, None
        self._switch(Held(old.name, old.llm, old.decoder.depth), False, frozenset(old.ids))

    def _evaluating_other(self) -> bool:
        """Another candidate is under evaluation and the served model is at hand as judge."""
        c = self.choice
        return (c is not None and c.kind == "evaluate" and c.candidate == self.candidate
                != self.name and self.judge is not None and self.loading is None)

    def _evaluated_enough(self) -> bool:
        """... and it has started its share of streams (``OFFRAMP_HELIOS_EVAL_PROMPTS``)."""
        return self._evaluating_other() and self.started >= self.cfg.helios_eval_prompts

    def _room(self) -> int:
        """Streams to admit this round: free slots, within an evaluated candidate's share."""
        room = self.slots - len(self.active)
        if self._evaluating_other():
            room = min(room, self.cfg.helios_eval_prompts - self.started)
        return max(0, room)

    def _back_to_judge(self) -> None:
        """After an evaluation's share, new streams go to the served model (fully loaded, as
        it evaluated) until HELIOS decides; the evaluated candidate's streams end on it.
        HELIOS counts a stream when it ends, so without this every stream that starts
        while it waits for the last ones and the PHT would go to the evaluated candidate."""
        if self.old is not None and self.old.llm is self.judge:
            self._take_back()
        else:
            judge = self.judge
            self._switch(Held(self.name, judge, judge.manifest.n_layers), False)
        self._resize()
        self.log.info("helios evaluation share started %s", logs.kv(
            candidate=self.choice.candidate, streams=self.started, back_to=self.name))

    def _drained(self, rid: str, now: float) -> None:
        """A stream of the candidate switched from ended; the last one releases it."""
        if self.old is None or rid not in self.old.ids:
            return
        self.old.ids.discard(rid)
        if not self.old.ids:
            self.log.info("helios drained %s", logs.kv(
                candidate=self.old.name, ms=round((now - self.old.since) * 1e3, 1)))
            self.old = None

    def _serve(self, choice: HeliosChoice, move: Move | None) -> None:
        """From the next round on: ``choice``'s depth, its heads and its slots."""
        if self.choice is choice:
            return
        self.decoder.set_depth(choice.depth)
        self.choice, self.started = choice, 0
        if choice.threshold is not None:
            self.threshold = choice.threshold
        # the heads scored stay the operator's, evaluation included: each costs a vocabulary
        # projection per token, and an untuned early head at a low threshold would answer
        # clients' evaluation requests badly; the exit distribution is over these heads
        self._resize()
        moved = {} if move is None else {"loaded_mb": move.loaded_bytes / 2**20,
                                         "load_ms": round(move.ms, 1)}
        self.log.info("helios decision %s", logs.kv(
            decision=choice.decision, kind=choice.kind, candidate=choice.candidate,
            depth=choice.depth,
            assessment=choice.assessment, slots=self.slots, **moved))

    def _resize(self) -> None:
        """Weight bytes, scored heads and slots of the candidate and depth held."""
        self.weight_bytes = self.decoder.weight_bytes()
        self.thresholds = self._thresholds()
        self.slots = slots_for(self.llm, self.cfg.kv_budget_mb, self.cfg.llm_slot_tokens,
                               self.decoder.depth)

    # ------------------------------------------------------------------ liveness

    async def heartbeat_loop(self, stop: asyncio.Event) -> None:
        host, pid = socket.gethostname(), os.getpid()
        while not stop.is_set():
            await self.nc.publish(subjects.HEARTBEAT, Heartbeat(
                worker=self.id, model=self.name, stage=0, stages=1, capacity=self.slots,
                pid=pid, host=host, busy=bool(self.active), queued=len(self.waiting),
                batches=self.rounds, t=time.time(), held=self.open_ids, llm=True).encode())
            try:
                await asyncio.wait_for(stop.wait(), self.cfg.heartbeat_ms / 1000.0)
            except TimeoutError:
                pass

    def shut(self) -> None:
        """Stopping: every open stream ends with an error, none silently."""
        for s in list(self.waiting) + [s for s, _ in self.active.values()]:
            self._end(s.reply, s.router, s.id, encode_error(
                s.id, errors.NO_WORKERS, "the LLM worker serving it is shutting down"),
                self._row(s.id, s.received, errors.NO_WORKERS))
        self.waiting.clear()
        self.active.clear()


async def serve_llm(cfg: Config, stop: asyncio.Event, model: str) -> None:
    log = logs.setup(f"worker.{model}", cfg.log_level)
    llm = await asyncio.to_thread(load, cfg.models_dir / model, cfg.ort_threads)
    nc = await bus.connect_as(cfg, "worker", f"offramp-llm-{model}")
    worker = LlmWorker(nc, cfg, model, llm, log)
    depth = worker.decoder.depth
    if depth < worker.decoder.n_layers:  # the layers above it hold no weights
        worker.loader = LayerLoader(llm.model, Path(llm.manifest.base["fp32"]))
        move = worker.loader.load_to(depth)
        log.info("partial load %s", logs.kv(depth=depth, freed_mb=move.freed_bytes / 2**20,
                                            ms=round(move.ms, 1)))
    await subscribe_direct(nc, subjects.llm_work(worker.id), worker.on_work)
    await subscribe_direct(nc, subjects.helios_decision(model), worker.on_choice)
    await subscribe_direct(nc, subjects.exit_config(model), worker.on_config)
    tasks: set[asyncio.Task] = set()
    supervise("heartbeat", lambda: worker.heartbeat_loop(stop), tasks, log)
    runner = supervise("decode", lambda: worker.run(stop), tasks, log)
    gc_pauses.settle(cfg.gc_freeze)  # the startup heap: out of every later collection
    log.info("llm worker ready %s", logs.kv(id=worker.id, slots=worker.slots,
                                           layers=worker.decoder.n_layers,
                                           depth=worker.decoder.depth,
                                           heads=",".join(map(str, worker.thresholds)) or "none",
                                           threshold=cfg.llm_threshold))
    mark_ready()
    await stop.wait()
    runner.cancel()
    worker.shut()
    await bus.close(nc)

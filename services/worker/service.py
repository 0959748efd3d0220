"""Split worker: runs one stage (a contiguous block range) of a prepared model.

Batches run in a thread (ONNX Runtime releases the GIL) so heartbeats and early
results keep flowing while a batch computes. In latency mode a sample whose ramp
passes its threshold gets an early result at once and keeps running, so the final
prediction is always known and telemetry always carries the feedback; a run left with
only feedback to compute gives way to a waiting request and finishes later
(``feedback_backlog``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import os
import socket
import time
import uuid
from contextlib import nullcontext
from dataclasses import dataclass
from datetime import UTC, datetime

import numpy as np
from nats.aio.client import Client
from nats.aio.msg import Msg

from schemas import errors, subjects
from schemas.errors import ServingError
from schemas.heartbeat import Heartbeat, transit_margin_s
from schemas.messages import Batch, ExitConfig, Results, decode_map, encode_error, encode_reply
from schemas.plans import StageRole
from schemas.telemetry import (
    FINAL_LOGITS_MAX_CLASSES,
    OK,
    RampFeatures,
    RequestRecord,
    RequestTelemetry,
    SampleTelemetry,
)
from services.common import bus, gc_pauses, logs, metrics
from services.common.background import run_low
from services.common.config import Config
from services.common.hotpath import flush_now, publish_all, subscribe_direct
from services.common.readiness import mark_ready
from services.common.service_loop import spawn, supervise
from services.exits.decide import ramp_outcome
from services.exits.exit_guard import ALERT_BACKOFF, ExitGuard
from services.exits.initial import initial_config, initial_ramps
from services.exits.shadow import ShadowSampler
from services.runtime.devices import device_class
from services.runtime.manifest import Manifest, manifest_kind
from services.runtime.stage import StageRuntime, active_in_order, spin_for
from services.worker.compute_mode import COMPUTE, ComputeMode, Fused
from services.worker.feature_sampling import FeatureSampler
from services.worker.feedback_backlog import FeedbackBacklog, SetAside
from services.worker.rehearsal import rehearsal_sizes, rehearse
from services.worker.silence import SilenceGuard
from services.worker.stage_exec import StageOutcome, execute, variant_run
from services.worker.telemetry import TelemetryBuffer

STORE_HEARTBEAT_S = 2.0
DRAIN_LIMIT_S = 30.0  # a stopping role waits at most this long for the work it holds


SUPERNET = "supernet"   # manifest kind of a model served by variant (services/prepare/supernet)


@dataclass(frozen=True)
class StagePlan:
    model: str
    stage: int
    stages: int
    first_block: int
    last_block: int   # exclusive

    @property
    def is_last(self) -> bool:
        return self.stage == self.stages - 1


def plan_stages(n_blocks: int, cuts: list[int]) -> list[tuple[int, int]]:
    """Block ranges for cut points: cuts [4, 9] over 12 blocks -> [(0,4), (4,9), (9,12)]."""
    bounds = [0] + sorted({c for c in cuts if 0 < c < n_blocks}) + [n_blocks]
    return list(itertools.pairwise(bounds))


def ramp_records(out: StageOutcome, n: int) -> tuple[np.ndarray, np.ndarray]:
    """The ramp top-1 labels and exit scores of every ramp evaluated so far, R x N."""
    pred = np.stack(out.ramp_pred) if out.ramp_pred else np.zeros((0, n), np.int32)
    score = np.stack(out.ramp_score) if out.ramp_score else np.zeros((0, n), np.float32)
    return pred, score


class Worker(ComputeMode):
    def __init__(self, nc: Client, cfg: Config, plan: StagePlan, manifest: Manifest,
                 runtime: StageRuntime, store, log) -> None:
        self.nc = nc
        self.cfg = cfg
        self.plan = plan
        self.manifest = manifest
        self.runtime = runtime
        self.store = store
        self.log = log
        self.id = f"{plan.model}-s{plan.stage}-{uuid.uuid4().hex[:6]}"
        self.ramps = manifest.ramps_in(plan.first_block, plan.last_block)
        self.site_order = active_in_order(manifest.ramps, [r.index for r in manifest.ramps])
        # Model inputs that blocks after this stage read: passed along with the activation.
        self.carry = manifest.model_inputs_of(plan.last_block, manifest.num_blocks)
        self.config = initial_config(plan.model, initial_ramps(manifest, cfg.ramp_budget))
        self.next_config: ExitConfig | None = None
        self.queue: asyncio.Queue[tuple[Batch, float]] = asyncio.Queue()
        self.loop = asyncio.get_running_loop()
        self.tasks: set[asyncio.Task] = set()
        self.busy = False
        self.inline = False
        self.telemetry = TelemetryBuffer()
        self.telemetry_sent = 0  # telemetry messages published (their ids count up)
        self.records_sent = 0    # request-record messages published (ids count up too)
        self.held: set[str] = set()  # stage-0 batches received and not yet released
        self.late_answers = 0    # answers past their SLO: the client got deadline_exceeded
        # after a silence its answers go through the router, which may have sent them again
        self.silence = SilenceGuard(cfg.heartbeat_ms / 1e3, transit_margin_s(cfg.heartbeat_ms))
        self.backlog = FeedbackBacklog(cfg.feedback_backlog)
        # pooled features at this stage's ramp sites for a sample of inputs (online ramp
        # refits); only the last stage knows the final answers they are labelled with
        self.sampler = FeatureSampler(cfg.ramp_feature_rate, cfg.ramp_feature_max_per_s,
                                      boost=cfg.ramp_feature_boost)
        self.want_features = plan.is_last and bool(self.ramps) and self.sampler.enabled
        self.shadow = ShadowSampler(cfg.shadow_rate)  # compute mode's feedback sample
        # latency mode's own accuracy guard: only a worker that runs the whole model knows
        # each early answer's final one before its next batch
        self.guard = (ExitGuard(ALERT_BACKOFF)
                      if cfg.exit_guard and plan.stage == 0 and plan.is_last else None)
        self.guard_caps = metrics.EXIT_GUARD_CAPS.labels(plan.model)
        self.stopping = False
        self.retiring = False  # leaving its role: routers send it nothing new
        self.pool_id = ""      # the pool worker serving this role, if any
        self.ran = [0, 0, 0.0]  # batches, samples, compute ms since the last heartbeat
        self.batches = 0
        self.stage_ms = sum(b.cost_ms for b in manifest.blocks[plan.first_block:plan.last_block]) + \
            sum(r.cost_ms for r in self.ramps)
        self.started = datetime.now(UTC).replace(tzinfo=None)
        self.device = device_class(cfg.device, threads=cfg.ort_threads)  # the profiles' key
        # compute mode: later stages fuse to the router's batch size, holding a partial
        # batch at most the plan's slack of the default SLO
        self.init_compute(cfg.max_batch, cfg.plan_slack * cfg.default_slo_ms)
        stage = str(plan.stage)  # metric children made once, not per batch
        self.stage_seconds = metrics.STAGE_SECONDS.labels(plan.model, stage)
        self.batch_sizes = metrics.BATCH_SIZE.labels(plan.model, stage)
        self.held_gauge = metrics.WORKER_INFLIGHT.labels(plan.model, stage)
        self.version_gauge = metrics.EXIT_CONFIG_VERSION.labels(plan.model)
        self.version_gauge.set(self.config.version)
        metrics.WORKER_CREDIT.labels(plan.model, stage).set(cfg.worker_credit)

    # ------------------------------------------------------------------ messages

    def on_batch(self, msg: Msg) -> None:
        try:
            batch = Batch.decode(decode_map(msg.data))
        except Exception as exc:  # noqa: BLE001 - malformed: nothing to answer, say so loudly
            self.log.error("dropping malformed batch: %r", exc)
            return
        received = time.monotonic()
        if self.plan.stage == 0 and not batch.shadow:
            self.held.add(batch.batch_id)  # listed by heartbeats until released
        if self.mode() == COMPUTE or batch.shadow:
            self.accept_compute(batch, received)
            self.held_gauge.set(self.queue.qsize() + self.busy)
            return
        if self.queue.empty() and not self.busy and self._is_inline(batch):
            self.process_inline(batch, received)  # idle and trivial: no hand-off to the run task
        else:
            self.queue.put_nowait((batch, received))
            self.held_gauge.set(self.queue.qsize() + self.busy)
            self.backlog.preempt()  # a run with only feedback left gives way

    async def on_config(self, msg: Msg) -> None:
        try:
            config = ExitConfig.decode(decode_map(msg.data))
        except Exception as exc:  # noqa: BLE001
            self.log.error("bad exit config: %r", exc)
            return
        await self.consider_config(config)

    async def catch_up_config(self) -> None:
        """Take the store's newest exit config if it is newer than what this worker holds:
        one published while the worker built its sessions, before it subscribed, would
        otherwise never reach it (the worker would serve the old config until the next)."""
        if self.store is None:
            return
        row = await asyncio.to_thread(self.store.latest_exit_config, self.plan.model)
        if row is not None and row.version > self._newest_version():
            await self.consider_config(row.message())

    async def consider_config(self, config: ExitConfig) -> None:
        """Check a new exit config, build what it needs, then queue it for the next batch."""
        if config.model != self.plan.model or config.version <= self._newest_version():
            return
        unknown = sorted((set(config.thresholds) | set(config.active) | set(config.heads))
                         - {r.index for r in self.manifest.ramps})
        why = (f"ramps {unknown} do not exist in this model" if unknown
               else await self.loop.run_in_executor(None, self.not_issued, config))
        if why:  # the last good config stays in force
            self.log.error("exit config refused %s", logs.kv(version=config.version, error=why))
            return
        # Build the sessions the new active set and heads need before it is applied, off the
        # event loop and at low priority, so no batch waits for (or competes with) session
        # creation; batches go on with the old heads meanwhile.
        try:
            await self.loop.run_in_executor(None, run_low, self.ready_config, config)
        except (ValueError, OSError) as exc:  # e.g. a head file this worker cannot read
            self.log.error("exit config refused %s", logs.kv(version=config.version,
                                                             error=repr(exc)))
            return
        self._log_tap_notes()
        if config.version > self._newest_version():
            self.next_config = config  # swapped in between batches, never mid-batch

    def not_issued(self, config: ExitConfig) -> str | None:
        """Why ``config`` is not one the store issued (None: it is, as sent). Every config
        is stored before it is broadcast, so one the store does not hold was forged or
        mangled: a version far ahead would make every later real config look old."""
        if self.store is None:
            return None
        row = next((r for r in self.store.exit_configs(config.model, config.version - 1)
                    if r.version == config.version), None)
        if row is None:
            return f"the store issued no version {config.version}"
        if ((row.mode, row.thresholds, sorted(row.active), dict(row.heads))
                != (config.mode, config.thresholds, sorted(config.active), config.heads)):
            return f"version {config.version} differs from the one the store issued"
        return None

    def warm(self, config: ExitConfig) -> None:
        """Build the sessions ``config`` needs: with feature outputs too, for the batches
        that carry sampled rows, when this worker samples features."""
        if config.mode == COMPUTE:  # no features: compute mode's feedback is shadow work
            self.runtime.warm(config.active, config.heads, False, split=True)
            return
        self.runtime.warm(config.active, config.heads, False)
        if self.want_features:
            self.runtime.warm(config.active, config.heads, True)

    def ready_config(self, config: ExitConfig) -> None:
        """Make ``config`` ready to apply while batches go on under the one in force: its
        sessions built and, for a compute-mode config that splits the stage anew (another
        active set), its new ranges rehearsed. Not in latency mode, whose refitted heads
        come every few seconds and must not wait; nor at start: a restarted worker that
        joins sooner takes more off its peers than its first batches' cold start costs
        (measured: starting at low priority with a rehearsal, a restarted EfficientNet worker
        rejoined 1-1.5 s later and its peer, alone meanwhile, missed more)."""
        self.warm(config)
        old = self.config
        if config.mode == COMPUTE and (old.mode, sorted(old.active)) != (config.mode,
                                                                          sorted(config.active)):
            self.rehearse(config)

    def rehearse(self, config: ExitConfig) -> None:
        """Run compute-mode ``config``'s split on placeholder batches
        (:mod:`services.worker.rehearsal`): a failure costs only the cold start it would
        have saved, so it is logged, not raised."""
        sizes = rehearsal_sizes(self.cfg.max_batch)
        t0 = time.perf_counter()
        try:
            rehearse(self.runtime, self.manifest, self.ramps, self.plan.first_block,
                     self.plan.last_block, self.running(config), sizes)
        except Exception as exc:  # noqa: BLE001
            self.log.warning("rehearsal failed %s", logs.kv(version=config.version,
                                                            error=repr(exc)))
            return
        self.log.info("exit config rehearsed %s", logs.kv(
            version=config.version, active=sorted(config.active), batches=sizes,
            ms=round((time.perf_counter() - t0) * 1e3, 1)))

    def note_batch(self, rows: int, ms: float) -> None:
        """Count a batch for the next heartbeat (from the compute thread: one list swap)."""
        b, r, m = self.ran
        self.ran = [b + 1, r + rows, m + ms]

    def mode(self) -> str:
        """The exit mode the next batch runs in."""
        return (self.next_config or self.config).mode

    def _newest_version(self) -> int:
        return max(self.config.version, self.next_config.version if self.next_config else -1)

    def _log_tap_notes(self) -> None:
        """Say once why a set of active ramps splits the stage instead of being tapped."""
        while self.runtime.tap_notes:
            self.log.warning("ramps not tapped %s", logs.kv(why=self.runtime.tap_notes.pop(0)))

    def _publish_threadsafe(self, messages: list[tuple[str, bytes]], flush: bool = False) -> None:
        """Publishes stay in order (an early result always precedes its final): an inline
        batch publishes at once (``flush``: write now, not when the read chunk is done);
        a batch in a thread hands them to the event loop, whose callbacks run in order."""
        if self.inline:
            self._publish(messages)
            if flush:
                flush_now(self.nc)
        else:
            self.loop.call_soon_threadsafe(self._publish, messages)

    def _publish(self, messages: list[tuple]) -> None:
        """(subject, data) or (subject, data, msg_id) messages, in order, in one write."""
        publish_all(self.nc, messages, self.log)

    # ------------------------------------------------------------------ compute

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            if self.queue.empty() and self.backlog:
                await self.process_set_aside()
                continue
            if (shadow := self.shadow_due(time.monotonic())) is not None:
                await self.process_fused(shadow)  # feedback: after real work, or when aged
                continue
            batch, received = await self.queue.get()
            if batch is None:  # a wake-up: shadow work arrived while idle
                continue
            if isinstance(batch, Fused):
                await self.process_fused(batch)
            elif self._is_inline(batch):
                self.process_inline(batch, received)
            else:
                await self.process_threaded(batch, received)

    def _is_inline(self, batch: Batch) -> bool:
        # expected to compute faster than OFFRAMP_INLINE_MS: runs on the event loop itself (a
        # thread hop costs more than the work; heartbeats wait at most this long)
        return self.stage_ms * len(batch.ids) < self.cfg.inline_ms

    def _begin(self, inline: bool) -> None:
        if self.next_config is not None:  # between batches, never mid-batch
            old, self.config, self.next_config = self.config, self.next_config, None
            if self.guard is not None:
                self.guard.clear()  # the tuner's new word supersedes the caps
            if old.heads != self.config.heads:  # sessions of heads no config uses any more,
                # dropped in a thread: it takes the lock a session build may hold
                self.loop.run_in_executor(None, self.runtime.forget_heads, self.config.heads)
            self.version_gauge.set(self.config.version)
            self.log.info("exit config applied %s", logs.kv(
                version=self.config.version,
                heads=",".join(f"{r}:{f}" for r, f in sorted(self.config.heads.items()))))
        self.busy = True
        self.inline = inline
        self.held_gauge.set(self.queue.qsize() + 1)

    def _end(self, count: bool = True) -> None:
        self.busy = False
        self.inline = False
        self.batches += count
        self.held_gauge.set(self.queue.qsize())

    def process_inline(self, batch: Batch, received: float) -> None:
        """A trivial batch on the event loop: each message goes out as soon as it is made."""
        self._begin(inline=True)
        try:
            self.compute(batch, self.config, received)
        except Exception as exc:  # noqa: BLE001 - answered as a failed batch
            self._fail(batch, exc)
        finally:
            self._end()

    async def process_threaded(self, batch: Batch, received: float) -> None:
        self._begin(inline=False)
        try:
            await self.loop.run_in_executor(None, self.compute, batch, self.config, received)
        except Exception as exc:  # noqa: BLE001 - answered as a failed batch
            self._fail(batch, exc)
        finally:
            self._end()

    async def process_fused(self, job: Fused) -> None:
        """A compute-mode batch (fused parts, or one) in a thread."""
        self._begin(inline=False)
        try:
            await self.loop.run_in_executor(None, self.compute_fused, job, self.config)
        except Exception as exc:  # noqa: BLE001 - each part answered as a failed batch
            for b, _received in job.parts:
                if not b.shadow:
                    self._fail(b, exc)
        finally:
            self._end()

    async def process_set_aside(self) -> None:
        """Re-run the oldest set-aside batch for its feedback (its answers went out)."""
        item = self.backlog.take()
        self._begin(inline=False)
        try:
            await self.loop.run_in_executor(None, self.compute, item.batch, item.config,
                                            item.received, item)
        except Exception as exc:
            self.log.error("feedback re-run failed batch=%s error=%r", item.batch.batch_id, exc,
                           exc_info=exc)
        finally:
            self._end(count=False)

    async def drain_feedback(self) -> None:
        """Stopping: finish every set-aside batch, so no feedback is lost."""
        self.stopping = True
        while self.backlog:
            await self.process_set_aside()

    def _fail(self, batch: Batch, exc: Exception) -> None:
        self.log.error("batch failed batch=%s error=%r", batch.batch_id, exc, exc_info=exc)
        code = exc.code if isinstance(exc, ServingError) else errors.INTERNAL
        self._publish([(batch.router, Results(
            batch.batch_id, self.id, self.plan.stage, batch.ids, np.zeros(0), np.zeros(0),
            np.zeros(0), None, False, self.config.version, release=self.plan.stage == 0,
            error={"code": code, "message": repr(exc)}).encode())])
        self._let_go(batch.batch_id)

    def compute(self, batch: Batch, config: ExitConfig, received: float,
                rerun: SetAside | None = None) -> None:
        """Run this stage on one batch (called in a worker thread) and publish what it yields;
        ``rerun``: a set-aside batch, run again for its feedback only."""
        exit_at = self.exit_rows_of(batch, rerun)
        # rows whose ramp features go to the tuner: a batch without any runs without the
        # feature outputs (they cost about 6 % of EfficientNet's stage)
        served = config
        config, variant = variant_run(self.runtime, self.site_order, batch.variant, config)
        # a capped batch's answers are not the exit config's: they feed neither the
        # monitor's agreement (the tuner would chase an accuracy the router chose) nor refits
        capped = config is not served
        sampled = (self.sampler.rows(batch.batch_id, len(batch.ids), time.monotonic())
                   if self.want_features and not capped
                   else np.zeros(0, np.int64))
        out = self.run_stage(batch, self.guarded(config, capped), received, exit_at, rerun,
                             features=len(sampled) > 0, variant=variant)
        if rerun is None:  # a re-run for feedback is the same batch again: metered once
            self.batch_sizes.observe(len(batch.ids))
            if self.want_features and not capped:  # set aside: every row answered early
                self.sampler.exited(len(batch.ids), len(batch.ids) if out is None
                                    else int((out.exit_at >= 0).sum()))
        if out is None:  # gave way to a waiting request: set aside, its feedback comes later
            return
        if rerun is not None:
            self.backlog.rerun += 1
        else:
            self.stage_seconds.observe(out.ms / 1e3)
            self.note_batch(len(batch.ids), out.ms)
        stage_ms = batch.stage_ms + [out.ms]
        if not self.plan.is_last:
            self.forward_to_next_stage(batch, config, received, out, stage_ms)
            return
        labels, scores = ramp_outcome(out.output, config.score)
        if rerun is None:  # answer first: the telemetry below is bookkeeping
            self.answer_finals(batch, config, received, out, labels, scores)
        if not capped:  # the ramp records feed the exit guard and the telemetry
            records = ramp_records(out, len(batch.ids))
            self.guard_observe(config, out, labels, records)
            self.record_telemetry(batch, config, out, labels, scores, stage_ms, records)
        if out.features:
            self.record_features(batch, config, out, labels, sampled)

    def guarded(self, config: ExitConfig, capped: bool) -> ExitConfig:
        """The config a latency-mode batch runs under: the exit guard's caps applied."""
        if self.guard is None or capped or not self.guard.caps:
            return config
        return dataclasses.replace(config, thresholds=self.guard.thresholds(config.thresholds))

    def guard_observe(self, config: ExitConfig, out: StageOutcome, labels: np.ndarray,
                      records: tuple[np.ndarray, np.ndarray]) -> None:
        """Cap the ramps that answered this run wrongly (``records``: ``ramp_records(out)``;
        a run of an older config, e.g. a set-aside re-run, says nothing about the thresholds
        in force)."""
        if self.guard is None or config.version != self.config.version:
            return
        new = self.guard.observe(out.ramp_ids, *records, out.exit_at, labels)
        if new:
            self.guard_caps.inc(len(new))
            self.log.info("exit guard capped %s", logs.kv(
                version=config.version, caps=",".join(f"{r}:{c:.4g}" for r, c in new.items())))

    @staticmethod
    def exit_rows_of(batch: Batch, rerun: SetAside | None) -> np.ndarray:
        """Per sample, the ramp whose early result was already sent (-1: none)."""
        if rerun is not None:
            return rerun.exit_at.copy()
        n = len(batch.ids)
        return (np.full(n, -1, dtype=np.int32) if batch.exit_at is None
                else np.array(batch.exit_at, dtype=np.int32))

    def model_inputs_of(self, batch: Batch) -> dict[str, np.ndarray]:
        """The model inputs this stage's blocks (and later stages') may read."""
        return batch.inputs if self.plan.stage == 0 else batch.carry

    def run_stage(self, batch: Batch, config: ExitConfig, received: float, exit_at: np.ndarray,
                  rerun: SetAside | None, features: bool = False,
                  variant: str | None = None) -> StageOutcome | None:
        """This stage's blocks and ramps, each early result sent as its ramp passes
        (``features``: and every site's pooled features); None when the run gave way to a waiting request (it is set aside for a feedback re-run)."""
        # only the last stage knows the rest is feedback (earlier ones feed later stages);
        # an inline batch is too short to be worth cutting
        may_cut = (self.plan.is_last and self.backlog.enabled and not self.stopping
                   and not self.inline)
        first = self.plan.stage == 0
        # no RunOptions on the request path unless this run may give way
        with self.runtime.interruptible() if may_cut else nullcontext() as run_options:
            def only_feedback_left() -> None:
                self.backlog.only_feedback_left(run_options, rerun is not None)
                if not self.queue.empty():  # the loop thread checks the other way round
                    self.backlog.preempt()

            def on_early(ramp: int, idx: np.ndarray, labels, scores, logits) -> None:
                self._answer(batch, config, received, idx, labels, scores,
                             np.full(len(idx), ramp, dtype=np.int32), logits, early=True)
                if may_cut and (exit_at >= 0).all():
                    only_feedback_left()

            if may_cut and rerun is not None:
                only_feedback_left()
            try:
                return execute(self.runtime, self.ramps, self.plan.first_block,
                               self.plan.last_block, batch.inputs if first else batch.inputs["x"],
                               exit_at, config, on_early, batch.ramp_ids,
                               None if batch.ramp_pred is None else list(batch.ramp_pred),
                               None if batch.ramp_score is None else list(batch.ramp_score),
                               self.model_inputs_of(batch), features=features,
                               variant=variant)
            except Exception:
                if run_options is None or not run_options.terminate:
                    raise
                # stopped for a waiting request: every row has its answer; feedback later
                self.backlog.set_aside(SetAside(batch, config, received, exit_at.copy()),
                                       rerun is not None)
                if rerun is None and first:
                    self._release(batch, config)
                return None
            finally:
                self.backlog.run_over()

    def answer_finals(self, batch: Batch, config: ExitConfig, received: float,
                      out: StageOutcome, labels: np.ndarray, scores: np.ndarray) -> None:
        """Final-layer results for the samples that got no early one."""
        rest = np.flatnonzero(out.exit_at < 0)
        logits = out.output
        if len(rest) < len(batch.ids):
            labels, scores, logits = labels[rest], scores[rest], logits[rest]
        self._answer(batch, config, received, rest, labels, scores,
                     np.full(len(rest), -1, dtype=np.int32), logits, early=False,
                     release=self.plan.stage == 0)

    def forward_to_next_stage(self, batch: Batch, config: ExitConfig, received: float,
                              out: StageOutcome, stage_ms: list[float]) -> None:
        """The activation, the ramp records so far and the model inputs later blocks read
        go to the next stage (any of its workers)."""
        ramp_pred, ramp_score = ramp_records(out, len(batch.ids))
        waited = (time.monotonic() - received) * 1e3
        model_inputs = self.model_inputs_of(batch)
        nxt = Batch(batch.batch_id, batch.model, self.plan.stage + 1, batch.router, batch.ids,
                    config.version, {"x": np.ascontiguousarray(out.output)}, out.ramp_ids,
                    ramp_pred, ramp_score, out.exit_at, stage_ms,
                    {k: model_inputs[k] for k in self.carry}, batch.replies,
                    [a + waited for a in batch.ages_ms], batch.slos_ms,
                    variant=batch.variant).encode()
        self._publish_threadsafe([(self.next_stage_subject(), self.checked_size(nxt))])
        if self.plan.stage == 0:
            self._release(batch, config)

    def next_stage_subject(self) -> str:
        """Where the next stage listens: stages are keyed by their first block, so every
        layout (and every plan version) that cuts there shares the subject."""
        return subjects.stage(self.plan.model, self.plan.last_block)

    def checked_size(self, data: bytes) -> bytes:
        """``data`` when the bus can carry it, else the error that says what to change."""
        if len(data) > self.nc.max_payload:
            raise ServingError(errors.PAYLOAD_TOO_LARGE,
                               f"activations after block {self.plan.last_block - 1} are "
                               f"{len(data)} bytes, over the NATS max_payload of "
                               f"{self.nc.max_payload}: cut the model later or use smaller "
                               f"batches")
        return data

    def record_telemetry(self, batch: Batch, config: ExitConfig, out: StageOutcome,
                         labels: np.ndarray, scores: np.ndarray, stage_ms: list[float],
                         records: tuple[np.ndarray, np.ndarray]) -> None:
        """This batch's sample telemetry (``records``: ``ramp_records(out)``), handed to the
        coalescing buffer on the event loop."""
        n = len(batch.ids)
        ramp_pred, ramp_score = records
        part = SampleTelemetry(
            model=self.plan.model, worker=self.id, batch_id=batch.batch_id,
            batch_ids=[batch.batch_id], batch_sizes=[n], config_version=config.version,
            mode=config.mode, score=config.score, thresholds=dict(config.thresholds),
            active=list(config.active), ids=batch.ids, ramp_ids=out.ramp_ids,
            ramp_pred=ramp_pred, ramp_score=ramp_score, exit_at=out.exit_at, final_pred=labels,
            final_score=scores, batch_size=n, stage_ms=[stage_ms], t=time.time())
        if self.inline:
            self._add_telemetry(part)
        else:
            self.loop.call_soon_threadsafe(self._add_telemetry, part)

    def record_features(self, batch: Batch, config: ExitConfig, out: StageOutcome,
                        labels: np.ndarray, rows: np.ndarray) -> None:
        """Publish the sampled rows' pooled features at every ramp site of this stage with
        the final answer (``RampFeatures``): after the answers, encoded on this thread."""
        ramps = sorted(out.features)
        logits = out.output
        small = logits.ndim == 2 and logits.shape[1] <= FINAL_LOGITS_MAX_CLASSES
        msg = RampFeatures(
            model=self.plan.model, worker=self.id, config_version=config.version,
            ids=[batch.ids[i] for i in rows], ramp_ids=ramps,
            features=[np.ascontiguousarray(out.features[r][rows], np.float32) for r in ramps],
            final_pred=np.asarray(labels, np.int32)[rows],
            final_logits=np.ascontiguousarray(logits[rows], np.float32) if small else None,
            t=time.time())
        self._publish_threadsafe([(subjects.ramp_features(self.plan.model), msg.encode())])

    def _add_telemetry(self, part: SampleTelemetry) -> None:
        """Coalesce telemetry (services/worker/telemetry.py); on the event loop, after the
        results it describes."""
        self._publish([self._telemetry_message(msg)
                       for msg in self.telemetry.add(part, time.monotonic())])

    def _telemetry_message(self, msg: SampleTelemetry) -> tuple[str, bytes, str]:
        """Sample telemetry with an id the monitor stores it under (one row set per id,
        whatever the stream's sequence numbers do)."""
        self.telemetry_sent += 1
        return (subjects.telemetry_samples(self.plan.model), msg.encode(),
                f"{self.id}:{self.telemetry_sent}")

    async def telemetry_loop(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await asyncio.sleep(self.telemetry.max_age_s / 2)
            if (msg := self.telemetry.due(time.monotonic())) is not None:
                self._publish([self._telemetry_message(msg)])

    def _answer(self, batch: Batch, config: ExitConfig, received: float, idx: np.ndarray,
                labels: np.ndarray, scores: np.ndarray, exits: np.ndarray, logits: np.ndarray,
                early: bool, release: bool = False) -> None:
        """Results for samples ``idx``: straight to each client when the router passed reply
        subjects (saves a hop), and always to the router, which records them (and replies
        itself only for batches without reply subjects).

        Rows, answers and the router's Results leave in one write, in that order: a worker
        killed at any moment has either sent all three or none, so a client never holds an
        answer without its row. Whether to answer directly is settled on the event loop as
        the write goes out: after a silence the router may have sent the batch again
        (``silence.SilenceGuard``), so the answers go through the router instead."""
        answer = (batch, config, received, idx, labels, scores, exits, logits, early, release)
        direct = len(batch.replies) == len(batch.ids) and len(batch.ages_ms) == len(batch.ids)
        if not direct:
            self._publish_threadsafe(self._answer_messages(*answer, direct=False))
        elif self.inline:  # on the loop already; written now, not when the read chunk is done
            self._publish_answer(answer, self._answer_messages(*answer, direct=True), True)
        else:
            self.loop.call_soon_threadsafe(self._publish_answer, answer,
                                           self._answer_messages(*answer, direct=True), False)
        if release:
            self._let_go(batch.batch_id)

    def _publish_answer(self, answer: tuple, direct: list[tuple], flush: bool) -> None:
        """On the event loop: the direct answers, or, when the router may have given this
        batch to another worker, the same answers for the router to send."""
        if not self.silence.may_answer_directly(answer[2], time.monotonic()):
            direct = self._answer_messages(*answer, direct=False)
        self._publish(direct)
        if flush:
            flush_now(self.nc)

    def _answer_messages(self, batch: Batch, config: ExitConfig, received: float,
                         idx: np.ndarray, labels: np.ndarray, scores: np.ndarray,
                         exits: np.ndarray, logits: np.ndarray, early: bool, release: bool,
                         direct: bool) -> list[tuple]:
        """The messages of ``_answer``: with ``direct``, the rows, the client answers (an
        error for an answer past its SLO) and the router's note; else the router's Results
        with the logits, which it answers from."""
        ids = [batch.ids[i] for i in idx]
        late = np.zeros(len(ids), bool)
        messages: list[tuple] = []
        if direct:
            waited = (time.monotonic() - received) * 1e3
            ages = [batch.ages_ms[i] + waited for i in idx]
            if len(batch.slos_ms) == len(batch.ids):  # past its SLO: the client gets that
                late = np.array([a >= batch.slos_ms[i] for a, i in zip(ages, idx)], bool)
            messages.append(self._records_message(batch, ids, ages, late, labels, exits, early,
                                                  config.version))
            messages += [(batch.replies[i], encode_error(
                ids[k], errors.DEADLINE_EXCEEDED, f"answered {ages[k]:.0f} ms after "
                f"admission, past its SLO of {batch.slos_ms[i]:.0f} ms") if late[k] else
                encode_reply(ids[k], batch.model, {"logits": logits[k]}, int(labels[k]),
                             float(scores[k]), int(exits[k]), early, ages[k], config.version,
                             batch.variant))
                for k, i in enumerate(idx)]
        if late.any():
            self.late_answers += int(late.sum())
            ok = np.flatnonzero(~late)
            ids, labels, scores, exits = ([ids[k] for k in ok], labels[ok], scores[ok],
                                          exits[ok])
            messages.append((batch.router, Results(  # recorded, not answered again
                batch.batch_id, self.id, self.plan.stage,
                [batch.ids[i] for i in np.asarray(idx)[late]], labels[:0], scores[:0],
                exits[:0], None, early, config.version, direct=True,
                error={"code": errors.DEADLINE_EXCEEDED, "message": "answered after its SLO"}
            ).encode()))
        if ids or release:
            messages.append((batch.router, Results(
                batch.batch_id, self.id, self.plan.stage, ids, labels, scores, exits,
                None if direct else logits, early, config.version, release=release,
                direct=direct, variant=batch.variant).encode()))
        return messages

    def _records_message(self, batch: Batch, ids: list[str], ages: list[float],
                         late: np.ndarray, labels: np.ndarray, exits: np.ndarray, early: bool,
                         version: int) -> tuple[str, bytes, str]:
        """Request telemetry for answers this worker sends itself (the router records only
        the answers it sends), stored under an id of its own like sample telemetry."""
        now = time.time()
        records = [RequestRecord(rid, now - age / 1e3, age, errors.DEADLINE_EXCEEDED)
                   if late[k] else RequestRecord(rid, now - age / 1e3, age, OK,
                                                 int(exits[k]), early, int(labels[k]), version,
                                                 batch.variant)
                   for k, (rid, age) in enumerate(zip(ids, ages, strict=True))]
        self.records_sent += 1
        return (subjects.telemetry_requests(batch.model),
                RequestTelemetry(batch.model, self.id, records).encode(),
                f"{self.id}:r{self.records_sent}")

    def _release(self, batch: Batch, config: ExitConfig) -> None:
        empty = np.zeros(0, dtype=np.int32)
        self._publish_threadsafe([(batch.router, Results(
            batch.batch_id, self.id, self.plan.stage, [], empty, empty.astype(np.float32), empty,
            None, False, config.version, release=True).encode())])
        self._let_go(batch.batch_id)

    def _let_go(self, batch_id: str) -> None:
        """Heartbeats stop listing a released batch only once its release is on the bus
        (loop callbacks run in order): a router never sees it unlisted and unreleased."""
        if self.inline:
            self.held.discard(batch_id)
        else:
            self.loop.call_soon_threadsafe(self.held.discard, batch_id)

    # ------------------------------------------------------------------ liveness

    async def heartbeat_loop(self, stop: asyncio.Event) -> None:
        last_store = 0.0
        host, pid = socket.gethostname(), os.getpid()
        while not stop.is_set():
            now = time.monotonic()
            last_beat = self.silence.last_beat
            if self.silence.beat(now):  # a router may have taken this worker for lost
                self.log.warning("heartbeat late: answers of earlier batches go through the "
                                 "router %s", logs.kv(
                                     gap_ms=round((now - last_beat) * 1e3), busy=self.busy,
                                     queued=self.queue.qsize(),
                                     config_version=self.config.version))
            ran, self.ran = self.ran, [0, 0, 0.0]  # this beat reports these batches
            await self.nc.publish(subjects.HEARTBEAT, Heartbeat(
                worker=self.id, model=self.plan.model, stage=self.plan.stage,
                stages=self.plan.stages, capacity=0 if self.retiring else self.cfg.worker_credit,
                first_block=self.plan.first_block, last_block=self.plan.last_block, pid=pid,
                host=host, busy=self.busy, queued=self.queue.qsize(), batches=self.batches,
                set_aside=len(self.backlog), gave_way=self.backlog.cut, late=self.late_answers,
                config_version=self.config.version, t=time.time(),
                held=tuple(self.held.copy()), pool=self.pool_id, ran=ran[0],
                ran_rows=ran[1], ran_ms=ran[2]).encode())
            if self.store is not None and now - last_store > STORE_HEARTBEAT_S:
                last_store = now
                spawn(asyncio.to_thread(self._store_heartbeat, host, pid, "up"), self.tasks, self.log)
            try:
                await asyncio.wait_for(stop.wait(), self.cfg.heartbeat_ms / 1000.0)
            except TimeoutError:
                pass

    def _store_heartbeat(self, host: str, pid: int, status: str) -> None:
        self.store.upsert_worker(self.id, self.plan.model, self.plan.stage, self.plan.first_block,
                                 self.plan.last_block, host, pid, status,
                                 datetime.now(UTC).replace(tzinfo=None), self.device)


@dataclass
class Role:
    """One stage a worker process serves: the worker, its bus subscriptions, its loops."""

    worker: Worker
    subscriptions: list
    runner: asyncio.Task
    stop: asyncio.Event


def stage_runtime(model_dir, manifest: Manifest, plan: StagePlan, cfg: Config, spin: bool):
    """The runtime of ``plan``'s blocks: ONNX Runtime, or torch for a supernet model."""
    if manifest.kind == SUPERNET:
        from services.runtime.supernet import SupernetRuntime  # torch: only for supernets

        # torch on OFFRAMP_ORT_THREADS threads, at least one: what its profile measured
        return SupernetRuntime(model_dir, manifest, plan.first_block, plan.last_block,
                               threads=max(1, cfg.ort_threads))
    return StageRuntime(model_dir, manifest, plan.first_block, plan.last_block,
                        device=cfg.device, threads=cfg.ort_threads, spin=spin)


async def start_role(nc: Client, cfg: Config, store, log, plan: StagePlan,
                     stage_role: StageRole | None = None, pool_id: str = "") -> Role:
    """Load ``plan``'s stage and start serving it on ``nc`` (``stage_role``: as pool worker
    ``pool_id``'s role in a deployment plan, with that stage's batch, hold and ramps)."""
    model_dir = cfg.models_dir / plan.model
    manifest = await asyncio.to_thread(Manifest.load, model_dir)
    spin = spin_for(cfg.ort_spin, None)  # auto: off unless the supervisor resolved it on
    runtime = await asyncio.to_thread(lambda: stage_runtime(model_dir, manifest, plan, cfg,
                                                            spin))
    worker = Worker(nc, cfg, plan, manifest, runtime, store, log)
    worker.pool_id = pool_id
    if stage_role is not None:
        worker.take_plan_role(stage_role)
    row = await asyncio.to_thread(store.latest_exit_config, plan.model) if store else None
    if row is not None:
        worker.config = row.message()
        worker.version_gauge.set(row.version)
    await asyncio.to_thread(runtime.preload_taps)
    await asyncio.to_thread(worker.warm, worker.config)
    worker._log_tap_notes()
    subs = [await nc.subscribe(subjects.exit_config(plan.model), cb=worker.on_config)]
    await worker.catch_up_config()
    if plan.stage == 0:
        subs.append(await subscribe_direct(nc, subjects.work(worker.id), worker.on_batch))
    else:
        subs.append(await subscribe_direct(
            nc, subjects.stage(plan.model, plan.first_block), worker.on_batch,
            queue=subjects.stage_queue(plan.model, plan.first_block)))
    stop = asyncio.Event()
    supervise("heartbeat", lambda: worker.heartbeat_loop(stop), worker.tasks, log)
    supervise("telemetry", lambda: worker.telemetry_loop(stop), worker.tasks, log)
    supervise("fusion", lambda: worker.fusion_loop(stop), worker.tasks, log)
    runner = supervise("batches", lambda: worker.run(stop), worker.tasks, log)
    log.info("worker ready %s", logs.kv(id=worker.id, blocks=f"{plan.first_block}:{plan.last_block}",
                                       ramps=[r.index for r in worker.ramps],
                                       providers=",".join(runtime.providers),
                                       ort_spin="on" if spin else "off",
                                       config_version=worker.config.version))
    mark_ready()
    return Role(worker, subs, runner, stop)


async def finish_role(role: Role, log, drain_s: float = 0.0) -> None:
    """Stop serving a role without losing work: with ``drain_s``, first tell the routers it
    takes no more batches (credit 0) and keep serving its subjects that long (work sent
    before the plan changed still arrives); then leave its subjects, finish what it holds,
    and send what it measured."""
    worker = role.worker
    if drain_s > 0:
        worker.retiring = True
        await asyncio.sleep(drain_s)
    for sub in role.subscriptions:
        try:
            await sub.unsubscribe()
        except Exception as exc:  # noqa: BLE001 - a closed connection: nothing arrives anyway
            log.warning("unsubscribe failed: %r", exc)
    for held in worker.hand_back_fused():  # partial batches waiting for company: run now
        worker.queue.put_nowait((Fused([held]), held[1]))
    deadline = time.monotonic() + DRAIN_LIMIT_S
    while (not role.runner.done() and (not worker.queue.empty() or worker.busy)
           and time.monotonic() < deadline):
        await asyncio.sleep(0.01)
    role.stop.set()
    worker.stopping = True
    role.runner.cancel()
    await worker.drain_feedback()
    if worker.backlog.cut:
        log.info("feedback runs set aside for waiting requests %s",
                 logs.kv(cut=worker.backlog.cut, rerun=worker.backlog.rerun))
    if worker.telemetry.parts:  # nothing measured is dropped at shutdown
        subject, data, msg_id = worker._telemetry_message(worker.telemetry.take())
        await worker.nc.publish(subject, data, headers={"Nats-Msg-Id": msg_id})
    if worker.store is not None:
        await asyncio.to_thread(worker._store_heartbeat, socket.gethostname(), os.getpid(),
                                "stopped")


async def serve(cfg: Config, stop: asyncio.Event, model: str, stage: int, cuts: list[int]) -> None:
    """A worker of a fixed layout: stage ``stage`` of ``model`` cut at ``cuts``."""
    from services.store.repository import Store

    if manifest_kind(cfg.models_dir / model) == "llm":  # generation: no stages, torch
        from services.worker.llm_service import serve_llm

        return await serve_llm(cfg, stop, model)
    log = logs.setup(f"worker.{model}.{stage}", cfg.log_level)
    manifest = Manifest.load(cfg.models_dir / model)
    ranges = plan_stages(len(manifest.blocks), cuts)
    if not 0 <= stage < len(ranges):
        raise SystemExit(f"stage {stage} does not exist: cuts {cuts} give {len(ranges)} stages")
    first, last = ranges[stage]
    store = Store(cfg.database_url)
    nc = await bus.connect_as(cfg, "worker", f"offramp-worker-{model}-{stage}")
    role = await start_role(nc, cfg, store, log, StagePlan(model, stage, len(ranges), first, last))
    # once, here: a pool worker starts roles while it serves, and a freeze there would pin
    # each role's objects for good (the pool settles when it starts)
    gc_pauses.settle(cfg.gc_freeze)  # the startup heap: out of every later collection
    await stop.wait()
    await finish_role(role, log)
    await bus.close(nc)
    store.close()

"""Compute mode (E3) of the split worker: exited samples leave the batch; survivors go on
to the next stage, whose workers fuse the partial batches of every upstream replica back
up to the stage's target batch (``fusion.FusionBuffer``), holding them only as long as the
earliest deadline among them allows.

Feedback: the samples the shadow sampler selects (``OFFRAMP_SHADOW_RATE`` of the requests,
by a seeded hash of the id) keep every record. Those that exit are answered at once and
run on to the final layer as **shadow** batches, which a worker serves when no real work
waits, or once the oldest has waited ``SHADOW_MAX_WAIT_S``: feedback starved under load
would lose exactly the exited rows of the sample while its other rows, on the real path,
still report, and the tuner would see an easier stream than the one served. Waiting shadow
batches of one config run fused. At most ``SHADOW_QUEUE`` are held; the oldest is dropped
beyond that, counted in the log. The last stage's telemetry reports the selected samples
only: an unbiased sample of the stream whose final answers are known, which is what the
monitor's agreement and the tuner rest on in compute mode.

A mixin of :class:`services.worker.service.Worker`, which owns the bus, the runtime and
the answering; the parts here run in the worker's compute thread or on its event loop as
their docstrings say.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

import numpy as np

from schemas.messages import Batch, ExitConfig
from schemas.plans import StageRole
from schemas.telemetry import SampleTelemetry
from services.exits.decide import ramp_outcome
from services.worker.fusion import FusionBuffer, Part
from services.worker.stage_exec import ComputeOutcome, execute_compute, variant_run

COMPUTE = "compute"
SHADOW_QUEUE = 64  # shadow batches a worker holds; feedback only, so the oldest may go
SHADOW_MAX_WAIT_S = 1.0  # a shadow batch this old runs before the next real batch
IDLE_WAKE_S = 0.5  # the fusion loop's nap when nothing is held


@dataclass(slots=True)
class Fused:
    """Upstream batches run as one: ``(batch, received)`` each, in fusion order."""

    parts: list[tuple[Batch, float]]


def deadline_of(batch: Batch, received: float, default_slo_ms: float) -> float:
    """The earliest deadline among the batch's requests, on the receiver's clock."""
    if batch.slos_ms and len(batch.ages_ms) == len(batch.slos_ms):
        left = min(s - a for s, a in zip(batch.slos_ms, batch.ages_ms, strict=True))
    else:
        left = default_slo_ms
    return received + left / 1e3


def fuse(batches: list[Batch]) -> tuple[Batch, np.ndarray]:
    """One batch holding every row of ``batches`` (same stage and ramps so far), and each
    part's first row in it. Identity fields are the first part's: answers and forwards go
    out per part, never from the fused batch."""
    first = batches[0]
    if len(batches) == 1:
        return first, np.zeros(1, np.int64)
    starts = np.cumsum([0] + [len(b.ids) for b in batches[:-1]]).astype(np.int64)

    def cat(values: list[Any]) -> Any:
        return None if values[0] is None else np.concatenate(values, axis=-1)

    return Batch(first.batch_id, first.model, first.stage, first.router,
                 [i for b in batches for i in b.ids], first.config_version,
                 {k: np.concatenate([b.inputs[k] for b in batches]) for k in first.inputs},
                 list(first.ramp_ids), cat([b.ramp_pred for b in batches]),
                 cat([b.ramp_score for b in batches]), cat([b.exit_at for b in batches]),
                 list(first.stage_ms),
                 {k: np.concatenate([b.carry[k] for b in batches]) for k in first.carry},
                 [r for b in batches for r in b.replies],
                 [a for b in batches for a in b.ages_ms],
                 [s for b in batches for s in b.slos_ms], first.shadow, first.variant), starts


def split_rows(batch: Batch, k: int) -> tuple[Batch, Batch]:
    """``batch``'s first ``k`` rows and the rest, as two batches of the same stage (fusion
    cuts a part at the target batch; every per-row field is cut, the rest is shared)."""
    def cut(a: Any, sl: slice, axis: int) -> Any:
        if a is None:
            return None
        a = np.asarray(a)
        return np.ascontiguousarray(a[sl] if axis == 0 else a[..., sl])

    def half(sl: slice) -> Batch:
        return dataclasses.replace(
            batch, ids=batch.ids[sl], inputs={n: cut(v, sl, 0) for n, v in batch.inputs.items()},
            ramp_pred=cut(batch.ramp_pred, sl, -1), ramp_score=cut(batch.ramp_score, sl, -1),
            exit_at=cut(batch.exit_at, sl, -1),
            carry={n: cut(v, sl, 0) for n, v in batch.carry.items()},
            replies=batch.replies[sl], ages_ms=batch.ages_ms[sl], slos_ms=batch.slos_ms[sl])

    return half(slice(0, k)), half(slice(k, None))


def split_part(payload: tuple[Batch, float], k: int) -> tuple[tuple[Batch, float],
                                                                tuple[Batch, float]]:
    head, rest = split_rows(payload[0], k)
    return (head, payload[1]), (rest, payload[1])


def fusable(a: Batch, b: Batch) -> bool:
    return (a.ramp_ids == b.ramp_ids and a.config_version == b.config_version
            and set(a.inputs) == set(b.inputs) and set(a.carry) == set(b.carry)
            and bool(a.replies) == bool(b.replies) and bool(a.slos_ms) == bool(b.slos_ms)
            and a.variant == b.variant)


def by_part(idx: np.ndarray, starts: np.ndarray, sizes: list[int]) -> list[tuple[int, np.ndarray, np.ndarray]]:
    """Positions ``idx`` of a fused batch as (part, positions in the part, positions in idx)."""
    out = []
    for k, (start, size) in enumerate(zip(starts, sizes, strict=True)):
        sel = np.flatnonzero((idx >= start) & (idx < start + size))
        if sel.size:
            out.append((k, idx[sel] - start, sel))
    return out


def sub_batch(batch: Batch, rows: np.ndarray, output: np.ndarray, stage: int, version: int,
              carry: dict[str, np.ndarray], stage_ms: list[float], waited_ms: float,
              shadow: bool) -> Batch:
    """Rows ``rows`` of ``batch`` for the next stage; ``output`` holds their activations."""
    pick = list(rows)

    def cols(a: Any) -> Any:
        return None if a is None else np.ascontiguousarray(np.asarray(a)[..., rows])

    return Batch(batch.batch_id, batch.model, stage, batch.router, [batch.ids[i] for i in pick],
                 version, {"x": np.ascontiguousarray(output)}, list(batch.ramp_ids),
                 cols(batch.ramp_pred), cols(batch.ramp_score), cols(batch.exit_at), stage_ms,
                 {k: v[rows] for k, v in carry.items()},
                 [batch.replies[i] for i in pick] if batch.replies else [],
                 [batch.ages_ms[i] + waited_ms for i in pick] if batch.ages_ms else [],
                 [batch.slos_ms[i] for i in pick] if batch.slos_ms else [], shadow,
                 batch.variant)


class ComputeMode:
    """Compute-mode methods of the worker (see the module docstring)."""

    # supplied by Worker
    cfg: Any
    plan: Any
    queue: asyncio.Queue
    busy: bool

    def init_compute(self, target: int, hold_ms: float) -> None:
        self.fusion: FusionBuffer[tuple[Batch, float]] = FusionBuffer(
            target, self.stage_ms * target, hold_ms, split=split_part)
        self.fusion_wake = asyncio.Event()
        self.shadow_work: deque[tuple[Batch, float]] = deque()
        self.shadow_dropped = 0
        self.plan_ramps: frozenset[int] | None = None  # None: every active ramp runs

    def take_plan_role(self, role: StageRole) -> None:
        """A deployment plan's stage: its fused batch, its hold, the ramps it runs."""
        self.fusion.target = role.batch
        self.fusion.service_ms = self.stage_ms * role.batch
        self.fusion.max_hold_ms = role.hold_ms
        self.plan_ramps = frozenset(role.active_ramps)

    def running(self, config: ExitConfig) -> ExitConfig:
        """``config`` as this stage runs it: under a plan, only the ramps the plan runs
        here may exit (the exit wrapper switched the others off)."""
        if self.plan_ramps is None:
            return config
        return dataclasses.replace(config, active=[r for r in config.active
                                                   if r in self.plan_ramps])

    # ------------------------------------------------------------- event loop

    def accept_compute(self, batch: Batch, received: float) -> None:
        """A compute-mode batch arrived: shadow work waits for idle time, a later stage's
        partial batch waits for fusion, a router's batch runs as it is."""
        if batch.shadow:
            if len(self.shadow_work) >= SHADOW_QUEUE:
                self.shadow_work.popleft()
                self.shadow_dropped += 1
                if self.shadow_dropped in (1, 10, 100) or self.shadow_dropped % 1000 == 0:
                    self.log.warning("shadow work dropped for real work %s",
                                     {"dropped": self.shadow_dropped})
            self.shadow_work.append((batch, received))
            if self.queue.empty() and not self.busy:
                self.queue.put_nowait((None, received))  # wakes the run loop
            return
        if self.plan.stage == 0:
            self.queue.put_nowait((Fused([(batch, received)]), received))
            return
        self.fusion.add(Part(len(batch.ids),
                             deadline_of(batch, received, self.cfg.default_slo_ms), received,
                             (batch, received)))
        self.release_fused(time.monotonic())
        self.fusion_wake.set()

    def shadow_due(self, now: float) -> Fused | None:
        """Shadow work to run now: when no real work waits, or the oldest shadow batch has
        waited ``SHADOW_MAX_WAIT_S``; the waiting batches fusable with the oldest, up to the
        stage's target batch, run as one."""
        if not self.shadow_work:
            return None
        if not self.queue.empty() and now - self.shadow_work[0][1] < SHADOW_MAX_WAIT_S:
            return None
        parts = [self.shadow_work.popleft()]
        rows = len(parts[0][0].ids)
        while (self.shadow_work and fusable(parts[0][0], self.shadow_work[0][0])
               and rows + len(self.shadow_work[0][0].ids) <= self.fusion.target):
            rows += len(self.shadow_work[0][0].ids)
            parts.append(self.shadow_work.popleft())
        return Fused(parts)

    def release_fused(self, now: float) -> None:
        """Queue every fused batch that is due (full, or its deadline or hold has come)."""
        while parts := self.fusion.take(now):
            groups: list[list[tuple[Batch, float]]] = []
            for p in parts:  # parts fuse only with parts sent under the same config
                home = next((g for g in groups if fusable(g[0][0], p.payload[0])), None)
                if home is None:
                    groups.append([p.payload])
                else:
                    home.append(p.payload)
            for g in groups:
                self.queue.put_nowait((Fused(g), min(r for _b, r in g)))

    async def fusion_loop(self, stop: asyncio.Event) -> None:
        """Flush held partial batches when their time comes."""
        while not stop.is_set():
            due = self.fusion.flush_at()
            wait = IDLE_WAKE_S if due is None else max(0.0, due - time.monotonic())
            self.fusion_wake.clear()
            try:
                await asyncio.wait_for(self.fusion_wake.wait(), wait)
            except TimeoutError:
                pass
            self.release_fused(time.monotonic())

    def hand_back_fused(self) -> list[tuple[Batch, float]]:
        """Stopping or changing role: whatever is held, to run before leaving."""
        return [p.payload for p in self.fusion.drain()]

    # ------------------------------------------------------------- compute thread

    def compute_fused(self, job: Fused, config: ExitConfig) -> None:
        """Run a fused batch through this stage in compute mode and send what it yields:
        early answers per part as their ramps pass, survivors (and shadow rows, apart) to
        the next stage per part, final answers and telemetry at the last stage."""
        batches = [b for b, _ in job.parts]
        batch, starts = fuse(batches)
        served = self.running(config)
        config, _variant = variant_run(self.runtime, self.site_order, batch.variant, served)
        sizes = [len(b.ids) for b in batches]
        n = len(batch.ids)
        exit_at = (np.full(n, -1, np.int32) if batch.exit_at is None
                   else np.array(batch.exit_at, dtype=np.int32))
        # a batch that stops at its depth cap runs no shadow rows: they would carry the
        # rest of the model at a sliver of a batch, the very time the cap was chosen to save
        keep = (self.shadow.selected(batch.ids) if config is served
                else np.zeros(n, bool))
        first = self.plan.stage == 0

        def on_early(ramp: int, idx: np.ndarray, labels, scores, logits) -> None:
            for k, local, sel in by_part(idx, starts, sizes):
                b, received = job.parts[k]
                self._answer(b, config, received, local, labels[sel], scores[sel],
                             np.full(len(sel), ramp, np.int32), logits[sel], early=True)

        out = execute_compute(
            self.runtime, self.ramps, self.plan.first_block, self.plan.last_block,
            batch.inputs if first else batch.inputs["x"], exit_at, config, on_early, keep,
            batch.ramp_ids, None if batch.ramp_pred is None else list(batch.ramp_pred),
            None if batch.ramp_score is None else list(batch.ramp_score),
            self.model_inputs_of(batch))
        if not batch.shadow:
            self.batch_sizes.observe(n)
            self.stage_seconds.observe(out.ms / 1e3)
            self.note_batch(n, out.ms)
        for k, (b, received) in enumerate(job.parts):
            lo = int(starts[k])
            mine = (out.rows >= lo) & (out.rows < lo + sizes[k])
            self._finish_part(b, config, received, out, np.flatnonzero(mine), lo,
                              self.model_inputs_of(b))
        if self.plan.is_last:
            self._compute_telemetry(batch, config, out, keep)

    def _finish_part(self, b: Batch, config: ExitConfig, received: float,
                     out: ComputeOutcome, at: np.ndarray, lo: int,
                     model_inputs: dict[str, np.ndarray]) -> None:
        """One part's survivors: forwarded (real and shadow apart), or answered."""
        rows = out.rows[at] - lo                     # positions in the part
        exited = out.exit_at[out.rows[at]] >= 0
        stage_ms = b.stage_ms + [out.ms]
        release = self.plan.stage == 0 and not b.shadow
        if self.plan.is_last:
            fin = ~exited
            labels, scores = ramp_outcome(out.output[at[fin]], config.score) if fin.any() \
                else (np.zeros(0, np.int32), np.zeros(0, np.float32))
            self._answer(b, config, received, rows[fin], labels, scores,
                         np.full(int(fin.sum()), -1, np.int32), out.output[at[fin]],
                         early=False, release=release)
            return
        waited = (time.monotonic() - received) * 1e3
        carry = {k: model_inputs[k] for k in self.carry}
        part = Batch(b.batch_id, b.model, b.stage, b.router, b.ids, config.version, b.inputs,
                     out.ramp_ids, np.stack([p[lo:lo + len(b.ids)] for p in out.ramp_pred])
                     if out.ramp_pred else None,
                     np.stack([s[lo:lo + len(b.ids)] for s in out.ramp_score])
                     if out.ramp_score else None,
                     out.exit_at[lo:lo + len(b.ids)], stage_ms, b.carry, b.replies, b.ages_ms,
                     b.slos_ms, b.shadow, b.variant)
        messages = []
        for shadow in (False, True):
            pick = exited == shadow
            if pick.any():
                nxt = sub_batch(part, rows[pick], out.output[at[pick]], self.plan.stage + 1,
                                config.version, carry, stage_ms, waited, shadow or b.shadow)
                messages.append((self.next_stage_subject(), self.checked_size(nxt.encode())))
        if messages:
            self._publish_threadsafe(messages)
        if release:
            self._release(b, config)

    def _compute_telemetry(self, batch: Batch, config: ExitConfig, out: ComputeOutcome,
                           keep: np.ndarray) -> None:
        """Telemetry of the selected rows that reached the end (all of them do)."""
        sel = np.flatnonzero(keep[out.rows])
        if sel.size == 0:
            return
        rows = out.rows[sel]
        labels, scores = ramp_outcome(out.output[sel], config.score)
        part = SampleTelemetry(
            model=self.plan.model, worker=self.id, batch_id=batch.batch_id,
            batch_ids=[batch.batch_id], batch_sizes=[len(rows)], config_version=config.version,
            mode=config.mode, score=config.score, thresholds=dict(config.thresholds),
            active=list(config.active), ids=[batch.ids[i] for i in rows],
            ramp_ids=out.ramp_ids,
            ramp_pred=np.stack([p[rows] for p in out.ramp_pred]) if out.ramp_pred
            else np.zeros((0, len(rows)), np.int32),
            ramp_score=np.stack([s[rows] for s in out.ramp_score]) if out.ramp_score
            else np.zeros((0, len(rows)), np.float32),
            exit_at=out.exit_at[rows], final_pred=labels, final_score=scores,
            batch_size=len(rows), stage_ms=[batch.stage_ms + [out.ms]], t=time.time())
        self.loop.call_soon_threadsafe(self._add_telemetry, part)

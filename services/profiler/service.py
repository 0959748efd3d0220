"""Profiler service, four roles, all reading and writing the store only (no bus needed):

- **latency profiles**: every registered model for this machine's device class. It polls
  the store's models on start and every ``poll_s`` seconds, and profiles each model whose
  profile for this device class is missing, incomplete, or older than the model's
  registration (a new version). Measuring runs in a worker thread, one model at a time,
  so the event loop stays free to stop.
- **depth-cap profiles** (:mod:`services.profiler.cap_profiles`): every early-exit model's
  depth caps as variants, from the monitor's feedback and the latency profile.
- **batch profiles** (E3 §3.1): every ``OFFRAMP_PROFILE_WINDOW_S``, for each model, the
  survival after each active ramp in the windows that ended (from the request history),
  the drift from the forecast made for them, and the next window's forecast (ARIMA and
  naive), into ``batch_profiles``. The optimizer re-plans on a window marked drifted.
  A window is profiled ``GRACE_S`` after it ends, so request records flushed late still
  count; a restarted profiler resumes after the newest window stored.
- **Performance History Table** (HELIOS §3.3.2, :mod:`services.profiler.pht_rows`): every
  ``PHT_POLL_S``, the PHT rows (per assessment, candidate and loaded depth) of every
  assessment whose generation streams (``generations``, stored by the monitor) changed,
  rebuilt from all its streams. An assessment's rows have caught up when their tokens are
  its streams' (``Store.assessment_progress``). A restarted profiler rebuilds each model's
  newest assessment.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from threadpoolctl import threadpool_limits

from services.common import gc_pauses, logs, metrics
from services.common.config import Config
from services.common.readiness import mark_ready
from services.profiler.batch_profile import window_start
from services.profiler.cap_profiles import CapProfiler
from services.profiler.latency import BATCH_SIZES, from_manifest, measure
from services.profiler.pht_rows import pht_rows_from_generations
from services.profiler.survival_forecast import MAX_HISTORY
from services.profiler.window_profile import (
    WindowProfile,
    profile_window,
    same_regime,
    tracked_ramps,
)
from services.runtime.devices import device_class
from services.runtime.manifest import Manifest
from services.runtime.timing import Cancelled
from services.store.repository import Store

POLL_S = 30.0
FAILED_RETRY_S = 600.0  # a model that failed to profile is tried again after this
GRACE_S = 5.0  # routers flush request records within a second or two; 5 s leaves margin
CATCH_UP_WINDOWS = 30  # a (re)started profiler profiles at most this many past windows
CAP_POLL_S = 2.0  # depth caps follow a new latency profile or exit config within this
PHT_POLL_S = 1.0  # the optimizer waits for an assessment's PHT rows: keep them this fresh
# Streams of ids this far below the newest seen are looked at again: on PostgreSQL a stream
# can commit after one with a higher id (ids are handed out before commit).
RECHECK_IDS = 1024


def expected_keys(manifest: dict[str, Any], batch_sizes: tuple[int, ...]) -> set[tuple]:
    """(kind, idx, batch_size) of a complete profile of `manifest`."""
    parts = [("block", int(b["index"])) for b in manifest.get("blocks", [])]
    parts += [("ramp", int(r["index"])) for r in manifest.get("ramps", [])]
    parts.append(("full", -1))
    return {(k, i, b) for k, i in parts for b in batch_sizes}


def needs_profile(
    model: dict[str, Any], profile: list[dict[str, Any]], batch_sizes: tuple[int, ...]
) -> bool:
    """True when `profile` lacks a part of `model` or predates its (re-)registration."""
    have = {(r["kind"], r["idx"], r["batch_size"]) for r in profile}
    if not expected_keys(model["manifest"], batch_sizes) <= have:
        return True
    oldest: datetime = min(r["measured_at"] for r in profile)
    return oldest < model["updated_at"]


class Profiler:
    def __init__(
        self, cfg: Config, store: Any, log: Any, batch_sizes: tuple[int, ...] = BATCH_SIZES
    ) -> None:
        self.cfg = cfg
        self.store = store
        self.log = log
        self.batch_sizes = batch_sizes
        self.device = device_class(cfg.device, threads=cfg.ort_threads)
        self.cancel = threading.Event()
        # (model, version) profiled by this process: never again, even when clocks of the
        # registering host and this one disagree about measured_at vs updated_at.
        self.done: set[tuple[str, str]] = set()
        self.failed: dict[tuple[str, str], float] = {}  # -> loop time of the failure

    async def poll(self) -> int:
        """Profile every model that needs it; returns how many were profiled."""
        profiled = 0
        for name in await asyncio.to_thread(self.store.model_names):
            if self.cancel.is_set():
                break
            model = await asyncio.to_thread(self.store.model, name)
            if model is None:
                continue
            key = (name, model["version"])
            now = asyncio.get_running_loop().time()
            if key in self.done or now - self.failed.get(key, -FAILED_RETRY_S) < FAILED_RETRY_S:
                continue
            profile = await asyncio.to_thread(self.store.latency_profile, name, self.device)
            if profile and not needs_profile(model, profile, self.batch_sizes):
                self.done.add(key)
                continue
            if await self.profile(model):
                profiled += 1
        return profiled

    async def profile(self, model: dict[str, Any]) -> bool:
        name, key = model["name"], (model["name"], model["version"])
        path = Path(model["path"])
        try:
            manifest = await asyncio.to_thread(Manifest.load, path)
            if manifest.version != model["version"]:
                raise ValueError(
                    f"{path} holds version {manifest.version}, the store {model['version']}"
                )
            if manifest.kind == "supernet":  # profiled per variant when prepared
                self.done.add(key)
                self.log.info("no block profile for %s: a supernet's variants were profiled "
                              "when it was prepared (subnet_profiles)", name)
                return False
            self.log.info(
                "profiling %s",
                logs.kv(
                    model=name, device=self.device, batch_sizes=",".join(map(str, self.batch_sizes))
                ),
            )
            if manifest.meta.get("device_class") == self.device:
                rows = from_manifest(manifest)
                if {(r["kind"], r["idx"], r["batch_size"]) for r in rows} >= expected_keys(
                        manifest.to_dict(), self.batch_sizes):
                    await asyncio.to_thread(self.store.save_latency_profile, name, self.device,
                                            rows, True)
                    self.done.add(key)
                    metrics.PROFILES.labels(name, "prepared").inc()
                    self.log.info("profile of %s taken from its preparation on this device class",
                                  name)
                    return True
            rows = await asyncio.to_thread(
                measure,
                path,
                manifest,
                self.batch_sizes,
                self.cfg.device,
                self.cfg.ort_threads,
                should_stop=self.cancel.is_set,
            )
            await asyncio.to_thread(self.store.save_latency_profile, name, self.device, rows, True)
        except Cancelled:
            return False
        except Exception as exc:  # noqa: BLE001 - e.g. artifacts not on this host
            self.failed[key] = asyncio.get_running_loop().time()
            metrics.PROFILES.labels(name, "failed").inc()
            self.log.warning("cannot profile %s: %r (retry in %.0fs)", name, exc, FAILED_RETRY_S)
            return False
        self.done.add(key)
        metrics.PROFILES.labels(name, "measured").inc()
        full = ",".join(f"{r['batch_size']}:{r['ms']}" for r in rows if r["kind"] == "full")
        self.log.info(
            "profiled %s", logs.kv(model=name, device=self.device, rows=len(rows), full_ms=full)
        )
        return True


def utc(t: float) -> datetime:
    """Unix seconds as the store's naive UTC."""
    return datetime.fromtimestamp(t, UTC).replace(tzinfo=None)


def unix(t: datetime) -> float:
    return t.replace(tzinfo=UTC).timestamp()


class BatchProfiler:
    """The batch-profile role (see the module docstring); synchronous: run it in a thread."""

    def __init__(self, store: Any, log: Any, window_s: float = 10.0,
                 grace_s: float = GRACE_S) -> None:
        self.store = store
        self.log = log
        self.window_s = window_s
        self.grace_s = grace_s
        self.next_start: dict[str, float] = {}  # model -> first window not yet profiled

    def poll(self, now: float) -> int:
        """Profile every model's windows that ended ``grace_s`` before ``now`` (unix s);
        returns how many windows held samples."""
        return sum(self.poll_model(name, now) for name in self.store.model_names())

    def poll_model(self, name: str, now: float) -> int:
        w = self.window_s
        start = self.next_start.get(name)
        if start is None:
            start = self._resume_at(name, now)
        done = 0
        while start + w <= now - self.grace_s:
            done += int(self.profile(name, start) is not None)
            start += w
        self.next_start[name] = start
        return done

    def _resume_at(self, name: str, now: float) -> float:
        """After the newest window observed, or ``CATCH_UP_WINDOWS`` back."""
        w = self.window_s
        earliest = window_start(now - self.grace_s, w) - CATCH_UP_WINDOWS * w
        seen = [unix(r["window_start"]) for r in
                self.store.batch_profiles(name, since=utc(earliest)) if r["samples"] is not None]
        return max(seen) + w if seen else earliest

    def profile(self, name: str, start: float) -> WindowProfile | None:
        """Profile one window and store it; None when it held no sample or no ramp."""
        w = self.window_s
        counts, version = self.store.request_exits(name, utc(start), utc(start + w))
        if not counts:
            return None
        config = self._config(name, version)
        running = self._running(name, config)
        rows = [{**r, "start": unix(r["window_start"])} for r in
                self.store.batch_profiles(name, since=utc(start - MAX_HISTORY * w))]
        history, made = same_regime(rows, start, tracked_ramps(counts, running), version)
        wp = profile_window(counts, running, history, made)
        if wp is None:
            return None
        self.store.record_observed(name, utc(start), utc(start + w), {
            r: (wp.samples, s) for r, s in zip(wp.ramps, wp.observed, strict=True)},
            version, None if wp.drift is None else wp.drifted)  # NULL: nothing to judge by
        self.store.record_forecast(name, utc(start + w), utc(start + 2 * w), {
            r: (f, n) for r, f, n in zip(wp.ramps, wp.forecast, wp.naive, strict=True)}, version)
        if wp.drifted:
            self.log.info("batch profile drifted %s", logs.kv(
                model=name, window=utc(start).isoformat(), error=round(wp.drift.max_error, 3),
                observed=",".join(f"{r}:{s:.2f}" for r, s in zip(wp.ramps, wp.observed,
                                                                 strict=True))))
        return wp

    def _running(self, name: str, config: Any) -> list[int]:
        """The ramps that ran: the exit config's active ones, and under a deployment plan
        only those its stages run (a ramp a plan switched off exits nothing, which says
        nothing of what it would exit: its last forecast stands)."""
        active = list(config.active) if config else []
        plan = self.store.latest_plan(name, feasible=True)
        if plan is None:
            return active
        running = {r for s in plan["plan"].get("stages", []) for r in s.get("active_ramps", [])}
        return [r for r in active if r in running]

    def _config(self, name: str, version: int | None) -> Any:
        """The exit config the window was served under (the newest when not recorded)."""
        if version is not None:
            for row in self.store.exit_configs(name, since_version=version - 1)[:1]:
                if row.version == version:
                    return row
        return self.store.latest_exit_config(name)


class PhtProfiler:
    """The PHT role (see the module docstring); synchronous: run it in a thread."""

    def __init__(self, store: Any, log: Any) -> None:
        self.store = store
        self.log = log
        self.seen: int | None = None  # newest generation id seen; None: before the first poll

    def poll(self) -> int:
        """Rebuild the PHT rows of the assessments with streams among the newest (the ids
        from ``RECHECK_IDS`` below the newest seen on) that have not caught up, and on the
        first poll each model's newest assessment whatever its state; returns how many
        assessments were rebuilt."""
        forced: set[tuple[str, int]] = set()
        if self.seen is None:  # (re)started: the PHT may lag, or be another version's
            every = self.store.generation_assessments()
            newest = {t["model"]: t["assessment"] for t in every}  # by assessment: last wins
            forced = set(newest.items())
            self.seen = max((t["last_id"] for t in every), default=0)
        touched = self.store.generation_assessments(max(self.seen - RECHECK_IDS, 0))
        stale = forced | {(t["model"], t["assessment"]) for t in touched
                          if (t["model"], t["assessment"]) not in forced
                          and not self.caught_up(t["model"], t["assessment"])}
        for model, assessment in sorted(stale):
            self.rebuild(model, assessment)
        self.seen = max([self.seen, *(t["last_id"] for t in touched)])
        return len(stale)

    def caught_up(self, model: str, assessment: int) -> bool:
        """True when every (candidate, depth) of the assessment that emitted tokens has its
        PHT row, with those tokens."""
        pht = {(r["candidate"], r["loaded_depth"]): r["tokens"]
               for r in self.store.pht_rows(model, assessment)}
        return all(pht.get((p["candidate"], p["depth"])) == p["tokens"]
                   for p in self.store.assessment_progress(model, assessment) if p["tokens"] > 0)

    def rebuild(self, model: str, assessment: int) -> None:
        rows = pht_rows_from_generations(self.store.generations(model, assessment))
        self.store.record_pht(model, rows)
        self.log.debug("PHT rows rebuilt %s", logs.kv(model=model, assessment=assessment,
                                                      rows=len(rows)))


async def repeat(poll: Callable[[], Any], every_s: float, stop: asyncio.Event, log: Any,
                 role: str) -> None:
    """A role's loop: ``poll`` in a thread every ``every_s`` until ``stop``. A failed poll
    (a store hiccup) is logged; the next one does its work."""
    while not stop.is_set():
        try:
            await asyncio.to_thread(poll)
        except Exception:
            log.exception("%s poll failed", role)
        try:
            await asyncio.wait_for(stop.wait(), every_s)
        except TimeoutError:
            pass


async def batch_profiles(batch: BatchProfiler, stop: asyncio.Event, log: Any) -> None:
    """The batch-profile role's loop: one poll per window, in a thread (ARIMA fits)."""
    await repeat(lambda: batch.poll(time.time()), batch.window_s, stop, log, "batch profile")


async def cap_profiles(caps: CapProfiler, stop: asyncio.Event, every_s: float, log: Any) -> None:
    """The depth-cap role's loop: one refresh every ``every_s``, in a thread."""
    await repeat(lambda: caps.poll(utc(time.time())), every_s, stop, log, "depth-cap profile")


async def serve_profiler(cfg: Config, stop: asyncio.Event, poll_s: float = POLL_S) -> None:
    """The service: ``run_service(lambda stop: serve_profiler(cfg, stop))``."""
    log = logs.setup("profiler", cfg.log_level)
    threadpool_limits(1)  # ARIMA fits are tiny: BLAS threads would only fight the workers
    store = Store(cfg.database_url)
    profiler = Profiler(cfg, store, log)
    batch = asyncio.ensure_future(asyncio.gather(
        batch_profiles(BatchProfiler(store, log, cfg.profile_window_s), stop, log),
        cap_profiles(CapProfiler(store, log, profiler.device), stop, CAP_POLL_S, log),
        repeat(PhtProfiler(store, log).poll, PHT_POLL_S, stop, log, "PHT")))
    gc_pauses.settle(cfg.gc_freeze)  # the startup heap: out of every later collection
    log.info("profiler ready %s", logs.kv(device=profiler.device, poll_s=poll_s,
                                           window_s=cfg.profile_window_s))
    mark_ready()
    try:
        while not stop.is_set():
            task = asyncio.ensure_future(profiler.poll())
            stopping = asyncio.ensure_future(stop.wait())
            await asyncio.wait({task, stopping}, return_when=asyncio.FIRST_COMPLETED)
            if stop.is_set():
                profiler.cancel.set()  # the measuring thread stops at its next point
            try:
                await task
            except Exception:  # store hiccup: try again next poll
                log.exception("profiler poll failed")
            stopping.cancel()
            try:
                await asyncio.wait_for(stop.wait(), poll_s)
            except TimeoutError:
                pass
    finally:
        profiler.cancel.set()
        if not stop.is_set():  # failed: the batch loop would not end by itself
            batch.cancel()
        await asyncio.gather(batch, return_exceptions=True)  # its poll ends before the close
        store.close()

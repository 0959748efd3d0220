"""Profiler service: keeps a latency profile of every registered model for this machine's
device class in the store.

It polls the store's models (no bus needed: registration writes the store first) on start
and every ``poll_s`` seconds, and profiles each model whose profile for this device class
is missing, incomplete, or older than the model's registration (a new version). Measuring
runs in a worker thread, one model at a time, so the event loop stays free to stop.
"""

from __future__ import annotations

import asyncio
import threading
from datetime import datetime
from pathlib import Path
from typing import Any

from services.common import logs, metrics
from services.common.config import Config
from services.profiler.latency import BATCH_SIZES, from_manifest, measure
from services.runtime.devices import device_class
from services.runtime.manifest import Manifest
from services.runtime.timing import Cancelled
from services.store.repository import Store

POLL_S = 30.0
FAILED_RETRY_S = 600.0  # a model that failed to profile is tried again after this


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
        self.device = device_class(cfg.device)
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


async def serve_profiler(cfg: Config, stop: asyncio.Event, poll_s: float = POLL_S) -> None:
    """The service: ``run_service(lambda stop: serve_profiler(cfg, stop))``."""
    log = logs.setup("profiler", cfg.log_level)
    store = Store(cfg.database_url)
    profiler = Profiler(cfg, store, log)
    log.info("profiler ready %s", logs.kv(device=profiler.device, poll_s=poll_s))
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
        store.close()

"""Tuner service: runs each model's Apparate control loop (``controller.ExitController``)
on live sample telemetry and deploys the exit configs it decides.

Every decision that changes the config is stored first (a new ``exit_configs`` version
with its reason) and then broadcast on ``offramp.config.<model>``; workers swap it in
between batches. Ramp-adjustment utilities go to ``ramp_utilities`` and the controller's
state to ``tuner_state`` after every decision, so a restarted tuner resumes with the same
config version and feedback history instead of falling back to defaults. A config stored
by someone else (``offramp exit-config``) is adopted as the new starting point.
"""

from __future__ import annotations

import asyncio
import time

import numpy as np
from nats.aio.client import Client
from nats.aio.msg import Msg

from schemas import subjects
from schemas.messages import ExitConfig, decode_map
from schemas.telemetry import SampleTelemetry
from services.common import bus, logs
from services.common.config import Config
from services.exits.exit_window import ExitWindow
from services.exits.latency_profile import LatencyProfile
from services.runtime.manifest import Manifest
from services.store.repository import Store
from services.tuner import climb_native
from services.tuner.controller import ExitController, TunerDecision

STATE_EVERY_S = 5.0  # also save the controller state this often while feedback arrives


def window_of(telemetry: SampleTelemetry) -> ExitWindow | None:
    """The feedback a sample-telemetry message carries (active ramps only), or None."""
    ids = telemetry.ramp_ids
    final = np.asarray(telemetry.final_pred, np.int64)
    if not len(final):
        return None
    pred = np.asarray(telemetry.ramp_pred, np.int64)
    score = np.asarray(telemetry.ramp_score, np.float64)
    order = np.argsort(ids, kind="stable")
    return ExitWindow.build([ids[i] for i in order], pred[order], score[order], final)


class ModelTuner:
    """One model: its controller, and the store version of the config it deployed."""

    def __init__(self, name: str, controller: ExitController, deployed: int) -> None:
        self.name = name
        self.controller = controller
        self.deployed = deployed  # exit_configs version in force
        self.saved_at = 0.0


class Tuner:
    def __init__(self, nc: Client, cfg: Config, store, log) -> None:
        self.nc, self.cfg, self.store, self.log = nc, cfg, store, log
        self.models: dict[str, ModelTuner] = {}
        self.lock = asyncio.Lock()  # one decision at a time: versions stay in order

    def load(self, name: str) -> ModelTuner:
        """Resume from the store: the saved controller if it matches the config in force,
        else a controller starting from that config."""
        manifest = Manifest.load(self.cfg.models_dir / name)
        latest = self.store.latest_exit_config(name)
        saved = self.store.tuner_state(name)
        if latest is not None and saved is not None and saved["config_version"] == latest.version:
            ctrl = ExitController.from_dict(saved["state"])
            prof = LatencyProfile.from_manifest(manifest)
            if prof.n_sites == ctrl.profile.n_sites:
                # costs as measured now (a re-preparation re-measures them), budget as configured
                ctrl.profile, ctrl.budget = prof, self.cfg.ramp_budget
                self.log.info("tuner resumed %s", logs.kv(model=name, version=latest.version,
                                                           samples=ctrl.seen))
                return ModelTuner(name, ctrl, latest.version)
            self.log.warning("saved tuner state has %d sites, the model now %d: starting from "
                             "the config in force", ctrl.profile.n_sites, prof.n_sites)
        return ModelTuner(name, self._fresh(manifest, latest), latest.version if latest else 0)

    def _fresh(self, manifest: Manifest, latest) -> ExitController:
        ramps = sorted(r.index for r in manifest.ramps)
        active = sorted(int(r) for r in latest.active) if latest is not None else ramps
        th = {int(k): float(v) for k, v in (latest.thresholds if latest is not None else {}).items()}
        return ExitController(LatencyProfile.from_manifest(manifest), active, [th.get(r, 0.0) for r in active],
                              constraint=self.cfg.accuracy_loss, budget=self.cfg.ramp_budget,
                              climb=climb_native.best_climb(self.cfg.tuner_native))

    async def on_samples(self, msg: Msg) -> None:
        try:
            telemetry = SampleTelemetry.decode(decode_map(msg.data))
            tuner = self.models.get(telemetry.model)
            if tuner is None:
                return
            window = window_of(telemetry)
        except Exception as exc:  # noqa: BLE001 - bad telemetry must not stop tuning
            self.log.warning("bad sample telemetry: %r", exc)
            return
        if window is None:
            return
        async with self.lock:
            t0 = time.perf_counter()
            decisions = tuner.controller.observe(window)
            ms = (time.perf_counter() - t0) * 1e3
            for d in decisions:
                await self._deploy(tuner, d, ms)
            if decisions or time.monotonic() - tuner.saved_at > STATE_EVERY_S:
                await self._save_state(tuner)

    async def _deploy(self, tuner: ModelTuner, d: TunerDecision, ms: float) -> None:
        if d.kind == "adjust" and d.utilities:
            rows = [{"model": tuner.name, "round": tuner.controller.rounds, "ramp": u.ramp_id,
                     "exits": int(u.exits), "saved_ms": float(u.saved_ms),
                     "added_ms": float(u.added_ms), "utility_ms": float(u.utility_ms),
                     "action": d.action, "config_version": tuner.deployed} for u in d.utilities]
            await asyncio.to_thread(self.store.add_ramp_utilities, rows)
        if not d.changed:
            return
        thresholds = {r.index: 0.0 for r in Manifest.load(self.cfg.models_dir / tuner.name).ramps}
        thresholds.update({int(r): float(t) for r, t in zip(d.active, d.thresholds, strict=True)})
        reason = f"tuner {d.trigger}/{d.action}: {d.reason}"
        row = await asyncio.to_thread(self.store.save_exit_config, tuner.name, thresholds,
                                      list(d.active), "latency", reason[:2000])
        tuner.deployed = row.version
        config = ExitConfig(tuner.name, row.version, "latency", thresholds, list(d.active),
                            tuner.controller.score)
        await self.nc.publish(subjects.exit_config(tuner.name), config.encode())
        self.log.info("exit config deployed %s", logs.kv(
            model=tuner.name, version=row.version, trigger=d.trigger, action=d.action,
            active=",".join(map(str, d.active)), decide_ms=round(ms, 2)))

    async def _save_state(self, tuner: ModelTuner) -> None:
        tuner.saved_at = time.monotonic()
        await asyncio.to_thread(self.store.save_tuner_state, tuner.name,
                                tuner.controller.to_dict(), tuner.deployed)

    async def on_config(self, msg: Msg) -> None:
        """Adopt a config stored by someone else (a higher version than ours)."""
        try:
            config = ExitConfig.decode(decode_map(msg.data))
        except Exception as exc:  # noqa: BLE001
            self.log.warning("bad exit config: %r", exc)
            return
        tuner = self.models.get(config.model)
        if tuner is None or config.version <= tuner.deployed:
            return
        async with self.lock:
            manifest = await asyncio.to_thread(Manifest.load, self.cfg.models_dir / config.model)
            latest = await asyncio.to_thread(self.store.latest_exit_config, config.model)
            tuner.controller = self._fresh(manifest, latest)
            tuner.deployed = latest.version if latest is not None else config.version
            self.log.info("tuner adopted %s", logs.kv(model=config.model, version=tuner.deployed))
            await self._save_state(tuner)


async def serve(cfg: Config, stop: asyncio.Event) -> None:
    log = logs.setup("tuner", cfg.log_level)
    store = Store(cfg.database_url)
    nc = await bus.connect(cfg.nats_url or "nats://127.0.0.1:4222", "offramp-tuner")
    tuner = Tuner(nc, cfg, store, log)
    for name in cfg.models:
        tuner.models[name] = await asyncio.to_thread(tuner.load, name)
    await nc.subscribe(subjects.telemetry_samples("*"), cb=tuner.on_samples)
    await nc.subscribe(subjects.exit_config("*"), cb=tuner.on_config)
    log.info("tuner ready %s", logs.kv(models=",".join(tuner.models),
                                        constraint=cfg.accuracy_loss,
                                        climb=climb_native.engine(cfg.tuner_native)))
    if climb_native.failure():
        log.warning("%s: the tuner climbs in Python (same decisions, slower)",
                    climb_native.failure())
    await stop.wait()
    for t in tuner.models.values():
        await tuner._save_state(t)
    await bus.close(nc)
    store.close()

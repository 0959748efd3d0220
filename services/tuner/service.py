"""Tuner service: runs each model's Apparate control loop (``controller.ExitController``)
on live sample telemetry and deploys the exit configs it decides.

Every decision that changes the config is stored first (a new ``exit_configs`` version
with its reason) and then broadcast on ``offramp.config.<model>``; workers swap it in
between batches.

The tuner also refits ramp heads online (``ramp_learner``, ``refit``): sampled pooled
features from workers (``offramp.features.<model>``) fill per-ramp buffers; a refit round
runs in a thread every few dozen samples; an accepted head is written as a new versioned
file, recorded in ``ramp_heads``, and deployed in the next config; a head the ramp served
before may come back instead (``RampLearner.propose``). The controller then chooses the
active set and thresholds on recent inputs as the new heads score them, and treats a changed
active ramp like a trial. It lives here, not in the profiler,
because a new head changes what the controller must do next: the two act on one lock and
one config version sequence. Ramp-adjustment utilities go to ``ramp_utilities`` and the controller's
state to ``tuner_state`` after every decision, so a restarted tuner resumes with the same
config version and feedback history instead of falling back to defaults. A config stored
by someone else (``offramp exit-config``) is adopted as the new starting point.

For generative models the tuner tunes each exit head's threshold on token-level feedback
(``generation_role``) and runs HELIOS's Confidence Breach Counter (``breach_watch``):
it follows the optimizer's decisions (``offramp.helios.decision.<model>``), counts the
breaches in LLM workers' generation telemetry, and publishes one ``BreachAlert`` on
``offramp.helios.breach.<model>`` when the counter trips, asking the optimizer to load more
layers or switch candidate.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Sequence
from dataclasses import replace

import numpy as np
from nats.aio.client import Client
from nats.aio.msg import Msg
from threadpoolctl import threadpool_limits

from schemas import subjects
from schemas.helios import BreachAlert, GenerationTelemetry, HeliosChoice
from schemas.messages import ExitConfig, decode_map
from schemas.telemetry import RampFeatures, SampleTelemetry
from services.common import bus, gc_pauses, logs, metrics
from services.common.background import run_low
from services.common.config import Config
from services.common.readiness import mark_ready
from services.common.service_loop import spawn
from services.exits.exit_window import ExitWindow
from services.exits.latency_profile import LatencyProfile
from services.runtime.manifest import Manifest, manifest_kind
from services.runtime.ramp_heads import load_head, save_head
from services.store.repository import Store
from services.tuner import climb_native
from services.tuner.breach_watch import BreachWatch
from services.tuner.controller import ExitController, TunerDecision, mode_controller
from services.tuner.generation_role import GenerationTuning
from services.tuner.ramp_learner import LearnerConfig, RampLearner, soft_temperature

STATE_EVERY_S = 5.0  # also save the controller state this often while feedback arrives


def window_of(telemetry: SampleTelemetry, head_since: dict[int, int] | None = None
              ) -> ExitWindow | None:
    """The feedback a sample-telemetry message carries (active ramps only), or None.
    ``head_since``: ramp -> config version from which it serves its current head; its rows
    from earlier configs scored an older head and are left out."""
    since = head_since or {}
    keep = [k for k, r in enumerate(telemetry.ramp_ids)
            if telemetry.config_version >= since.get(r, 0)]
    ids = [telemetry.ramp_ids[k] for k in keep]
    final = np.asarray(telemetry.final_pred, np.int64)
    if not len(final):
        return None
    pred = np.asarray(telemetry.ramp_pred, np.int64)[keep]
    score = np.asarray(telemetry.ramp_score, np.float64)[keep]
    order = np.argsort(ids, kind="stable")
    return ExitWindow.build([ids[i] for i in order], pred[order], score[order], final)


def head_version(file: str) -> int:
    """The version in a refitted head's file name (``ramp_<i>.v<version>.<hash>.onnx``);
    0 for a prepared head."""
    m = re.search(r"\.v(\d+)\.[0-9a-f]+\.onnx$", file)
    return int(m.group(1)) if m else 0


class ModelTuner:
    """One model: its controller, the store version of the config it deployed, and its
    ramp heads (files served, refit state)."""

    def __init__(self, name: str, controller: ExitController, deployed: int,
                 manifest: Manifest, heads: dict[int, str] | None = None) -> None:
        self.name = name
        self.controller = controller
        self.deployed = deployed  # exit_configs version in force
        self.saved_at = 0.0
        self.manifest = manifest
        self.heads = dict(heads or {})        # ramp -> refitted head file it serves
        self.head_since: dict[int, int] = {}  # ramp -> config version its head came with
        self.learner: RampLearner | None = None
        self.next_version: dict[int, int] = {}  # ramp -> version its next refit gets
        self.refitting = False
        self.refit_ms: list[float] = []
        self.mode = "latency"  # the exit mode of the config in force: the tuner keeps it
        # compute mode: the config's active ramps and thresholds, kept whole while the
        # controller tunes the subset the deployment plan runs
        self.config_active: list[int] = []
        self.config_thresholds: dict[int, float] = {}

    def follow(self, config) -> None:
        """Remember the mode, active ramps and thresholds of the config in force."""
        self.mode = config.mode
        self.config_active = sorted(int(r) for r in config.active)
        self.config_thresholds = {int(k): float(v) for k, v in config.thresholds.items()}


def wire_evidence(tuner: ModelTuner) -> None:
    """The controller chooses active sets on what every ramp's current head makes of the
    newest feature feedback (not only on the active ramps' telemetry)."""
    learner, ctrl = tuner.learner, tuner.controller
    if learner is not None:
        ctrl.evidence = lambda: learner.evidence(ctrl.score)


class Tuner:
    def __init__(self, nc: Client, cfg: Config, store, log) -> None:
        self.nc, self.cfg, self.store, self.log = nc, cfg, store, log
        self.models: dict[str, ModelTuner] = {}
        self.tasks: set[asyncio.Task] = set()
        self.lock = asyncio.Lock()  # one decision at a time: versions stay in order
        self.decision_seconds = metrics.Children(metrics.TUNER_DECISION_SECONDS)
        # HELIOS: one breach counter per generative model, from its first decision on
        self.watches: dict[str, BreachWatch] = {}
        self.generation = GenerationTuning(nc, cfg, store, log)  # per-head thresholds

    def load(self, name: str) -> ModelTuner:
        """Resume from the store: the saved controller (its feedback and config, with the
        mode's knobs as configured now) if it matches the config in force, else a controller
        starting from that config; the heads that config serves."""
        manifest = Manifest.load(self.cfg.models_dir / name)
        latest = self.store.latest_exit_config(name)
        heads = dict(latest.heads) if latest is not None else {}
        saved = self.store.tuner_state(name)
        tuner = None
        if latest is not None and saved is not None and saved["config_version"] == latest.version:
            state = saved["state"]
            prof = LatencyProfile.from_manifest(manifest)
            if prof.n_sites == len(state["profile"]["ramp_cost_ms"]):
                # the feedback and config saved, run with the mode's knobs as configured now;
                # costs as measured now (a re-preparation re-measures them)
                knobs = self._controller(manifest, state["active"], state["thresholds"],
                                         latest.mode == "compute").params()
                ctrl = ExitController.from_dict({**state, "params": knobs})
                ctrl.profile = prof
                self.log.info("tuner resumed %s", logs.kv(model=name, version=latest.version,
                                                           samples=ctrl.seen))
                tuner = ModelTuner(name, ctrl, latest.version, manifest, heads)
            else:
                self.log.warning("saved tuner state has %d sites, the model now %d: starting "
                                 "from the config in force",
                                 len(state["profile"]["ramp_cost_ms"]), prof.n_sites)
        if tuner is None:
            tuner = ModelTuner(name, self._fresh(manifest, latest),
                               latest.version if latest else 0, manifest, heads)
        if latest is not None:
            tuner.follow(latest)
        self._start_learning(tuner)
        return tuner

    def _start_learning(self, tuner: ModelTuner) -> None:
        """Online refits for ``tuner``'s model, from the heads its config serves (off when
        workers publish no features)."""
        if not self.cfg.refit or self.cfg.ramp_feature_rate <= 0:
            return
        model_dir = self.cfg.models_dir / tuner.name
        heads = {r.index: load_head(model_dir, r, tuner.heads.get(r.index))
                 for r in tuner.manifest.ramps}
        temperature = soft_temperature(str(tuner.manifest.meta.get("recipe", "")))
        classes = int(tuner.manifest.classes) if temperature is not None else 0
        prepared = {r.index: load_head(model_dir, r, None) for r in tuner.manifest.ramps
                    if r.index in tuner.heads}
        tuner.learner = RampLearner(
            heads, LearnerConfig(soft_temperature=temperature), classes=classes,
            versions={r: head_version(f) for r, f in tuner.heads.items()}, prepared=prepared)
        stored = self.store.ramp_heads(tuner.name)
        tuner.next_version = {r: 1 + max([h["version"] for h in stored if h["ramp"] == r],
                                         default=0) for r in heads}
        wire_evidence(tuner)

    def _fresh(self, manifest: Manifest, latest) -> ExitController:
        """A controller starting from ``latest``. In compute mode it tunes thresholds only:
        which ramps run is the deployment plan's exit wrapper's call (E3 §3.4), and the
        ramp budget is a latency-mode notion, so it never adjusts the active set."""
        ramps = sorted(r.index for r in manifest.ramps)
        active = sorted(int(r) for r in latest.active) if latest is not None else ramps
        th = {int(k): float(v) for k, v in (latest.thresholds if latest is not None else {}).items()}
        compute = latest is not None and latest.mode == "compute"
        return self._controller(manifest, active, [th.get(r, 0.0) for r in active], compute)

    def _controller(self, manifest: Manifest, active: Sequence[int],
                    thresholds: Sequence[float], compute: bool) -> ExitController:
        """The configured controller of the mode (``controller.mode_controller``)."""
        return mode_controller(LatencyProfile.from_manifest(manifest), active, thresholds,
                               compute=compute, constraint=self.cfg.accuracy_loss,
                               budget=self.cfg.ramp_budget,
                               climb=climb_native.best_climb(self.cfg.tuner_native))

    async def on_samples(self, msg: Msg) -> None:
        try:
            telemetry = SampleTelemetry.decode(decode_map(msg.data))
            tuner = self.models.get(telemetry.model)
            if tuner is None:
                return
            window = window_of(telemetry, tuner.head_since)
        except Exception as exc:  # noqa: BLE001 - bad telemetry must not stop tuning
            self.log.warning("bad sample telemetry: %r", exc)
            return
        if window is None:
            return
        async with self.lock:
            self._follow_plan(tuner, telemetry.ramp_ids)
            t0 = time.perf_counter()
            decisions = tuner.controller.observe(window)
            ms = (time.perf_counter() - t0) * 1e3
            self.decision_seconds[tuner.name].observe(ms / 1e3)
            for d in decisions:
                await self._deploy(tuner, d, ms)
            if decisions or time.monotonic() - tuner.saved_at > STATE_EVERY_S:
                await self._save_state(tuner)

    def _follow_plan(self, tuner: ModelTuner, ran: list[int]) -> None:
        """Compute mode: tune the active ramps that ran (a deployment plan's exit wrapper
        may switch some off), so tunes find records that hold all of them; the others keep
        their thresholds for when a plan runs them again."""
        if tuner.mode != "compute":
            return
        running = tuple(sorted(set(ran) & set(tuner.config_active)))
        if running == tuner.controller.active:
            return
        th = tuner.config_thresholds
        tuner.controller = self._controller(tuner.manifest, running,
                                            [th.get(r, 0.0) for r in running], compute=True)
        wire_evidence(tuner)
        self.log.info("tuning the ramps the plan runs %s", logs.kv(
            model=tuner.name, ramps=",".join(map(str, running)) or "none"))

    async def on_features(self, msg: Msg) -> None:
        try:
            feats = RampFeatures.decode(decode_map(msg.data))
            tuner = self.models.get(feats.model)
            if tuner is None or tuner.learner is None:
                return
            due = tuner.learner.feed(dict(zip(feats.ramp_ids, feats.features, strict=True)),
                                     feats.final_pred, feats.final_logits)
        except Exception as exc:  # noqa: BLE001 - bad feedback must not stop tuning
            self.log.warning("bad ramp features: %r", exc)
            return
        if due and not tuner.refitting:  # a round still running takes the next one's place
            tuner.refitting = True
            spawn(self._refit_round(tuner), self.tasks, self.log)

    async def _refit_round(self, tuner: ModelTuner) -> None:
        """Refit every ramp (in a thread: ~10-50 ms each), deploy the accepted heads."""
        try:
            accepted = []
            for ramp in sorted(tuner.learner.heads):
                t0 = time.perf_counter()
                # low priority: on a small machine a refit competes with serving for cores
                got = await asyncio.to_thread(run_low, tuner.learner.propose, ramp)
                if got.verdict is None:
                    continue
                tuner.refit_ms.append((time.perf_counter() - t0) * 1e3)
                if got.head is None:
                    continue
                if got.version is None:
                    accepted.append(await self._save_head(tuner, ramp, got.head, got.verdict,
                                                          got.trained, got.judged))
                else:
                    accepted.append(await self._returned_head(tuner, ramp, got))
            if accepted:
                await self._deploy_heads(tuner, accepted)
        finally:
            tuner.refitting = False

    async def _save_head(self, tuner: ModelTuner, ramp: int, head, verdict, trained: int,
                         judged: int) -> tuple[int, object, int, str]:
        version = tuner.next_version[ramp]
        spec = tuner.manifest.ramp(ramp)
        file, sha = await asyncio.to_thread(save_head, self.cfg.models_dir / tuner.name, spec,
                                            version, head)
        await asyncio.to_thread(self.store.save_ramp_head, tuner.name, ramp, version, file, sha,
                                trained, judged, {
                                    "serving_agreement": verdict.serving_agreement,
                                    "agreement": verdict.candidate_agreement,
                                    "serving_calibration": verdict.serving_calibration,
                                    "calibration": verdict.candidate_calibration},
                                tuner.manifest.version)
        tuner.next_version[ramp] = version + 1
        self.log.info("ramp head refitted %s", logs.kv(
            model=tuner.name, ramp=ramp, version=version, file=file, trained_on=trained,
            judged_on=judged, why=verdict.reason,
            refit_ms=round(tuner.refit_ms[-1], 1) if tuner.refit_ms else None))
        return ramp, head, version, file

    async def _returned_head(self, tuner: ModelTuner, ramp: int, got
                             ) -> tuple[int, object, int, str | None]:
        """A head ``ramp`` served before, back under its version and file (None: the
        prepared head)."""
        file = None
        if got.version:
            stored = await asyncio.to_thread(self.store.ramp_heads, tuner.name)
            file = next(h["file"] for h in stored
                        if h["ramp"] == ramp and h["version"] == got.version)
        self.log.info("ramp head returned %s", logs.kv(
            model=tuner.name, ramp=ramp, version=got.version, file=file or "prepared",
            judged_on=got.judged, why=got.verdict.reason))
        return ramp, got.head, got.version, file

    async def _deploy_heads(self, tuner: ModelTuner, accepted: list) -> None:
        """One config for every head a round accepted; each ramp restarts as a trial."""
        async with self.lock:
            for ramp, head, version, file in accepted:
                tuner.learner.adopt(ramp, head, version)
                if file is None:
                    tuner.heads.pop(ramp, None)
                else:
                    tuner.heads[ramp] = file
            d = tuner.controller.head_changed([ramp for ramp, *_ in accepted])
            await self._deploy(tuner, d, 0.0, heads_changed=True)
            for ramp, *_ in accepted:
                tuner.head_since[ramp] = tuner.deployed
            await self._save_state(tuner)

    async def _deploy(self, tuner: ModelTuner, d: TunerDecision, ms: float,
                      heads_changed: bool = False) -> None:
        if d.kind == "adjust" and d.utilities:
            rows = [{"model": tuner.name, "round": tuner.controller.rounds, "ramp": u.ramp_id,
                     "exits": int(u.exits), "saved_ms": float(u.saved_ms),
                     "added_ms": float(u.added_ms), "utility_ms": float(u.utility_ms),
                     "action": d.action, "config_version": tuner.deployed} for u in d.utilities]
            await asyncio.to_thread(self.store.add_ramp_utilities, rows)
        if not d.changed and not heads_changed:
            return
        compute = tuner.mode == "compute"  # the plan's subset was tuned: the rest stays
        thresholds = {r.index: 0.0 for r in tuner.manifest.ramps}
        if compute:
            thresholds.update(tuner.config_thresholds)
        thresholds.update({int(r): float(t) for r, t in zip(d.active, d.thresholds, strict=True)})
        active = tuner.config_active if compute else list(d.active)
        reason = f"tuner {d.trigger}/{d.action}: {d.reason}"
        row = await asyncio.to_thread(self.store.save_exit_config, tuner.name, thresholds,
                                      active, tuner.mode, reason[:2000], tuner.heads)
        tuner.deployed = row.version
        tuner.config_thresholds = dict(thresholds)
        config = ExitConfig(tuner.name, row.version, tuner.mode, thresholds, list(active),
                            tuner.controller.score, dict(tuner.heads))
        await self.nc.publish(subjects.exit_config(tuner.name), config.encode())
        metrics.TUNER_CONFIGS.labels(tuner.name, d.trigger).inc()  # rare: no child kept
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
        if self.generation.adopt(config):
            return
        tuner = self.models.get(config.model)
        if tuner is None or config.version <= tuner.deployed:
            return
        async with self.lock:
            manifest = await asyncio.to_thread(Manifest.load, self.cfg.models_dir / config.model)
            latest = await asyncio.to_thread(self.store.latest_exit_config, config.model)
            tuner.controller = self._fresh(manifest, latest)
            tuner.deployed = latest.version if latest is not None else config.version
            tuner.follow(latest if latest is not None else config)
            heads = dict(latest.heads) if latest is not None else dict(config.heads)
            await asyncio.to_thread(self._adopt_heads, tuner, heads)
            wire_evidence(tuner)
            self.log.info("tuner adopted %s", logs.kv(model=config.model, version=tuner.deployed))
            await self._save_state(tuner)

    async def on_decision(self, msg: Msg) -> None:
        """Follow the optimizer's HELIOS decision of a model: a newer one resets and re-arms
        its breach counter; a re-broadcast one changes nothing."""
        try:
            choice = HeliosChoice.decode(decode_map(msg.data))
        except Exception as exc:  # noqa: BLE001 - a bad message must not stop the tuner
            self.log.error("bad HELIOS decision on %s: %r", msg.subject, exc)
            return
        watch = self.watches.get(choice.model)
        if watch is None:
            watch = self.watches[choice.model] = BreachWatch(choice.model)
        before = watch.choice
        watch.follow(choice)
        if watch.choice is not before:
            self.log.info("breach counter follows %s", logs.kv(
                model=choice.model, decision=choice.decision, kind=choice.kind,
                candidate=choice.candidate, depth=choice.depth, armed=watch.armed))

    async def on_generation(self, msg: Msg) -> None:
        """Tune the heads' thresholds on the streams' token-level feedback; count their
        breaches and alert when the counter trips."""
        try:
            telemetry = GenerationTelemetry.decode(decode_map(msg.data))
        except Exception as exc:  # noqa: BLE001 - a bad message must not stop the tuner
            self.log.error("bad generation telemetry on %s: %r", msg.subject, exc)
            return
        # a record that completes one with its judged score brings no new tokens
        telemetry = replace(telemetry, records=[r for r in telemetry.records if not r.completes])
        if not telemetry.records:
            return
        try:
            await self.generation.observe(telemetry)
        except Exception:  # store hiccup: the next streams bring more feedback
            self.log.exception("generation threshold tuning failed")
        watch = self.watches.get(telemetry.model)
        if watch is None:  # no decision known yet: nothing to count against
            return
        for record in telemetry.records:
            alert = watch.observe(record)
            if alert is not None:
                await self._breach(alert)

    async def _breach(self, alert: BreachAlert) -> None:
        await self.nc.publish(subjects.helios_breach(alert.model), alert.encode())
        self.log.info("confidence breach %s", logs.kv(
            model=alert.model, decision=alert.decision, candidate=alert.candidate,
            depth=alert.depth, breaches=alert.breaches, window=alert.window))

    def _adopt_heads(self, tuner: ModelTuner, heads: dict[int, str]) -> None:
        """Serve (and refit from) the heads a config set by hand names, e.g. a pinned
        earlier version: later refits must beat that head to replace it."""
        changed = {r for r in set(heads) | set(tuner.heads) if heads.get(r) != tuner.heads.get(r)}
        tuner.heads = dict(heads)
        for r in changed:
            tuner.head_since[r] = tuner.deployed
            if tuner.learner is not None and r in tuner.learner.heads:
                spec = tuner.manifest.ramp(r)
                head = load_head(self.cfg.models_dir / tuner.name, spec, heads.get(r))
                tuner.learner.adopt(r, head, head_version(heads.get(r, spec.file)))


async def serve(cfg: Config, stop: asyncio.Event) -> None:
    log = logs.setup("tuner", cfg.log_level)
    # refits are small matrix products: one BLAS thread (at low priority, see run_low)
    # instead of a pool on every core that serving needs
    threadpool_limits(1)
    store = Store(cfg.database_url)
    nc = await bus.connect_as(cfg, "tuner", "offramp-tuner")
    tuner = Tuner(nc, cfg, store, log)
    for name in cfg.models:
        if manifest_kind(cfg.models_dir / name) == "llm":  # heads' thresholds, breaches
            await asyncio.to_thread(tuner.generation.resume, name)
            continue
        tuner.models[name] = await asyncio.to_thread(tuner.load, name)
    await nc.subscribe(subjects.telemetry_samples("*"), cb=tuner.on_samples)
    await nc.subscribe(subjects.exit_config("*"), cb=tuner.on_config)
    await nc.subscribe(subjects.ramp_features("*"), cb=tuner.on_features)
    await nc.subscribe(subjects.helios_decision("*"), cb=tuner.on_decision)
    await nc.subscribe(subjects.telemetry_generation("*"), cb=tuner.on_generation)
    gc_pauses.settle(cfg.gc_freeze)  # the startup heap: out of every later collection
    log.info("tuner ready %s", logs.kv(models=",".join(tuner.models),
                                        constraint=cfg.accuracy_loss,
                                        climb=climb_native.engine(cfg.tuner_native)))
    mark_ready()
    if climb_native.failure():
        log.warning("%s: the tuner climbs in Python (same decisions, slower)",
                    climb_native.failure())
    repeats = asyncio.ensure_future(tuner.generation.keep_broadcasting(stop))
    await stop.wait()
    await repeats
    for t in tuner.models.values():
        await tuner._save_state(t)
    await bus.close(nc)
    store.close()

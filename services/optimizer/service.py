"""Optimizer service (E3 §3.2): turns the store's profiles, forecasts and pool inventory
into versioned deployment plans for every served model, stores each with its inputs and
reason, and broadcasts it on ``offramp.plan.<model>`` to the pool workers.

Every profile window it looks at each model and plans when ``replan.replan_reason`` says
so (first plan, pool change, drift, timer); it re-broadcasts the plan in force each time,
so a worker that missed a message catches up within a window. A restarted optimizer
resumes from the newest stored plan (its inputs say what it was made from).
"""

from __future__ import annotations

import asyncio
import math
import time
from datetime import datetime, timedelta
from typing import Any

from nats.aio.client import Client

from schemas import subjects
from schemas.heartbeat import Heartbeat
from schemas.messages import decode_map
from schemas.plans import Plan
from services.common import bus, gc_pauses, logs
from services.common.config import Config
from services.common.readiness import mark_ready
from services.optimizer import plan_inputs as pi
from services.optimizer.replan import UNMEASURED, Basis, replan_reason, request_rate
from services.optimizer.splits import plan as make_plan
from services.optimizer.sticky_ramps import StageKey, keep_running, running_sites
from services.optimizer.stragglers import StragglerWatch
from services.store.db import utcnow
from services.store.repository import Store

STORE_HEARTBEAT_S = 2.0     # how often pool workers write their row (the worker's cadence)
FRESH_S = 3 * STORE_HEARTBEAT_S  # a pool worker not seen for this long is not planned for
UNPLANNED_POLL_S = 1.0      # how often to look while a model has no plan in force
RATE_WINDOWS = 3            # the request rate is measured over this many profile windows


class Optimizer:
    def __init__(self, nc: Client | None, cfg: Config, store: Any, log: Any) -> None:
        self.nc = nc
        self.cfg = cfg
        self.store = store
        self.log = log
        self.targets = pi.Targets(slo_ms=cfg.default_slo_ms, batch=cfg.max_batch,
                                  slack=cfg.plan_slack, alpha=cfg.plan_alpha)
        self.basis: dict[str, Basis | None] = {}
        self.plans = 0
        self.watch = StragglerWatch()
        self.roles: dict[str, tuple[str, int, int]] = {}  # pool worker -> model, blocks

    async def on_heartbeat(self, msg: Any) -> None:
        """A pool worker's batches since its last heartbeat, for straggler detection."""
        try:
            hb = Heartbeat.decode(decode_map(msg.data))
        except Exception:  # noqa: BLE001 - not ours to police: the router logs bad ones
            return
        if hb.pool:
            self.roles[hb.pool] = (hb.model, hb.first_block, hb.last_block)
            self.watch.observe(hb.pool, hb.ran, hb.ran_rows, hb.ran_ms)

    def check_stragglers(self) -> None:
        """Close the straggler window: mark workers slower than their profile (the next
        look re-plans without them: the inventory changed) and clear recovered ones."""
        devices = {w["worker_id"]: w["device"] for w in self.store.workers()}
        tables: dict[tuple[str, str], Any] = {}

        def expected(pool: str, rows: float) -> float | None:
            model, first, last = self.roles.get(pool, ("", 0, 0))
            device = devices.get(pool)
            if not model or not device:
                return None
            key = (model, device)
            if key not in tables:
                row = self.store.model(model)
                tables[key] = None if row is None else pi.latency_table(
                    self.store.latency_profile(model, device), pi.geometry(row["manifest"]))
            table = tables[key]
            return None if table is None else float(table.blocks_at(rows)[first:last].sum())

        marked, cleared = self.watch.close_window(expected)
        for pool in marked:
            self.store.mark_straggler(pool, utcnow())
            self.log.warning("straggler %s", logs.kv(worker=pool, margin=self.watch.margin))
        for pool in cleared:
            self.store.mark_straggler(pool, None)
            self.log.info("straggler recovered %s", logs.kv(worker=pool))

    def consider(self, model: str, now: float) -> tuple[Plan | None, bool]:
        """The plan in force for ``model`` after this look (its newest feasible plan), and
        whether this look made it."""
        row = self.store.model(model)
        if row is None:
            return None, False
        latest = self.store.latest_plan(model)
        if model not in self.basis:
            self.basis[model] = None if latest is None else basis_of(latest)
        in_force = self.store.latest_plan(model, feasible=True)
        inventory = pi.pool_inventory(self.store.workers(), utcnow(), FRESH_S)
        drift = self.store.newest_drift(model)
        geo = pi.geometry(row["manifest"])
        tables = {d: t for d in inventory
                  if (t := pi.latency_table(self.store.latency_profile(model, d), geo)) is not None}
        rate = self.rate(model)
        reason = replan_reason(self.basis[model], now, inventory, drift, self.cfg.plan_interval_s,
                               frozenset(tables), rate)
        if reason is None:
            return (None if in_force is None else Plan.decode(in_force["plan"])), False
        plan = self.plan(model, geo, tables, rate, reason, inventory, drift, in_force, now)
        self.basis[model] = Basis(now, inventory, drift, frozenset(tables), rate)
        if not plan.feasible:  # the workers keep the roles of the plan in force
            return (None if in_force is None else Plan.decode(in_force["plan"])), False
        return plan, True

    def rate(self, model: str) -> float:
        """Requests per second over the last few profile windows (``replan.UNMEASURED``
        while the stream is younger than one)."""
        span, now = RATE_WINDOWS * self.cfg.profile_window_s, utcnow()
        stats = self.store.request_stats(model, now - timedelta(seconds=span))
        first = stats["first_at"]
        return request_rate(stats["count"], span,
                            None if first is None else (now - first).total_seconds(),
                            self.cfg.profile_window_s)

    def plan(self, model: str, geo: pi.ModelGeometry, tables: dict[str, Any], rate: float,
             reason: str, inventory: dict[str, tuple[str, ...]], drift: datetime | None,
             latest: dict[str, Any] | None, now: float) -> Plan:
        profiles = self.store.batch_profiles(model, since=utcnow() - timedelta(hours=1))
        forecast = pi.latest_forecast(profiles)
        problem = pi.problem(geo, forecast, tables, inventory, rate, self.targets,
                             pi.current_ramps(profiles))
        started = time.perf_counter()
        dp = keep_running(make_plan(problem), problem, running_ramps(latest, geo))
        optimizer_ms = (time.perf_counter() - started) * 1e3
        current = current_roles(latest)
        workers = pi.assign(dp, inventory, current) if dp.feasible else []
        unprofiled = sorted(set(inventory) - set(tables))
        why = reason + ("" if dp.feasible else f"; no plan: {dp.reason}") + \
            (f"; device classes without a latency profile: {', '.join(unprofiled)}"
             if unprofiled else "")
        probe = [r for r in geo.ramp_ids if r not in forecast]
        inputs = {"rate_rps": None if math.isinf(rate) else rate, "headroom": self.targets.headroom,
                  "slo_ms": self.targets.slo_ms, "batch": self.targets.batch,
                  "slack": self.targets.slack, "alpha": self.targets.alpha,
                  "inventory": {d: list(ids) for d, ids in inventory.items()},
                  "profiled": sorted(tables),
                  "forecast": {str(r): f for r, f in forecast.items()}, "probe_ramps": probe,
                  "survival": list(problem.chain.survival),
                  "link": {"ms_per_byte": self.targets.ms_per_byte,
                           "fixed_ms": self.targets.fixed_ms, "source": "constant, modeled"},
                  "drift_seen": None if drift is None else drift.isoformat(),
                  "made_at": now, "optimizer_ms": optimizer_ms, "planner": dp.reason}
        if math.isinf(rate):
            why += "; sized for the whole pool until the rate is measured"
        msg = pi.to_message(model, 1, why, geo, dp, workers, problem.hold_ms, now,
                            {"probe_ramps": probe}, probe)
        row = self.store.save_plan(model, why, dp.feasible, dp.goodput, dp.latency_ms, dp.cost,
                                   msg.to_map(), inputs)
        self.plans += 1
        self.log.info("plan %s", logs.kv(model=model, version=row["version"], reason=why,
                                         stages=len(msg.stages), cuts=msg.cuts,
                                         goodput=round(dp.goodput, 1), ms=round(optimizer_ms, 1)))
        return Plan.decode(row["plan"])

    async def tick(self) -> bool:
        """One look at every model; True when each has a plan in force."""
        try:
            await asyncio.to_thread(self.check_stragglers)
        except Exception:  # store hiccup: the next window judges again
            self.log.exception("straggler check failed")
        planned = True
        for model in self.cfg.models:
            try:
                plan, _new = await asyncio.to_thread(self.consider, model, time.time())
            except Exception:  # store hiccup: the next window tries again
                self.log.exception("planning %s failed", model)
                plan = None
            planned = planned and plan is not None
            if plan is not None and self.nc is not None:
                await self.nc.publish(subjects.plan(model), plan.encode())
        return planned


def basis_of(row: dict[str, Any]) -> Basis:
    """What a stored plan was made from (its inputs), to resume after a restart."""
    inputs = row.get("inputs") or {}
    drift = inputs.get("drift_seen")
    inventory = {d: tuple(ids) for d, ids in (inputs.get("inventory") or {}).items()}
    return Basis(float(inputs.get("made_at", 0.0)), inventory,
                 None if drift is None else datetime.fromisoformat(drift),
                 frozenset(inputs.get("profiled") or ()), _planned_rate(inputs))


def _planned_rate(inputs: dict[str, Any]) -> float:
    """The rate a stored plan was sized for (None: not measured yet, the whole pool)."""
    if "rate_rps" not in inputs:
        return 0.0
    rate = inputs["rate_rps"]
    return UNMEASURED if rate is None else float(rate)


def running_ramps(row: dict[str, Any] | None, geo: pi.ModelGeometry) -> dict[StageKey, tuple[int, ...]]:
    """The ramp sites each stage of the stored plan ``row`` runs (``sticky_ramps``)."""
    if row is None or not row["feasible"]:
        return {}
    return running_sites([(s.first_block, s.last_block, s.device, s.active_ramps)
                          for s in Plan.decode(row["plan"]).stages], geo.ramp_ids)


def current_roles(row: dict[str, Any] | None) -> dict[str, tuple[int, int]]:
    """Pool worker -> the block range it serves under the stored plan ``row``."""
    if row is None or not row["feasible"]:
        return {}
    plan = Plan.decode(row["plan"])
    return {w: (s.first_block, s.last_block) for s in plan.stages for w in s.workers}


async def serve(cfg: Config, stop: asyncio.Event) -> None:
    log = logs.setup("optimizer", cfg.log_level)
    store = Store(cfg.database_url)
    nc = await bus.connect_as(cfg, "optimizer", "offramp-optimizer")
    optimizer = Optimizer(nc, cfg, store, log)
    await nc.subscribe(subjects.HEARTBEAT, cb=optimizer.on_heartbeat)
    for model in cfg.models:  # a planned model is served in compute mode (E3)
        row = await asyncio.to_thread(store.ensure_exit_mode, model, "compute",
                                      "compute mode: planned by the optimizer (E3)")
        if row is not None:
            log.info("exit mode set %s", logs.kv(model=model, version=row.version, mode="compute"))
    gc_pauses.settle(cfg.gc_freeze)  # the startup heap: out of every later collection
    log.info("optimizer ready %s", logs.kv(models=",".join(cfg.models),
                                           interval_s=cfg.plan_interval_s,
                                           window_s=cfg.profile_window_s))
    mark_ready()
    try:
        while not stop.is_set():
            planned = await optimizer.tick()
            try:  # until every model has a plan, look again soon: pool workers are starting
                await asyncio.wait_for(stop.wait(), cfg.profile_window_s if planned
                                       else UNPLANNED_POLL_S)
            except TimeoutError:
                pass
    finally:
        await bus.close(nc)
        store.close()

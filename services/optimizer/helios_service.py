"""HELIOS service (``offramp serve helios``, the optimizer's bus role): chooses which
candidate serves each generative model, loaded how deep, and tells its LLM workers.

Every ``TICK_S`` it reads, per served generative model, the newest decision, what the
current assessment has served (the monitor's ``generations`` rows), the Performance History
Table (the profiler's) and the model repository, and asks the pure loop
(``helios_control.next_step``) for the next decision. The tuner's Confidence Breach Counter
alerts (``offramp.helios.breach.<model>``) ask ``helios_control.on_breach``. Each decision
is stored in ``helios_decisions`` with its reason, then broadcast on
``offramp.helios.decision.<model>``; the decision in force is re-broadcast every
``REBROADCAST_S`` so a new worker or tuner catches up. Everything lives in the store: a
restarted service resumes from the newest decision.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import asdict
from typing import Any

from nats.aio.client import Client

from schemas import subjects
from schemas.helios import BreachAlert, HeliosChoice
from schemas.messages import decode_map
from services.common import bus, gc_pauses, logs
from services.common.config import Config
from services.common.readiness import mark_ready
from services.optimizer.helios import (
    Candidate,
    PhtRow,
    Slo,
    SwitchCosts,
    select_top_k,
    weight_bytes,
)
from services.optimizer.helios_control import Served, Settings, Step, next_step, on_breach
from services.store.repository import Store

TICK_S = 0.5
REBROADCAST_S = 1.0  # a worker that starts late serves the decision within this
# Weights a candidate reads back per byte (ms): a layer of SmolLM2 (13.5 MB) is read back
# in 0.78 ms from the page cache (docs/benchmarks.md, HELIOS replay).
LOAD_MS_PER_BYTE = 0.78 / 13.5e6


def candidate_of(row: dict[str, Any]) -> Candidate:
    return Candidate(row["name"], row["family"], int(row["n_layers"]),
                     tuple(row["exit_layers"]), int(row["layer_bytes"]), int(row["fixed_bytes"]),
                     int(row["kv_bytes_per_token_layer"]), float(row["tokens_per_s"]),
                     float(row["perplexity"]), row.get("exit_distribution") or {})


def pht_of(row: dict[str, Any]) -> PhtRow:
    return PhtRow(row["candidate"], int(row["assessment"]), int(row["loaded_depth"]),
                  float(row["tokens_per_s"]), float(row["ttft_ms"]), float(row["tpot_ms"]),
                  float(row["perplexity"]), row["exit_distribution"], int(row["memory_bytes"]),
                  int(row["tokens"]))


class Helios:
    def __init__(self, nc: Client | None, cfg: Config, store: Any, log: Any) -> None:
        self.nc, self.cfg, self.store, self.log = nc, cfg, store, log
        self.lock = asyncio.Lock()  # the timer and breach alerts both decide
        self.sent: dict[str, float] = {}  # model -> when its decision was last broadcast
        self.decisions = 0

    def settings(self, pool: list[Candidate]) -> Settings:
        """Choice: the memory budget is the worker's KV budget plus the largest candidate's
        full weights, so fully loaded the batch is the worker's slots."""
        full = max(weight_bytes(c, c.n_layers) for c in pool)
        return Settings(self.cfg.helios_ri, self.cfg.helios_eval_prompts,
                        Slo(family=pool[0].family,
                            max_perplexity_rise=self.cfg.helios_ppl_rise),
                        full + int(self.cfg.kv_budget_mb * 2**20), self.cfg.llm_slot_tokens)

    def pool(self, model: str) -> list[Candidate]:
        """The top-k candidates sharing the served model's tokenizer (it first when tied)."""
        rows = {r["name"]: candidate_of(r) for r in self.store.repository_candidates()}
        own = rows.get(model)
        if own is None:
            return []
        family = [own] + [c for n, c in sorted(rows.items()) if n != model
                          and c.family == own.family]
        slo = Slo(family=own.family)
        budget = max(weight_bytes(c, c.n_layers) for c in family) \
            + int(self.cfg.kv_budget_mb * 2**20)
        ranked = select_top_k(family, slo, budget, tokens_per_request=self.cfg.llm_slot_tokens)
        return sorted(ranked, key=lambda c: c.name != model)  # stable: the served one first

    def decide(self, model: str) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
        """(the decision in force, the new one stored now or None)."""
        pool = self.pool(model)
        current = self.store.latest_helios_decision(model)
        if not pool:
            return current, None
        served: list[Served] = []
        pht = [pht_of(r) for r in self.store.pht_rows(model)]
        if current is not None and current.get("assessment") is not None:
            a = int(current["assessment"])
            covered = {(r.candidate, r.loaded_depth): r.tokens for r in pht if r.assessment == a}
            served = [Served(p["candidate"], int(p["depth"]), int(p["requests"]),
                             int(p["tokens"]), covered.get((p["candidate"], int(p["depth"])), 0))
                      for p in self.store.assessment_progress(model, a)]
        step = next_step(current, pool, served, pht, self.settings(pool))
        return (current, None) if step is None else (current, self.record(model, step))

    def breach(self, alert: BreachAlert) -> dict[str, Any] | None:
        pool = self.pool(alert.model)
        current = self.store.latest_helios_decision(alert.model)
        if not pool:
            return None
        costs = SwitchCosts(LOAD_MS_PER_BYTE)
        step = on_breach(current, alert.decision, pool, [pht_of(r) for r in
                                                         self.store.pht_rows(alert.model)],
                         costs, self.settings(pool))
        return None if step is None else self.record(alert.model, step)

    def record(self, model: str, step: Step) -> dict[str, Any]:
        row = self.store.record_helios_decision(model, asdict(step))
        self.decisions += 1
        self.log.info("helios %s", logs.kv(model=model, id=row["id"], kind=step.kind,
                                           candidate=step.candidate, depth=step.depth,
                                           assessment=step.assessment, batch=step.batch))
        self.log.info("helios reason %s: %s", row["id"], step.reason)
        return row

    async def publish(self, model: str, row: dict[str, Any]) -> None:
        if self.nc is None:
            return
        choice = HeliosChoice(model, int(row["id"]), row["kind"], row["candidate"],
                              int(row["depth"]), row["assessment"], self.cfg.llm_threshold)
        await self.nc.publish(subjects.helios_decision(model), choice.encode())
        self.sent[model] = time.monotonic()

    async def tick(self, models: list[str]) -> None:
        for model in models:
            async with self.lock:
                try:
                    current, new = await asyncio.to_thread(self.decide, model)
                except Exception:  # store hiccup: the next tick tries again
                    self.log.exception("HELIOS decision for %s failed", model)
                    continue
                if new is not None:
                    await self.publish(model, new)
                elif current is not None and \
                        time.monotonic() - self.sent.get(model, 0.0) > REBROADCAST_S:
                    await self.publish(model, current)

    async def on_breach(self, msg: Any) -> None:
        try:
            alert = BreachAlert.decode(decode_map(msg.data))
        except Exception as exc:  # noqa: BLE001 - a bad alert is logged, the service goes on
            self.log.error("undecodable breach alert on %s: %r", msg.subject, exc)
            return
        async with self.lock:
            try:
                row = await asyncio.to_thread(self.breach, alert)
            except Exception:
                self.log.exception("HELIOS breach handling for %s failed", alert.model)
                return
            if row is not None:
                await self.publish(alert.model, row)


def generative(store: Any, models: list[str]) -> list[str]:
    """The served models that are HELIOS candidates (prepared generative models)."""
    names = {r["name"] for r in store.repository_candidates()}
    return [m for m in models if m in names]


async def serve(cfg: Config, stop: asyncio.Event) -> None:
    log = logs.setup("helios", cfg.log_level)
    store = Store(cfg.database_url)
    nc = await bus.connect_as(cfg, "optimizer", "offramp-helios")
    helios = Helios(nc, cfg, store, log)
    await nc.subscribe(subjects.helios_breach("*"), cb=helios.on_breach)
    models = await asyncio.to_thread(generative, store, list(cfg.models))
    gc_pauses.settle(cfg.gc_freeze)  # the startup heap: out of every later collection
    log.info("helios ready %s", logs.kv(models=",".join(models), ri=cfg.helios_ri,
                                        eval_prompts=cfg.helios_eval_prompts))
    mark_ready()
    try:
        while not stop.is_set():
            await helios.tick(models)
            try:
                await asyncio.wait_for(stop.wait(), TICK_S)
            except TimeoutError:
                pass
    finally:
        await bus.close(nc)
        store.close()

"""The tuner's role for generative models: per-head exit thresholds from token-level
feedback (``generation_thresholds``), deployed like every exit config.

Each move is stored first (a new ``exit_configs`` version in ``generation`` mode, thresholds
keyed by head layer, the reason naming the window figures) and then broadcast on
``offramp.config.<model>``, where LLM workers pick it up between rounds; the config in force
is re-broadcast every ``REBROADCAST_S`` so a worker that starts later serves it too. A
restarted tuner starts from the stored config, and one stored by hand (``offramp
exit-config``) becomes the starting point.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from schemas import subjects
from schemas.helios import GenerationTelemetry
from schemas.messages import GENERATION, ExitConfig
from services.common import logs
from services.tuner.generation_thresholds import GenerationThresholds

REBROADCAST_S = 5.0


class GenerationTuning:
    def __init__(self, nc: Any, cfg: Any, store: Any, log: Any) -> None:
        self.nc, self.cfg, self.store, self.log = nc, cfg, store, log
        self.loops: dict[str, GenerationThresholds] = {}
        self.deployed: dict[str, ExitConfig] = {}
        self.sent: dict[str, float] = {}

    def _loop(self, model: str) -> GenerationThresholds:
        if model not in self.loops:
            self.loops[model] = GenerationThresholds(1.0 - self.cfg.accuracy_loss)
            latest = self.store.latest_exit_config(model)
            if latest is not None and latest.mode == GENERATION:
                self.deployed[model] = ExitConfig(model, latest.version, GENERATION,
                                                  dict(latest.thresholds), list(latest.active))
        return self.loops[model]

    async def observe(self, telemetry: GenerationTelemetry) -> None:
        """Feed the streams' checked tokens; deploy the heads' moves, if any."""
        feedback = [f for r in telemetry.records for f in r.feedback]
        model = telemetry.model
        if not feedback and model not in self.loops:
            return  # no head scored yet: nothing to tune, nothing deployed to repeat
        loop = await asyncio.to_thread(self._loop, model)
        if feedback:
            loop.observe(feedback)
            current = self.deployed.get(model)
            moves = loop.decide(current.thresholds if current else {}, self.cfg.llm_threshold)
            if moves:
                thresholds = dict(current.thresholds) if current else {}
                thresholds.update({m.layer: m.after for m in moves})
                reason = "token feedback: " + "; ".join(m.text() for m in moves)
                row = await asyncio.to_thread(self.store.save_exit_config, model, thresholds,
                                              sorted(thresholds), GENERATION, reason)
                self.deployed[model] = ExitConfig(model, row.version, GENERATION, thresholds,
                                                  sorted(thresholds))
                self.log.info("generation thresholds %s: %s", logs.kv(
                    model=model, version=row.version), reason)
                self.sent.pop(model, None)
        await self.rebroadcast(model)

    async def rebroadcast(self, model: str) -> None:
        config = self.deployed.get(model)
        if config is None or time.monotonic() - self.sent.get(model, -1e9) < REBROADCAST_S:
            return
        await self.nc.publish(subjects.exit_config(model), config.encode())
        self.sent[model] = time.monotonic()

    def resume(self, model: str) -> None:
        """Start ``model``'s loop from its stored config (in a thread: it reads the store)."""
        self._loop(model)

    async def keep_broadcasting(self, stop: asyncio.Event) -> None:
        """The configs in force, again every ``REBROADCAST_S``: a worker that starts while no
        stream ends still gets them."""
        while not stop.is_set():
            for model in list(self.deployed):
                await self.rebroadcast(model)
            try:
                await asyncio.wait_for(stop.wait(), REBROADCAST_S)
            except TimeoutError:
                pass

    def adopt(self, config: ExitConfig) -> bool:
        """A generation config stored by someone else (e.g. pinned by hand): the new
        starting point. False when it is not one of ours to follow."""
        if config.mode != GENERATION or config.model not in self.loops:
            return False
        current = self.deployed.get(config.model)
        if current is None or config.version > current.version:
            self.deployed[config.model] = config
            self.loops[config.model].seen.clear()
        return True

"""A latency-mode worker caps a ramp that answered wrongly until the next exit config
(tiny batches through the real EfficientNet runtime)."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from types import SimpleNamespace

import numpy as np
import pytest

from schemas.messages import Batch, ExitConfig
from services.common import config as config_mod
from services.exits.exit_guard import ALERT_BACKOFF

MODEL = "efficientnet-lite0"


def _worker(models_dir, guard: bool = True):
    from services.runtime.manifest import Manifest
    from services.runtime.stage import StageRuntime
    from services.worker.service import StagePlan, Worker

    d = models_dir / MODEL
    manifest = Manifest.load(d)
    runtime = StageRuntime(d, manifest, 0, manifest.num_blocks)
    cfg = dataclasses.replace(config_mod.load(), feedback_backlog=0, exit_guard=guard)
    w = Worker(SimpleNamespace(max_payload=8 << 20), cfg,
               StagePlan(MODEL, 0, 1, 0, manifest.num_blocks), manifest, runtime, None,
               logging.getLogger("test"))
    w._publish = lambda msgs: None
    return w


def _batch(name: str, n: int = 8, seed: int = 0) -> Batch:
    frames = np.random.default_rng(seed).integers(0, 255, (n, 3, 224, 224), dtype=np.uint8)
    return Batch(name, MODEL, 0, "router.r", [f"{name}-{i}" for i in range(n)], 1,
                 {"image": frames})


def test_a_wrong_early_answer_caps_its_ramp_for_the_next_batches(models_dir) -> None:
    async def go():
        w = _worker(models_dir)
        cfg = ExitConfig(MODEL, 1, thresholds={3: 1.0}, active=[3])  # every sample exits
        w.config = cfg
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, w.compute, _batch("a"), cfg, 0.0)
        await asyncio.sleep(0)
        tel = w.telemetry.take()
        wrong = tel.ramp_pred[0] != tel.final_pred
        assert wrong.any(), "noise frames: ramp 3 disagrees with the model on some"
        cap = ALERT_BACKOFF * float(tel.ramp_score[0][wrong].min())
        assert w.guard.caps == {3: pytest.approx(cap)}
        # the next batch exits at ramp 3 only below the cap, though the config says 1.0
        await loop.run_in_executor(None, w.compute, _batch("b", seed=1), cfg, 0.0)
        await asyncio.sleep(0)
        tel = w.telemetry.take()
        exited = tel.exit_at == 3
        assert (tel.ramp_score[0][exited] < cap).all()
        assert (~exited).any() and tel.thresholds == {3: 1.0}  # telemetry keeps the config's
        # a new config clears the caps; feedback of an older config's run sets none
        w.next_config = dataclasses.replace(cfg, version=2)
        w._begin(inline=False)
        w._end()
        assert w.guard.caps == {}
        await loop.run_in_executor(None, w.compute, _batch("c"), cfg, 0.0)
        assert w.guard.caps == {}

    asyncio.run(asyncio.wait_for(go(), 60))


def test_off_with_offramp_exit_guard_0(models_dir, monkeypatch) -> None:
    async def go():
        assert _worker(models_dir, guard=False).guard is None
        monkeypatch.setenv("OFFRAMP_EXIT_GUARD", "0")
        assert config_mod.load().exit_guard is False

    asyncio.run(asyncio.wait_for(go(), 60))

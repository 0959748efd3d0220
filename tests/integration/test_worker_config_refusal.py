"""A worker refuses exit configs it cannot serve and keeps the last good one (tiny, real
runtime)."""

from __future__ import annotations

import asyncio
import logging
from types import SimpleNamespace

from schemas.codec import pack
from schemas.messages import ExitConfig
from services.common import config as config_mod


def _msg(body: dict | ExitConfig) -> SimpleNamespace:
    return SimpleNamespace(data=body.encode() if isinstance(body, ExitConfig) else pack(body))


async def _run(tiny_dir) -> list:
    from services.runtime.manifest import Manifest
    from services.runtime.stage import StageRuntime
    from services.worker.service import StagePlan, Worker

    manifest = Manifest.load(tiny_dir)
    runtime = StageRuntime(tiny_dir, manifest, 0, manifest.num_blocks)
    plan = StagePlan("tiny", 0, 1, 0, manifest.num_blocks)
    w = Worker(SimpleNamespace(max_payload=8 << 20), config_mod.load(), plan, manifest,
               runtime, None, logging.getLogger("test"))
    ramps = [r.index for r in manifest.ramps]
    good = ExitConfig("tiny", 5, thresholds={r: 0.1 for r in ramps}, active=ramps[:1])
    await w.on_config(_msg(good))
    seen = [w.next_config]
    bogus = {"v": 1, "model": "tiny", "version": 6, "thresholds": {ramps[0]: 0.1},
             "active": ramps[:1], "score": "bogus"}
    await w.on_config(_msg(bogus))
    seen.append(w.next_config)
    unknown = ExitConfig("tiny", 7, thresholds={99: 0.1}, active=[99])
    await w.on_config(_msg(unknown))
    seen.append(w.next_config)
    return seen


def test_invalid_exit_configs_are_refused_and_the_last_good_one_stays(tiny_dir, caplog):
    with caplog.at_level(logging.ERROR):
        seen = asyncio.run(_run(tiny_dir))
    assert [c.version for c in seen] == [5, 5, 5]
    assert "unknown score kind 'bogus'" in caplog.text
    assert "ramps [99] do not exist in this model" in caplog.text

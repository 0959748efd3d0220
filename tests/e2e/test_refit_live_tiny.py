"""The live refit path on the tiny model (one stage): the worker publishes sampled ramp
features with the final answer, and applies an exit config that names a refitted head
between batches, with every request answered."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import numpy as np
import pytest

from schemas import subjects
from schemas.messages import decode_map
from schemas.telemetry import RampFeatures
from services.common import config as config_mod
from services.exits.linear_head import LinearHead
from services.launcher.exit_config import set_exit_config
from services.loadgen.drive import await_config, drive
from services.runtime.manifest import Manifest
from services.runtime.ramp_heads import load_head, save_head
from services.store.repository import Store

pytestmark = pytest.mark.e2e
MODEL = "tiny"
STACK_ENV = {"OFFRAMP_RAMP_FEATURE_RATE": "1.0"}


def _inputs(n: int, seed: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [{"x": rng.standard_normal(16).astype(np.float32)} for _ in range(n)]


async def _await_version(stack, version: int) -> None:
    """Probe until a worker answers on ``version``: it warms a new head's sessions off the
    loop before it swaps the config in, which on a loaded machine outlasts a short run."""
    nc = await stack.connect("client", "e2e-refit-wait")
    try:
        await await_config(nc, MODEL, version, _inputs(1, 9)[0], timeout_s=60.0)
    finally:
        await nc.close()


async def _serve_and_listen(stack, n: int, seed: int) -> tuple[list, list[RampFeatures]]:
    nc = await stack.connect("client", "e2e-refit")
    tap = await stack.connect("observer", "e2e-refit-tap")
    got: list[RampFeatures] = []

    async def on(msg) -> None:
        got.append(RampFeatures.decode(decode_map(msg.data)))

    await tap.subscribe(subjects.ramp_features(MODEL), cb=on)
    await tap.flush()
    outs = await drive(nc, MODEL, _inputs(n, seed), concurrency=4, slo_ms=20000)
    await asyncio.sleep(1.0)
    await nc.close()
    await tap.close()
    return outs, got


def test_features_flow_and_a_refitted_head_is_served(stack, models_dir):
    manifest = Manifest.load(models_dir / MODEL)
    outs, feats = asyncio.run(_serve_and_listen(stack, 64, 0))
    assert all(o.ok for o in outs)
    ids = {i for f in feats for i in f.ids}
    assert ids == {o.request_id for o in outs}  # rate 1.0: every answered request
    f = feats[0]
    assert f.ramp_ids == sorted(r.index for r in manifest.ramps)  # inactive sites too
    for r, x in zip(f.ramp_ids, f.features, strict=True):
        assert x.shape[1] == load_head(models_dir / MODEL, manifest.ramp(r)).weight.shape[1]
    labels = {o.request_id: o.label for o in outs}
    assert all(labels[i] == int(p) for g in feats for i, p in zip(g.ids, g.final_pred))

    r = manifest.ramps[0]
    head = load_head(models_dir / MODEL, r)
    file, _ = save_head(models_dir / MODEL, r, 1, LinearHead(head.weight * 0.5, head.bias,
                                                             head.pool))
    cfg = replace(config_mod.load(), home=stack.home, database_url=f"sqlite:///{stack.db_path}")
    with Store(cfg.database_url) as store:
        store.save_ramp_head(MODEL, r.index, 1, file, "x" * 64, 10, 5, {
            "serving_agreement": 0.5, "agreement": 0.6, "serving_calibration": 0.1,
            "calibration": 0.1})
    assert set_exit_config(cfg, stack.url, MODEL, 0.0, [], str(r.index), "e2e",
                           [f"{r.index}=1"]) == 0
    with Store(cfg.database_url) as store:
        latest = store.latest_exit_config(MODEL)
    assert latest.heads == {r.index: file}
    asyncio.run(_await_version(stack, latest.version))
    outs, _ = asyncio.run(_serve_and_listen(stack, 64, 1))
    assert all(o.ok for o in outs)
    assert max(o.config_version for o in outs) == latest.version

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


def _worker_with_store(tiny_dir, store):
    from services.runtime.manifest import Manifest
    from services.runtime.stage import StageRuntime
    from services.worker.service import StagePlan, Worker

    manifest = Manifest.load(tiny_dir)
    runtime = StageRuntime(tiny_dir, manifest, 0, manifest.num_blocks)
    w = Worker(SimpleNamespace(max_payload=8 << 20), config_mod.load(),
               StagePlan("tiny", 0, 1, 0, manifest.num_blocks), manifest, runtime, store,
               logging.getLogger("test"))
    return w, [r.index for r in manifest.ramps]


async def _run_with_store(tiny_dir, store) -> list:
    w, ramps = _worker_with_store(tiny_dir, store)
    row = store.save_exit_config("tiny", {r: 0.2 for r in ramps}, ramps[:1], "latency", "test")
    issued = ExitConfig("tiny", row.version, thresholds=dict(row.thresholds),
                        active=list(row.active))
    forged = ExitConfig("tiny", 999_999, thresholds={r: 1.0 for r in ramps}, active=ramps[:1])
    mangled = ExitConfig("tiny", row.version, thresholds={r: 1.0 for r in ramps},
                         active=ramps[:1])
    seen = []
    for config in (forged, mangled, issued):
        await w.on_config(_msg(config))
        seen.append(None if w.next_config is None else w.next_config.version)
    return seen, row.version


def test_a_version_the_store_did_not_issue_is_refused(tiny_dir, tmp_path, caplog):
    from services.store.migrate import upgrade
    from services.store.repository import Store

    url = f"sqlite:///{tmp_path / 'store.db'}"
    upgrade(url)
    store = Store(url)
    try:
        with caplog.at_level(logging.ERROR):
            seen, version = asyncio.run(_run_with_store(tiny_dir, store))
    finally:
        store.close()
    assert seen == [None, None, version]  # forged and mangled refused, the issued one taken
    assert "the store issued no version 999999" in caplog.text
    assert f"version {version} differs from the one the store issued" in caplog.text


async def _catch_up(tiny_dir, store) -> list:
    w, ramps = _worker_with_store(tiny_dir, store)
    first = store.save_exit_config("tiny", {r: 0.2 for r in ramps}, ramps[:1], "latency", "a")
    w.config = ExitConfig("tiny", first.version, thresholds=dict(first.thresholds),
                          active=list(first.active))  # what the worker read while loading
    seen = []
    await w.catch_up_config()
    seen.append(w.next_config)  # nothing newer: nothing to take
    # stored and broadcast while the worker built its sessions, before it subscribed
    later = store.save_exit_config("tiny", {r: 0.3 for r in ramps}, ramps[:2], "compute", "b")
    await w.catch_up_config()
    seen.append(w.next_config)
    return seen, later


def test_a_config_published_before_the_worker_subscribed_is_caught_up_from_the_store(
        tiny_dir, tmp_path):
    from services.store.migrate import upgrade
    from services.store.repository import Store

    url = f"sqlite:///{tmp_path / 'store.db'}"
    upgrade(url)
    store = Store(url)
    try:
        seen, later = asyncio.run(_catch_up(tiny_dir, store))
    finally:
        store.close()
    assert seen[0] is None
    got = seen[1]
    assert (got.version, got.mode, sorted(got.active)) == \
        (later.version, "compute", sorted(later.active))

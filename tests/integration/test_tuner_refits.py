"""The tuner's refit role (services.tuner.service) on the prepared tiny model: sampled
features in, a judged head out as a versioned file, a ramp_heads row and an exit config
that names it; a restarted tuner resumes the heads in force; a pinned version rolls back."""

from __future__ import annotations

import asyncio
import logging
from types import SimpleNamespace

import numpy as np
import pytest

from schemas import subjects
from schemas.messages import ExitConfig, decode_map
from schemas.telemetry import RampFeatures
from services.common import config as config_mod
from services.launcher.exit_config import pinned_heads
from services.launcher.supervisor import register_prepared
from services.runtime.manifest import Manifest
from services.runtime.ramp_heads import load_head
from services.store.migrate import upgrade
from services.store.repository import Store
from services.tuner.service import Tuner

MODEL = "tiny"


class FakeBus:
    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes]] = []

    async def publish(self, subject: str, data: bytes) -> None:
        self.sent.append((subject, data))


@pytest.fixture()
def env(models_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("OFFRAMP_MODELS_DIR", str(models_dir))
    url = f"sqlite:///{tmp_path / 'store.db'}"
    upgrade(url)
    store = Store(url)
    yield SimpleNamespace(store=store, models_dir=models_dir, cfg=config_mod.load())
    store.close()


def _tuner(env) -> Tuner:
    tuner = Tuner(FakeBus(), env.cfg, env.store, logging.getLogger("test"))
    tuner.models[MODEL] = tuner.load(MODEL)
    return tuner


def _feature_msgs(models_dir, manifest: Manifest, n_msgs: int, per: int = 64, seed: int = 0):
    rng = np.random.default_rng(seed)
    heads = {r.index: load_head(models_dir / MODEL, r) for r in manifest.ramps}
    teacher = {r: rng.normal(0, 1, (manifest.classes, h.weight.shape[1]))
               for r, h in heads.items()}
    msgs = []
    for m in range(n_msgs):
        y = rng.integers(0, manifest.classes, per)
        feats = [(teacher[r][y] * 3 + rng.normal(0, 0.5, (per, h.weight.shape[1])))
                 .astype(np.float32) for r, h in heads.items()]
        data = RampFeatures(MODEL, "w", 1, [f"{m}-{i}" for i in range(per)], list(heads),
                            feats, y.astype(np.int32), None, 0.0).encode()
        msgs.append(SimpleNamespace(data=data))
    return msgs


async def _feed(tuner: Tuner, msgs) -> None:
    for msg in msgs:
        await tuner.on_features(msg)
        while tuner.tasks:  # let a refit round finish before the next message
            await asyncio.gather(*list(tuner.tasks))


def test_refits_are_judged_stored_and_deployed(env):
    manifest = Manifest.load(env.models_dir / MODEL)
    tuner = _tuner(env)
    mt = tuner.models[MODEL]
    assert mt.learner is not None and mt.heads == {}
    asyncio.run(_feed(tuner, _feature_msgs(env.models_dir, manifest, 6)))
    rows = env.store.ramp_heads(MODEL)
    assert rows, "no refit was accepted on a stream the prepared heads never saw"
    assert all(r["agreement"] > r["serving_agreement"] for r in rows)
    latest = env.store.latest_exit_config(MODEL)
    newest = env.store.latest_ramp_heads(MODEL)
    assert latest.heads == {r: h["file"] for r, h in newest.items()}
    for r, h in newest.items():
        assert (env.models_dir / MODEL / h["file"]).exists()
        assert mt.learner.versions[r] == h["version"]
    sent = [ExitConfig.decode(decode_map(d)) for s, d in tuner.nc.sent
            if s == subjects.exit_config(MODEL)]
    assert sent[-1].heads == latest.heads and sent[-1].version == latest.version
    assert all(mt.head_since[r] <= latest.version for r in newest)
    # the set and thresholds were chosen on recent inputs as the new heads score them
    assert "serve refitted heads" in latest.reason

    again = _tuner(env).models[MODEL]  # a restart resumes the heads in force
    assert again.heads == latest.heads
    for r, h in newest.items():
        np.testing.assert_allclose(again.learner.heads[r].weight,
                                   load_head(env.models_dir / MODEL, manifest.ramp(r),
                                             h["file"]).weight)
        assert again.next_version[r] == h["version"] + 1


def test_a_refit_that_gains_nothing_is_not_deployed(env):
    manifest = Manifest.load(env.models_dir / MODEL)
    tuner = _tuner(env)
    rng = np.random.default_rng(3)
    heads = tuner.models[MODEL].learner.heads
    msgs = []
    for m in range(6):  # labels are what the serving heads already say: nothing to gain
        feats = [rng.normal(0, 1, (64, h.weight.shape[1])).astype(np.float32)
                 for h in heads.values()]
        y = heads[manifest.ramps[0].index].logits(feats[0]).argmax(1)
        ys = y.astype(np.int32)
        msgs.append(SimpleNamespace(data=RampFeatures(
            MODEL, "w", 1, [f"{m}-{i}" for i in range(64)], list(heads), feats, ys, None,
            0.0).encode()))
    asyncio.run(_feed(tuner, msgs))
    first = manifest.ramps[0].index
    assert all(r["ramp"] != first for r in env.store.ramp_heads(MODEL))


def test_bad_features_are_logged_and_tuning_goes_on(env, caplog):
    tuner = _tuner(env)
    with caplog.at_level(logging.WARNING):
        asyncio.run(tuner.on_features(SimpleNamespace(data=b"\x81\xa1v\x01")))
    assert "bad ramp features" in caplog.text


def test_a_pinned_version_rolls_back_and_unknown_versions_are_refused(env):
    manifest = Manifest.load(env.models_dir / MODEL)
    tuner = _tuner(env)
    asyncio.run(_feed(tuner, _feature_msgs(env.models_dir, manifest, 6)))
    newest = env.store.latest_ramp_heads(MODEL)
    r = next(iter(newest))
    current = env.store.latest_exit_config(MODEL).heads
    assert r not in pinned_heads(env.store, MODEL, current, [f"{r}=0"])
    with pytest.raises(ValueError, match="no head version 99"):
        pinned_heads(env.store, MODEL, current, [f"{r}=99"])
    with pytest.raises(ValueError, match="RAMP=VERSION"):
        pinned_heads(env.store, MODEL, current, ["x"])


def test_the_tuner_adopts_a_pinned_head_set_by_hand(env):
    manifest = Manifest.load(env.models_dir / MODEL)
    tuner = _tuner(env)
    asyncio.run(_feed(tuner, _feature_msgs(env.models_dir, manifest, 6)))
    latest = env.store.latest_exit_config(MODEL)
    r = next(iter(latest.heads))
    heads = pinned_heads(env.store, MODEL, latest.heads, [f"{r}=0"])
    row = env.store.save_exit_config(MODEL, latest.thresholds, latest.active, "latency",
                                     "set by hand", heads)
    msg = ExitConfig(MODEL, row.version, "latency", row.thresholds, row.active, heads=row.heads)
    asyncio.run(tuner.on_config(SimpleNamespace(data=msg.encode())))
    mt = tuner.models[MODEL]
    assert mt.deployed == row.version and r not in mt.heads
    np.testing.assert_array_equal(mt.learner.heads[r].weight,
                                  load_head(env.models_dir / MODEL, manifest.ramp(r)).weight)
    assert mt.learner.versions[r] == 0 and mt.head_since[r] == row.version


def test_a_ramp_returns_to_its_prepared_head_when_the_stream_does(env):
    manifest = Manifest.load(env.models_dir / MODEL)
    tuner = _tuner(env)
    mt = tuner.models[MODEL]
    asyncio.run(_feed(tuner, _feature_msgs(env.models_dir, manifest, 6)))
    r = manifest.ramps[0].index
    assert r in mt.heads, "the first ramp was not refitted"
    stored = [h for h in env.store.ramp_heads(MODEL) if h["ramp"] == r]
    prepared = load_head(env.models_dir / MODEL, manifest.ramp(r))
    rng = np.random.default_rng(9)
    msgs = []
    for m in range(2):  # what the prepared head of ramp r says is what the final model says
        feats = [rng.normal(0, 1, (64, h.weight.shape[1])).astype(np.float32)
                 for h in mt.learner.heads.values()]
        y = prepared.logits(feats[0]).argmax(1).astype(np.int32)
        msgs.append(SimpleNamespace(data=RampFeatures(
            MODEL, "w", 1, [f"b{m}-{i}" for i in range(64)], list(mt.learner.heads), feats, y,
            None, 0.0).encode()))
    asyncio.run(_feed(tuner, msgs))
    latest = env.store.latest_exit_config(MODEL)
    assert r not in latest.heads and r not in mt.heads  # served from the prepared file again
    assert mt.learner.versions[r] == 0 and mt.head_since[r] == latest.version
    assert [h for h in env.store.ramp_heads(MODEL) if h["ramp"] == r] == stored  # no new file


def test_heads_refitted_for_an_earlier_preparation_cannot_be_pinned(env):
    manifest = Manifest.load(env.models_dir / MODEL)
    env.store.register_model(manifest.to_dict(), str(env.models_dir / MODEL))
    tuner = _tuner(env)
    asyncio.run(_feed(tuner, _feature_msgs(env.models_dir, manifest, 6)))
    newest = env.store.latest_ramp_heads(MODEL)
    r, head = next(iter(newest.items()))
    assert head["prepared"] == manifest.version
    current = env.store.latest_exit_config(MODEL).heads
    assert pinned_heads(env.store, MODEL, current, [f"{r}={head['version']}"])[r] == head["file"]
    # the model is prepared again: its ramps changed, the refitted heads belong to the old ones
    env.store.register_model({**manifest.to_dict(), "version": "f" * 64}, "/elsewhere")
    with pytest.raises(ValueError, match=f"no head version {head['version']} for the model as "
                                         "prepared now"):
        pinned_heads(env.store, MODEL, current, [f"{r}={head['version']}"])


def test_a_re_prepared_model_restarts_from_its_initial_deployment(env):
    model_dir = env.models_dir / MODEL
    manifest = Manifest.load(model_dir)
    register_prepared(env.store, model_dir, 0.05)
    first = env.store.latest_exit_config(MODEL)
    register_prepared(env.store, model_dir, 0.05)  # the same preparation: nothing changes
    assert env.store.latest_exit_config(MODEL).version == first.version
    # an earlier preparation served refitted heads and tuned thresholds
    env.store.register_model({**manifest.to_dict(), "version": "0" * 64}, str(model_dir))
    r = manifest.ramps[0].index
    env.store.save_exit_config(MODEL, {r: 0.4}, [r], "latency", "tuned",
                               {r: f"ramp_{r}.v3.aaaaaaaaaaaa.onnx"})
    register_prepared(env.store, model_dir, 0.05)
    latest = env.store.latest_exit_config(MODEL)
    assert latest.heads == {} and set(latest.thresholds.values()) == {0.0}
    assert latest.active == first.active and latest.reason.startswith("re-prepared (version")
    assert _tuner(env).models[MODEL].heads == {}  # a restarted tuner serves the prepared heads

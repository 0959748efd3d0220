"""Compute mode (E3) in the split worker on the tiny model: exited samples leave the batch,
survivors go on, selected samples feed back as shadow work, a later stage fuses partial
batches and answers each part's requests; answers match the full model's."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from types import SimpleNamespace

import numpy as np
import pytest

from schemas import subjects
from schemas.messages import Batch, ExitConfig, Results, decode_map
from schemas.telemetry import SampleTelemetry
from services.common import config as config_mod
from services.worker.compute_mode import Fused

MODEL = "tiny"
ALL = [0, 1, 2]


def _worker(models_dir, stage: int, cuts: list[int], config: ExitConfig, shadow_rate: float,
            sent: list, max_batch: int = 16):
    from services.runtime.manifest import Manifest
    from services.runtime.stage import StageRuntime
    from services.worker.service import StagePlan, Worker, plan_stages

    d = models_dir / MODEL
    manifest = Manifest.load(d)
    ranges = plan_stages(manifest.num_blocks, cuts)
    first, last = ranges[stage]
    runtime = StageRuntime(d, manifest, first, last)
    cfg = dataclasses.replace(config_mod.load(), shadow_rate=shadow_rate, max_batch=max_batch)
    w = Worker(SimpleNamespace(max_payload=8 << 20), cfg,
               StagePlan(MODEL, stage, len(ranges), first, last), manifest, runtime, None,
               logging.getLogger("test"))
    w.config = config
    w._publish = sent.extend
    w._publish_threadsafe = lambda messages, flush=False: sent.extend(messages)
    w.loop = SimpleNamespace(call_soon_threadsafe=lambda fn, *a: fn(*a))
    return w


def _inputs(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, 16)).astype(np.float32)


def _batch(n: int, router: str = "router.r", bid: str = "b1", seed: int = 0) -> Batch:
    return Batch(bid, MODEL, 0, router, [f"{bid}-{i}" for i in range(n)], 1,
                 {"x": _inputs(n, seed)})


def _run(w, batches: list[Batch]) -> None:
    w.compute_fused(Fused([(b, 0.0) for b in batches]), w.config)


def in_loop(test):
    """Workers live on an event loop: run the test body inside one."""
    def wrapper(*args, **kwargs):
        async def go():
            return test(*args, **kwargs)
        return asyncio.run(go())
    wrapper.__name__ = test.__name__
    wrapper.__wrapped__ = test
    return wrapper


def _results(sent, router: str = "router.r") -> list[Results]:
    return [Results.decode(decode_map(d)) for s, d in sent if s == router]


def _forwarded(sent, block: int = 2) -> list[Batch]:
    return [Batch.decode(decode_map(d)) for s, d in sent if s == subjects.stage(MODEL, block)]


def _config(threshold: float, mode: str = "compute") -> ExitConfig:
    return ExitConfig(MODEL, 1, mode, {r: threshold for r in ALL}, ALL)


def _reference(models_dir, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per sample: the ramp every ramp's top-1 (R x N) and the full model's top-1."""
    from services.runtime.manifest import Manifest
    from services.runtime.stage import StageRuntime
    from services.worker.stage_exec import execute

    d = models_dir / MODEL
    manifest = Manifest.load(d)
    rt = StageRuntime(d, manifest, 0, manifest.num_blocks)
    out = execute(rt, manifest.ramps, 0, manifest.num_blocks, {"x": x},
                  np.full(len(x), -1, np.int32), _config(0.0, "latency"))
    return np.stack(out.ramp_pred), out.output.argmax(axis=1)


@in_loop
def test_nothing_exits_every_row_goes_on_as_real_work(models_dir) -> None:
    sent: list = []
    w = _worker(models_dir, 0, [2], _config(0.0), 0.0, sent)
    _run(w, [_batch(6)])
    (nxt,) = _forwarded(sent)
    assert not nxt.shadow and nxt.ids == [f"b1-{i}" for i in range(6)]
    assert nxt.exit_at.tolist() == [-1] * 6 and nxt.ramp_pred.shape == (2, 6)
    (release,) = _results(sent)
    assert release.release and release.ids == []


@in_loop
def test_everything_exits_at_the_first_ramp_and_leaves_the_batch(models_dir) -> None:
    sent: list = []
    w = _worker(models_dir, 0, [2], _config(10.0), 0.0, sent)
    _run(w, [_batch(6)])
    assert _forwarded(sent) == []
    early, release = _results(sent)
    assert early.early and sorted(early.ids) == [f"b1-{i}" for i in range(6)]
    assert early.exits.tolist() == [0] * 6
    assert release.release


@in_loop
def test_selected_exits_run_on_as_shadow_work(models_dir) -> None:
    sent: list = []
    w = _worker(models_dir, 0, [2], _config(10.0), 1.0, sent)  # every sample selected
    _run(w, [_batch(5)])
    (shadow,) = _forwarded(sent)
    assert shadow.shadow and len(shadow.ids) == 5 and shadow.exit_at.tolist() == [0] * 5
    # the last stage runs it for feedback only: telemetry, no answer
    sent2: list = []
    last = _worker(models_dir, 1, [2], _config(10.0), 1.0, sent2)
    _run(last, [shadow])
    assert [r for r in _results(sent2) if r.ids] == []
    (tel,) = [SampleTelemetry.decode(decode_map(d)) for s, d in sent2
              if s == subjects.telemetry_samples(MODEL)] or [None]
    if tel is None:  # the buffer coalesces: take what it holds
        tel = last.telemetry.take()
    assert tel.ids == shadow.ids and tel.exit_at.tolist() == [0] * 5


@in_loop
def test_survivors_and_answers_match_the_full_model(models_dir) -> None:
    """Whatever leaves where, the answers are those the ramps and the final layer give on
    the whole batch: dropping rows must not change anyone's result."""
    x = _inputs(32, seed=3)
    ramp_pred, final = _reference(models_dir, x)
    batch = Batch("b1", MODEL, 0, "router.r", [f"b1-{i}" for i in range(32)], 1, {"x": x})
    for threshold in (0.3, 0.6, 0.9):
        sent: list = []
        w0 = _worker(models_dir, 0, [2], _config(threshold), 0.0, sent)
        _run(w0, [batch])
        fwd = _forwarded(sent)
        answers = {i: (r.labels[k], int(r.exits[k])) for r in _results(sent)
                   for k, i in enumerate(r.ids)}
        if fwd:
            w1 = _worker(models_dir, 1, [2], _config(threshold), 0.0, sent)
            _run(w1, fwd)
            answers.update({i: (r.labels[k], int(r.exits[k])) for r in _results(sent)
                            for k, i in enumerate(r.ids)})
        assert len(answers) == 32
        for i in range(32):
            label, exit_ = answers[f"b1-{i}"]
            assert label == (final[i] if exit_ < 0 else ramp_pred[exit_][i])


@in_loop
def test_a_later_stage_fuses_parts_and_answers_each_router(models_dir) -> None:
    sent: list = []
    parts = []
    for k, router in enumerate(("router.a", "router.b")):
        up: list = []
        w0 = _worker(models_dir, 0, [2], _config(0.0), 0.0, up)
        _run(w0, [_batch(3 + k, router, f"p{k}", seed=k)])
        parts += _forwarded(up)
    w1 = _worker(models_dir, 1, [2], _config(0.0), 0.0, sent)
    _run(w1, parts)
    a = [r for r in _results(sent, "router.a") if r.ids]
    b = [r for r in _results(sent, "router.b") if r.ids]
    assert sorted(i for r in a for i in r.ids) == ["p0-0", "p0-1", "p0-2"]
    assert sorted(i for r in b for i in r.ids) == ["p1-0", "p1-1", "p1-2", "p1-3"]
    assert w1.batch_sizes is not None


def test_fusion_holds_partial_batches_until_the_target_or_the_deadline(models_dir) -> None:
    async def go() -> tuple[int, int, int]:
        sent: list = []
        w = _worker(models_dir, 1, [2], _config(0.0), 0.0, sent, max_batch=8)
        part = _forwarded_part(models_dir, 3)
        now = time.monotonic()
        w.accept_compute(part, now)
        w.accept_compute(part, now)
        held = w.queue.qsize()  # 6 of 8 rows: held
        w.accept_compute(part, now)  # 9 >= 8: two parts leave fused, one is held
        full = w.queue.qsize()
        w.release_fused(1e9)  # its hold (or deadline) has come
        return held, full, w.queue.qsize()

    assert asyncio.run(go()) == (0, 1, 2)


def _forwarded_part(models_dir, n: int) -> Batch:
    up: list = []
    w0 = _worker(models_dir, 0, [2], _config(0.0), 0.0, up)
    _run(w0, [_batch(n)])
    (part,) = _forwarded(up)
    return part


@pytest.mark.parametrize("mode", ["latency", "compute"])
def test_the_mode_routes_batches(models_dir, mode: str) -> None:
    async def go() -> object:
        sent: list = []
        w = _worker(models_dir, 1, [2], _config(0.0, mode), 0.0, sent, max_batch=8)
        msg = SimpleNamespace(data=_forwarded_part(models_dir, 2).encode())
        w.on_batch(msg)
        return w.fusion.rows

    assert asyncio.run(go()) == (2 if mode == "compute" else 0)

"""A batch that fails is answered with an error result whose code says why: activations over
the NATS max_payload are ``payload_too_large``, anything else ``internal``; a stage worker
that succeeds forwards the batch and releases its credit."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from types import SimpleNamespace

import numpy as np

from schemas import errors, subjects
from schemas.messages import Batch, Results, decode_map
from services.common import config as config_mod

MODEL = "tiny"


def _run(models_dir, max_payload: int, batch: Batch) -> list[tuple[str, bytes]]:
    """What stage 0 (blocks 0..1) of tiny split in two publishes for ``batch``, in order."""
    from services.runtime.manifest import Manifest
    from services.runtime.stage import StageRuntime
    from services.worker.service import StagePlan, Worker

    d = models_dir / MODEL
    manifest = Manifest.load(d)
    runtime = StageRuntime(d, manifest, 0, 2)
    cfg = dataclasses.replace(config_mod.load(), inline_ms=1e9)  # every batch runs inline
    sent: list[tuple[str, bytes]] = []

    async def go() -> None:  # a worker lives on an event loop
        w = Worker(SimpleNamespace(max_payload=max_payload), cfg, StagePlan(MODEL, 0, 2, 0, 2),
                   manifest, runtime, None, logging.getLogger("test"))
        w._publish = sent.extend
        w.process_inline(batch, 0.0)

    asyncio.run(go())
    return sent


def _batch(n: int = 4, name: str = "x") -> Batch:
    x = np.random.default_rng(0).standard_normal((n, 16)).astype(np.float32)
    return Batch("b1", MODEL, 0, "router.r", [f"r{i}" for i in range(n)], 0, {name: x})


def _results(sent) -> list[Results]:
    return [Results.decode(decode_map(data)) for subject, data in sent if subject == "router.r"]


def test_activations_over_max_payload_fail_as_payload_too_large(models_dir) -> None:
    sent = _run(models_dir, 64, _batch())
    (res,) = _results(sent)
    assert res.error["code"] == errors.PAYLOAD_TOO_LARGE and "max_payload" in res.error["message"]
    assert res.ids == ["r0", "r1", "r2", "r3"] and res.release  # stage 0: credit back
    assert not [s for s, _ in sent if s == subjects.stage(MODEL, 2)]


def test_any_other_failure_is_internal(models_dir) -> None:
    sent = _run(models_dir, 8 << 20, _batch(name="not_an_input"))
    (res,) = _results(sent)
    assert res.error["code"] == errors.INTERNAL and res.release


def test_a_batch_that_fits_goes_to_the_next_stage(models_dir) -> None:
    sent = _run(models_dir, 8 << 20, _batch())
    (nxt,) = [Batch.decode(decode_map(d)) for s, d in sent if s == subjects.stage(MODEL, 2)]
    assert nxt.stage == 1 and nxt.ids == ["r0", "r1", "r2", "r3"] and nxt.inputs["x"].shape[0] == 4
    assert len(nxt.stage_ms) == 1 and nxt.exit_at.tolist() == [-1] * 4
    (release,) = _results(sent)
    assert release.release and release.ids == [] and release.error is None

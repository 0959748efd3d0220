"""A worker that was silent long enough for a router to take it for lost answers the batches
it received before the silence through the router (its Results carry the logits, no client
gets a reply from it); otherwise it answers clients directly."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from types import SimpleNamespace

import numpy as np

from schemas.messages import Batch, Results, decode_map
from services.common import config as config_mod

MODEL = "tiny"


def _answer(models_dir, silence: bool) -> list[tuple[str, bytes]]:
    """What a one-stage tiny worker publishes for a two-request batch with reply subjects,
    received before a silence of 1 s (or none)."""
    from services.runtime.manifest import Manifest
    from services.runtime.stage import StageRuntime
    from services.worker.service import StagePlan, Worker

    d = models_dir / MODEL
    manifest = Manifest.load(d)
    n = len(manifest.blocks)
    runtime = StageRuntime(d, manifest, 0, n)
    cfg = dataclasses.replace(config_mod.load(), inline_ms=1e9)  # every batch runs inline
    sent: list[tuple[str, bytes]] = []
    x = np.random.default_rng(0).standard_normal((2, 16)).astype(np.float32)
    batch = Batch("b1", MODEL, 0, "router.r", ["r0", "r1"], 0, {"x": x},
                  replies=["_INBOX.c.0", "_INBOX.c.1"], ages_ms=[1.0, 1.0],
                  slos_ms=[1e6, 1e6])

    async def go() -> None:
        w = Worker(SimpleNamespace(max_payload=8 << 20), cfg, StagePlan(MODEL, 0, 1, 0, n),
                   manifest, runtime, None, logging.getLogger("test"))
        w._publish = sent.extend
        now = time.monotonic()
        w.silence.beat(now - 1.2)
        if silence:
            w.silence.beat(now)          # 1.2 s since the last beat: a router gave up
        else:
            w.silence.beat(now - 1.0)
            w.silence.beat(now - 0.8)    # ... on time since
            w.silence.last_beat = now
        w.process_inline(batch, now - 1.1 if silence else now)

    asyncio.run(go())
    return sent


def test_after_a_silence_answers_go_through_the_router(models_dir) -> None:
    sent = _answer(models_dir, silence=True)
    assert [m[0] for m in sent if m[0].startswith("_INBOX")] == []
    (res,) = [Results.decode(decode_map(d)) for s, d, *_ in sent if s == "router.r"]
    assert res.ids == ["r0", "r1"] and not res.direct and res.release
    assert res.logits is not None and len(res.logits) == 2


def test_otherwise_clients_get_their_answers_directly(models_dir) -> None:
    sent = _answer(models_dir, silence=False)
    assert sorted(m[0] for m in sent if m[0].startswith("_INBOX")) == ["_INBOX.c.0", "_INBOX.c.1"]
    (res,) = [Results.decode(decode_map(d)) for s, d, *_ in sent if s == "router.r"]
    assert res.direct and res.logits is None

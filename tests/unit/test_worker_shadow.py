"""Shadow work in compute mode: after real work, but never starved. An aged shadow batch
runs before the next real batch, since feedback dropped under load would lose exactly the
exited rows of the sample and bias it (services/worker/compute_mode.py)."""

from __future__ import annotations

import asyncio
from collections import deque
from types import SimpleNamespace

import numpy as np

from schemas.messages import Batch
from services.worker.compute_mode import SHADOW_MAX_WAIT_S, ComputeMode


def shadow(name: str, rows: int, version: int = 1) -> Batch:
    return Batch(name, "m", 1, "offramp.results.r", [f"{name}-{i}" for i in range(rows)],
                 version, {"x": np.zeros((rows, 2), np.float32)}, shadow=True)


def worker(queued: int, *held: tuple[Batch, float], target: int = 16) -> SimpleNamespace:
    q: asyncio.Queue = asyncio.Queue()
    for _ in range(queued):
        q.put_nowait(("real", 0.0))
    return SimpleNamespace(shadow_work=deque(held), queue=q,
                           fusion=SimpleNamespace(target=target))


def due(w: SimpleNamespace, now: float):
    return ComputeMode.shadow_due(w, now)  # type: ignore[arg-type]


def test_shadow_work_waits_for_real_work_until_it_has_aged() -> None:
    w = worker(3, (shadow("a", 2), 10.0))
    assert due(w, 10.0 + SHADOW_MAX_WAIT_S / 2) is None       # real work first
    job = due(w, 10.0 + SHADOW_MAX_WAIT_S)                    # aged: before the next real one
    assert job is not None and [b.batch_id for b, _ in job.parts] == ["a"]
    assert not w.shadow_work


def test_idle_worker_runs_shadow_work_at_once_and_nothing_without_it() -> None:
    assert due(worker(0), 0.0) is None
    w = worker(0, (shadow("a", 2), 5.0))
    assert due(w, 5.0) is not None


def test_waiting_shadow_batches_of_one_config_run_fused_up_to_the_target() -> None:
    w = worker(0, (shadow("a", 6), 0.0), (shadow("b", 6), 0.1), (shadow("c", 6), 0.2),
               target=12)
    job = due(w, 1.0)
    assert [b.batch_id for b, _ in job.parts] == ["a", "b"]   # 12 rows: c would pass 12
    w = worker(0, (shadow("a", 2), 0.0), (shadow("b", 2, version=2), 0.1))
    assert [b.batch_id for b, _ in due(w, 1.0).parts] == ["a"]  # another config: apart
    assert [b.batch_id for b, _ in due(w, 1.0).parts] == ["b"]

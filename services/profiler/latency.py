"""Offline latency profiles: median latency of every block, every ramp and the full model
per batch size, measured through :class:`StageRuntime` (the code stage workers run), so
the optimizer plans with the costs a worker really pays on this device class.

No store or bus I/O here; :mod:`services.profiler.service` persists the rows.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from services.runtime.manifest import Manifest
from services.runtime.stage import StageRuntime
from services.runtime.timing import median_ms

BATCH_SIZES = (1, 4, 16)
RUNS = 15  # timed runs per (part, batch size); the median resists a busy machine
MIN_RUNS = 5  # ... but slow parts stop after this many once BUDGET_S is spent
BUDGET_S = 2.0  # so a large model at batch 16 does not hold the profiler for minutes
WARMUP = 3  # untimed runs first: allocations, kernel selection, caches
VAR_LEN = 128  # length used for a variable (-1) input axis, e.g. a sequence


def synthetic_inputs(manifest: Manifest, batch: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Inputs of the right shape and dtype: latency depends on shapes, not on values.
    Integer inputs (token ids, attention masks) are ones, a valid value for both."""
    rng = np.random.default_rng(seed)
    out = {}
    for t in manifest.inputs:
        shape = (batch, *(VAR_LEN if d < 0 else d for d in t.shape))
        dtype = np.dtype(t.dtype)
        if dtype.kind == "f":
            out[t.name] = rng.standard_normal(shape).astype(dtype)
        else:
            out[t.name] = np.ones(shape, dtype=dtype)
    return out


def measure(
    model_dir: Path,
    manifest: Manifest,
    batch_sizes: tuple[int, ...] = BATCH_SIZES,
    device: str = "auto",
    threads: int = 0,
    runs: int = RUNS,
    warmup: int = WARMUP,
    budget_s: float = BUDGET_S,
    inputs: Callable[[int], dict[str, np.ndarray]] | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> list[dict[str, Any]]:
    """Rows {kind, idx, batch_size, ms, runs}: every block alone, every ramp head on its
    block's output, and the full model (idx -1: all blocks as one range, no ramps, as a
    worker without active ramps runs it). ``ms`` is the median of ``runs`` timed runs
    (up to ``runs``; a slow part stops after MIN_RUNS once ``budget_s`` is spent on it).
    ``inputs(b)`` gives a batch of b model inputs (default: :func:`synthetic_inputs`).
    Raises :class:`Cancelled` as soon as ``should_stop()`` (checked between runs)."""
    if runs < 1 or warmup < 0 or not batch_sizes or min(batch_sizes) < 1:
        raise ValueError("need runs >= 1, warmup >= 0 and positive batch sizes")
    make = inputs or (lambda b: synthetic_inputs(manifest, b))
    stop = should_stop or (lambda: False)
    rt = StageRuntime(model_dir, manifest, 0, manifest.num_blocks, device=device, threads=threads)
    n = manifest.num_blocks
    rows: list[dict[str, Any]] = []

    def timed(kind: str, idx: int, b: int, fn: Callable[[], object]) -> None:
        ms, done = median_ms(fn, runs, warmup, budget_s, MIN_RUNS, stop)
        rows.append({"kind": kind, "idx": idx, "batch_size": b, "ms": ms, "runs": done})

    for b in sorted(set(batch_sizes)):
        feed = make(b)
        x: dict[str, np.ndarray] | np.ndarray = feed
        acts: dict[int, np.ndarray] = {}
        for i in range(n):
            timed("block", i, b, lambda i=i, x=x, feed=feed: rt.run_range(i, i + 1, x, feed))
            x = rt.run_block(i, x, feed)  # the next block's real input
            acts[i] = x
        block_ms = {row["idx"]: row["ms"] for row in rows
                    if row["kind"] == "block" and row["batch_size"] == b}
        for r in manifest.ramps:
            # Workers run a ramp head fused into its block's session: its cost is the fused
            # call minus the block alone, both as workers call them (as `prepare` measures).
            i = r.after_block
            x_in = feed if i == 0 else acts[i - 1]
            timed("ramp", r.index, b, lambda r=r, x_in=x_in, feed=feed: rt.run_range(
                r.after_block, r.after_block + 1, x_in, feed, r.index))
            rows[-1]["ms"] = round(max(rows[-1]["ms"] - block_ms[i], 0.001), 4)
        timed("full", -1, b, lambda feed=feed: rt.run_range(0, n, feed))
    return rows


def from_manifest(manifest: Manifest) -> list[dict[str, Any]]:
    """The rows ``measure`` would give, from the costs ``offramp prepare`` measured on this
    same device class (so a fresh stack does not spend its first minute re-measuring)."""
    rows: list[dict[str, Any]] = []
    for blk in manifest.blocks:
        rows += [{"kind": "block", "idx": blk.index, "batch_size": int(b), "ms": ms, "runs": 0}
                 for b, ms in blk.cost_by_batch.items()]
    for r in manifest.ramps:
        rows += [{"kind": "ramp", "idx": r.index, "batch_size": int(b), "ms": ms, "runs": 0}
                 for b, ms in r.cost_by_batch.items()]
    full = manifest.meta.get("unsplit_by_batch") or {}
    rows += [{"kind": "full", "idx": -1, "batch_size": int(b), "ms": ms, "runs": 0}
             for b, ms in full.items()]
    return rows

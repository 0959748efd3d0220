"""Run one stage's blocks and ramps on a batch (no I/O): shared by the worker and benchmarks."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from schemas import errors
from schemas.errors import ServingError
from schemas.messages import ExitConfig
from services.exits import depth_caps
from services.exits.decide import exits_at, ramp_outcome
from services.runtime.stage import active_in_order, as_numpy, block_ranges, ramps_after_blocks
from services.runtime.taps import tap_plan

# on_early(ramp, sample_indices, labels, scores, logits) for samples that exit at ``ramp``
EarlyCallback = Callable[[int, np.ndarray, np.ndarray, np.ndarray, np.ndarray], None]


@dataclass(slots=True)
class StageOutcome:
    output: np.ndarray          # activation for the next stage, or final logits
    ramp_ids: list[int]
    ramp_pred: list[np.ndarray]
    ramp_score: list[np.ndarray]
    exit_at: np.ndarray
    ms: float
    # ramp -> pooled features (float32 [batch, dim]) at its site, for every ramp of the
    # stage, active or not (``execute(features=True)``); else None
    features: dict[int, np.ndarray] | None = None


def execute(runtime, ramps, first: int, last: int, x, exit_at: np.ndarray, config: ExitConfig,
            on_early: EarlyCallback | None = None, ramp_ids: list[int] | None = None,
            ramp_pred: list[np.ndarray] | None = None,
            ramp_score: list[np.ndarray] | None = None,
            model_inputs: dict[str, np.ndarray] | None = None,
            features: bool = False, variant: str | None = None) -> StageOutcome:
    """Blocks ``first..last-1``; after each, the active ramps sited there (records kept for
    every sample, early callback for samples that pass their threshold), their heads the
    files ``config.heads`` names. ``x`` is the model inputs for stage 0, else the previous
    stage's activation; ``model_inputs`` holds the model inputs later blocks read (defaults
    to ``x`` when it is the inputs dict). ``features``: the outcome also holds the pooled
    features at every ramp site of the stage, from the same runtime calls. ``variant``: the
    subnet the batch runs, for a runtime that serves variants (``bad_request`` otherwise)."""
    if model_inputs is None and isinstance(x, dict):
        model_inputs = x
    t0 = time.perf_counter()
    ids, preds, scores = list(ramp_ids or []), list(ramp_pred or []), list(ramp_score or [])
    heads = getattr(config, "heads", None) or None
    # only what differs from the defaults is passed: a runtime may not know heads/features
    opts = {"heads": heads} if heads else {}
    opts |= variant_option(runtime, variant)
    feats: dict[int, np.ndarray] | None = {} if features else None
    got = {"features": feats} if features else {}

    def record(ramp: int, logits: np.ndarray) -> None:
        labels, score = ramp_outcome(logits, config.score)
        ids.append(ramp)
        preds.append(labels)
        scores.append(score)
        mask = exits_at(ramp, score, exit_at, config)
        if mask.any():
            exit_at[mask] = ramp
            if on_early is not None:
                idx = np.flatnonzero(mask)
                on_early(ramp, idx, labels[idx], score[idx], logits[idx])

    here = active_in_order(ramps, config.active)
    tapped = getattr(runtime, "tapped", None)  # a runtime without taps splits
    whole = tapped is not None and (first, last) == (runtime.first_block, runtime.last_block)
    sess = tapped(here, **opts, **({"features": True} if features else {})) \
        if (here or features) and whole else None
    if sess is not None:  # one call; each tap decides its exits as its head finishes
        plan = tap_plan(tuple((r, config.thresholds.get(r, 0.0)) for r in here), config.score)
        x, outcomes = runtime.run_tapped(sess, x, model_inputs, plan, exit_at, on_early, **got)
        if len(outcomes) != len(here):
            raise RuntimeError(f"taps of ramps {list(here)} reported {len(outcomes)} outcomes")
        for r, out in zip(here, outcomes):
            ids.append(r)
            preds.append(out[:, 0].astype(np.int32))
            scores.append(np.ascontiguousarray(out[:, 1]))
    else:
        ramp_after = ramps_after_blocks(ramps, here)
        for start, end in block_ranges(first, last, set(ramp_after)):
            at = ramp_after.get(end - 1, [])
            x, fused = runtime.run_range(start, end, x, model_inputs, at[0] if at else None,
                                         **opts, **got)
            for k, r in enumerate(at):
                record(r, fused if k == 0 else runtime.run_ramp(r, x, model_inputs, **opts))
    return StageOutcome(as_numpy(x), ids, preds, scores, exit_at,
                        (time.perf_counter() - t0) * 1e3, feats)


def variant_run(runtime, site_order: tuple[int, ...], variant: str | None,
                config: ExitConfig) -> tuple[ExitConfig, str | None]:
    """The exit config a batch of ``variant`` runs under, and the variant its runtime is
    given: a depth cap (:mod:`services.exits.depth_caps`) caps the config and the runtime
    runs the model as it is; any other variant goes to the runtime. ``site_order``: the
    model's ramps in site order. A malformed cap, or one at no ramp of the model, is a
    ``bad_request``."""
    if not depth_caps.is_cap(variant) or hasattr(runtime, "variants"):
        return config, variant
    try:
        return depth_caps.capped_config(config, site_order, depth_caps.cap_ramp(variant)), None
    except ValueError as exc:
        raise ServingError(errors.BAD_REQUEST, str(exc)) from None


def variant_option(runtime, variant: str | None) -> dict:
    """The ``variant`` argument for a runtime that serves variants; ``bad_request`` for a
    batch that names one to a runtime that does not."""
    if variant is None:
        return {}
    if not hasattr(runtime, "variants"):
        raise ServingError(errors.BAD_REQUEST, f"variant {variant!r}: this model serves no "
                           "variants")
    return {"variant": variant}


@dataclass(slots=True)
class ComputeOutcome:
    """A stage run in compute mode: only ``rows`` (positions in the incoming batch) are
    still in the batch at its end, ``output`` holds theirs."""

    output: np.ndarray
    rows: np.ndarray            # int64 positions of the rows ``output`` holds
    ramp_ids: list[int]
    ramp_pred: list[np.ndarray]  # per ramp, one entry per incoming row (-1: not evaluated)
    ramp_score: list[np.ndarray]  # per ramp, NaN where not evaluated
    exit_at: np.ndarray
    ms: float


def _take(value, keep: np.ndarray):
    if isinstance(value, dict):
        return {k: as_numpy(v)[keep] for k, v in value.items()}
    return as_numpy(value)[keep]


def execute_compute(runtime, ramps, first: int, last: int, x, exit_at: np.ndarray,
                    config: ExitConfig, on_early: EarlyCallback | None, keep: np.ndarray,
                    ramp_ids: list[int] | None = None,
                    ramp_pred: list[np.ndarray] | None = None,
                    ramp_score: list[np.ndarray] | None = None,
                    model_inputs: dict[str, np.ndarray] | None = None) -> ComputeOutcome:
    """Blocks ``first..last-1`` in compute mode (E3): after each active ramp the rows that
    exited there leave the batch, unless ``keep`` marks them (shadow work, which runs on to
    the final layer for feedback). Exits are answered through ``on_early`` with positions
    in the incoming batch. The stage runs as block ranges between active ramps (the batch
    changes size there), never as one tapped call."""
    if model_inputs is None and isinstance(x, dict):
        model_inputs = x
    t0 = time.perf_counter()
    n = len(exit_at)
    ids, preds, scores = list(ramp_ids or []), list(ramp_pred or []), list(ramp_score or [])
    heads = getattr(config, "heads", None) or None
    opts = {"heads": heads} if heads else {}
    rows = np.flatnonzero((exit_at < 0) | keep).astype(np.int64)
    if len(rows) < n:  # rows that arrive answered and not kept (never, from a stage before)
        x, model_inputs = _take(x, rows), _take(model_inputs, rows) if model_inputs else None
    here = active_in_order(ramps, config.active)
    ramp_after = ramps_after_blocks(ramps, here)
    for start, end in block_ranges(first, last, set(ramp_after)):
        if rows.size == 0:
            break
        at = ramp_after.get(end - 1, [])
        x, fused = runtime.run_range(start, end, x, model_inputs, at[0] if at else None, **opts)
        for k, r in enumerate(at):
            logits = fused if k == 0 else runtime.run_ramp(r, x, model_inputs, **opts)
            labels, score = ramp_outcome(logits, config.score)
            pred_row = np.full(n, -1, np.int32)
            score_row = np.full(n, np.nan, np.float32)
            pred_row[rows], score_row[rows] = labels, score
            ids.append(r)
            preds.append(pred_row)
            scores.append(score_row)
            mask = exits_at(r, score, exit_at[rows], config)
            if mask.any():
                exit_at[rows[mask]] = r
                if on_early is not None:
                    on_early(r, rows[mask], labels[mask], score[mask], logits[mask])
        stay = (exit_at[rows] < 0) | keep[rows]
        if not stay.all():
            x = _take(x, stay)
            model_inputs = _take(model_inputs, stay) if model_inputs else None
            rows = rows[stay]
    out = as_numpy(x) if rows.size else np.zeros((0,), np.float32)
    return ComputeOutcome(out, rows, ids, preds, scores, exit_at,
                          (time.perf_counter() - t0) * 1e3)

"""Replay traces: what every candidate ramp said about every input of a stream, once.

Apparate runs every input to the end of the model, so a live system sees each active ramp's
top-1 and exit score plus the final top-1 for every sample. A trace records that for *all*
candidate sites, so the simulator can replay any policy (any active set, any thresholds)
over the same stream without new inference. Format (``.npz``, R sites, N samples):

- ``ramp_pred``    int   R x N   top-1 of the ramp at each candidate site
- ``ramp_score``   float R x N   exit score (``services.exits.scores``: lower = more confident)
- ``final_pred``   int   N       top-1 of the full model
- ``prefix_ms``    float R + 1   latency from the input to each site; the last entry is the
                                 full model (batch 1, no ramps)
- ``ramp_cost_ms`` float R       latency each ramp adds to a sample that reaches it
- ``arrival_s``    float N       optional arrival times (seconds from the start, sorted)
- ``meta_json``    str           optional provenance (model, score kind, workload, ...)

With ``trace record --features`` (what ``offramp+refit`` replays need), per site ``k``:

- ``features_k``     float32 N x C_k   the pooled activation the ramp's linear layer reads
- ``head_weight_k``  float32 K x C_k   the prepared head's linear layer (K classes) ...
- ``head_bias_k``    float32 K         ... and its bias
- ``final_logits``   float32 N x K     optional: the final model's logits (soft targets)

and ``meta["feature_share"]``: what publishing features adds to a run of the model, as a
share of it (timed while recording; the replay charges it to the samples it samples).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from services.exits.exit_window import ExitWindow
from services.exits.latency_profile import LatencyProfile
from services.exits.linear_head import LinearHead
from services.exits.scores import exit_score
from services.runtime.manifest import Manifest
from services.runtime.pooling import pool_np
from services.runtime.ramp_heads import load_head
from services.runtime.stage import StageRuntime
from services.tuner.ramp_learner import soft_temperature

_REQUIRED = ("ramp_pred", "ramp_score", "final_pred", "prefix_ms", "ramp_cost_ms")
SOFT_TARGET_CLASSES = 100  # final logits are kept up to this many classes (N x K floats)


class TraceError(ValueError):
    """A trace file or array that does not follow the format above."""


@dataclass(frozen=True, eq=False)
class TraceFeatures:
    """What each site's ramp head read, and the prepared head itself: enough to score any
    other head on the same samples (an online refit) without new inference."""

    by_site: list[np.ndarray]        # R arrays, float32 N x C_k
    weight: list[np.ndarray]         # R arrays, float32 K x C_k
    bias: list[np.ndarray]           # R arrays, float32 K
    final_logits: np.ndarray | None = None  # float32 N x K, or None

    def validate(self, n_sites: int, n: int) -> None:
        if not len(self.by_site) == len(self.weight) == len(self.bias) == n_sites:
            raise TraceError(f"features need one array, weight and bias per site ({n_sites}), "
                             f"got {len(self.by_site)}, {len(self.weight)}, {len(self.bias)}")
        for k, (f, w, b) in enumerate(zip(self.by_site, self.weight, self.bias, strict=True)):
            if f.ndim != 2 or f.shape[0] != n:
                raise TraceError(f"features_{k} must be N x C with N = {n}, got {f.shape}")
            if w.ndim != 2 or w.shape[1] != f.shape[1] or b.shape != (w.shape[0],):
                raise TraceError(f"head_weight_{k} / head_bias_{k} must be K x {f.shape[1]} and "
                                 f"K, got {w.shape} and {b.shape}")
        if self.final_logits is not None and (self.final_logits.ndim != 2
                                              or self.final_logits.shape[0] != n):
            raise TraceError(f"final_logits must be N x K with N = {n}, "
                             f"got {self.final_logits.shape}")

    def arrays(self) -> dict[str, np.ndarray]:
        out = {}
        for k, (f, w, b) in enumerate(zip(self.by_site, self.weight, self.bias, strict=True)):
            out |= {f"features_{k}": f.astype(np.float32), f"head_weight_{k}": w.astype(np.float32),
                    f"head_bias_{k}": b.astype(np.float32)}
        if self.final_logits is not None:
            out["final_logits"] = self.final_logits.astype(np.float32)
        return out

    @classmethod
    def from_arrays(cls, z, n_sites: int) -> TraceFeatures | None:
        """The features of an opened trace file, or None when it was recorded without."""
        if "features_0" not in z.files:
            return None
        missing = [f"{key}_{k}" for k in range(n_sites)
                   for key in ("features", "head_weight", "head_bias") if f"{key}_{k}" not in z.files]
        if missing:
            raise TraceError(f"the trace's features lack {', '.join(missing[:3])}")
        return cls([z[f"features_{k}"] for k in range(n_sites)],
                   [z[f"head_weight_{k}"] for k in range(n_sites)],
                   [z[f"head_bias_{k}"] for k in range(n_sites)],
                   z["final_logits"] if "final_logits" in z.files else None)


@dataclass(frozen=True, eq=False)
class Trace:
    ramp_pred: np.ndarray
    ramp_score: np.ndarray
    final_pred: np.ndarray
    prefix_ms: np.ndarray
    ramp_cost_ms: np.ndarray
    arrival_s: np.ndarray | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    features: TraceFeatures | None = None

    def __post_init__(self) -> None:
        self.validate()

    @property
    def n_sites(self) -> int:
        return int(self.ramp_pred.shape[0])

    @property
    def n_samples(self) -> int:
        return int(self.final_pred.shape[0])

    def validate(self) -> None:
        """Raise ``TraceError`` naming the first problem found (shape, dtype, range, order)."""
        fp = np.asarray(self.final_pred)
        if fp.ndim != 1 or fp.size == 0:
            raise TraceError(f"final_pred must be a non-empty 1-D array, got shape {fp.shape}")
        n = fp.size
        rp, rs = np.asarray(self.ramp_pred), np.asarray(self.ramp_score)
        if rp.ndim != 2 or rp.shape[1] != n:
            raise TraceError(f"ramp_pred must be R x N with N = {n} (final_pred), got {rp.shape}")
        r = rp.shape[0]
        if rs.shape != (r, n):
            raise TraceError(f"ramp_score must be {r} x {n} like ramp_pred, got {rs.shape}")
        if not (np.issubdtype(fp.dtype, np.integer) and np.issubdtype(rp.dtype, np.integer)):
            raise TraceError("ramp_pred and final_pred must hold integer labels")
        if not np.issubdtype(rs.dtype, np.floating) or not np.all(np.isfinite(rs)):
            raise TraceError("ramp_score must be finite floats")
        if rs.size and (rs.min() < 0 or rs.max() > 1):
            raise TraceError("ramp_score must lie in [0, 1] (lower = more confident)")
        prefix, cost = np.asarray(self.prefix_ms), np.asarray(self.ramp_cost_ms)
        if prefix.shape != (r + 1,):
            raise TraceError(f"prefix_ms needs R + 1 = {r + 1} entries (one per site, then the "
                             f"full model), got shape {prefix.shape}")
        if cost.shape != (r,):
            raise TraceError(f"ramp_cost_ms needs R = {r} entries, got shape {cost.shape}")
        try:
            LatencyProfile.build(prefix, cost)
        except ValueError as exc:
            raise TraceError(f"bad latency profile: {exc}") from None
        if self.arrival_s is not None:
            a = np.asarray(self.arrival_s)
            if a.shape != (n,):
                raise TraceError(f"arrival_s needs one time per sample ({n}), got {a.shape}")
            if not np.all(np.isfinite(a)) or (n and a[0] < 0) or np.any(np.diff(a) < 0):
                raise TraceError("arrival_s must be finite, >= 0 and sorted")
        if self.features is not None:
            self.features.validate(r, n)
        object.__setattr__(self, "ramp_pred", rp.astype(np.int64, copy=False))
        object.__setattr__(self, "ramp_score", rs.astype(np.float64, copy=False))
        object.__setattr__(self, "final_pred", fp.astype(np.int64, copy=False))
        object.__setattr__(self, "prefix_ms", prefix.astype(np.float64, copy=False))
        object.__setattr__(self, "ramp_cost_ms", cost.astype(np.float64, copy=False))
        if self.arrival_s is not None:
            object.__setattr__(self, "arrival_s", np.asarray(self.arrival_s, np.float64))

    def profile(self) -> LatencyProfile:
        return LatencyProfile.build(self.prefix_ms, self.ramp_cost_ms)

    def agreement_by_site(self) -> list[float]:
        """Each site's top-1 agreement with the final model over the whole trace."""
        return [float(a) for a in (self.ramp_pred == self.final_pred[None]).mean(axis=1)]

    def window(self, ramp_ids: tuple[int, ...], start: int = 0, stop: int | None = None
               ) -> ExitWindow:
        """Samples [start, stop) as the tuner would see them with ``ramp_ids`` active."""
        ids = list(ramp_ids)
        return ExitWindow(tuple(ids), self.ramp_pred[ids, start:stop],
                          self.ramp_score[ids, start:stop], self.final_pred[start:stop])

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        score = self.ramp_score.astype(np.float32)
        if not np.array_equal(score, self.ramp_score):  # keep float64 when float32 would round
            score = self.ramp_score
        arrays: dict[str, np.ndarray] = {
            "ramp_pred": self.ramp_pred.astype(np.int32), "ramp_score": score,
            "final_pred": self.final_pred.astype(np.int32), "prefix_ms": self.prefix_ms,
            "ramp_cost_ms": self.ramp_cost_ms, "meta_json": np.array(json.dumps(self.meta))}
        if self.arrival_s is not None:
            arrays["arrival_s"] = self.arrival_s
        if self.features is not None:
            arrays |= self.features.arrays()
        tmp = path.with_name(f".{path.name}.tmp.npz")
        np.savez_compressed(tmp, **arrays)
        tmp.replace(path)
        return path

    @classmethod
    def load(cls, path: str | Path) -> Trace:
        path = Path(path)
        if not path.is_file():
            raise TraceError(f"no trace file at {path}")
        try:
            z = np.load(path, allow_pickle=False)
        except Exception as exc:  # noqa: BLE001 - any unreadable file is a trace error
            raise TraceError(f"{path} is not a readable .npz trace: {exc}") from None
        with z:
            missing = [k for k in _REQUIRED if k not in z.files]
            if missing:
                raise TraceError(f"{path} lacks {', '.join(missing)} (a trace needs "
                                 f"{', '.join(_REQUIRED)}; arrival_s is optional)")
            meta = json.loads(str(z["meta_json"])) if "meta_json" in z.files else {}
            # float32 scores come back as float64 holding the same values: replays are exact
            return cls(z["ramp_pred"], z["ramp_score"].astype(np.float64), z["final_pred"],
                       z["prefix_ms"], z["ramp_cost_ms"],
                       z["arrival_s"] if "arrival_s" in z.files else None, meta,
                       TraceFeatures.from_arrays(z, z["ramp_pred"].shape[0]))


PROGRESS_EVERY_S = 2.0  # between progress lines


def _report(progress: Callable[[str], None], name: str, done: int, total: int | None,
            t0: float) -> float:
    now = time.perf_counter()
    of = f"/{total}" if total else ""
    progress(f"trace {name}: {done}{of} samples ({done / max(now - t0, 1e-9):.1f}/s)")
    return now


FEATURE_SHARE_RUNS = 150  # pairs of runs timing the features' cost (feature_share) ...
FEATURE_SHARE_S = 5.0     # ... unless they take longer than this (a slow model: 20 at least)


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _features_of(rt: StageRuntime, chunk: dict[str, np.ndarray] | np.ndarray,
                 heads: dict[int, LinearHead]) -> tuple[np.ndarray, dict[int, np.ndarray],
                                                     dict[int, np.ndarray]]:
    """``StageRuntime.run_all`` plus what each ramp's linear layer reads."""
    feats: dict[int, np.ndarray] = {}

    def pool(r: int, x: np.ndarray, model_inputs: dict[str, np.ndarray] | None) -> None:
        names = rt.manifest.ramp(r).inputs
        mask = model_inputs[names[0]] if names and model_inputs else None
        feats[r] = pool_np(x, heads[r].pool, mask).astype(np.float32)

    final, logits = rt.run_all(chunk, on_site=pool)
    return final, logits, feats


def feature_share(rt: StageRuntime, sample: dict[str, np.ndarray] | np.ndarray,
                  runs: int = FEATURE_SHARE_RUNS) -> float:
    """What outputting every ramp site's pooled features adds to a run of the whole stage
    on ``sample`` (one input), as a share of the run: what a worker pays on the batches
    whose features it publishes. The two kinds of run alternate and the share is the median
    of the pairs' differences over the median plain run: a busy machine slows both alike,
    so the share holds where the milliseconds would not."""
    def once(features: bool) -> float:
        t0 = time.perf_counter()
        rt.run_range(rt.first_block, rt.last_block, sample, features={} if features else None)
        return time.perf_counter() - t0

    for _ in range(3):  # sessions built and warm
        once(False)
        once(True)
    pairs: list[tuple[float, float]] = []
    start = time.perf_counter()
    while len(pairs) < runs and (len(pairs) < 20 or time.perf_counter() - start < FEATURE_SHARE_S):
        pairs.append((once(False), once(True)))
    got = np.array(pairs)
    return max(0.0, float(np.median(got[:, 1] - got[:, 0]) / np.median(got[:, 0])))


def record_trace(model_dir: str | Path, inputs: Iterator[dict[str, np.ndarray]],
                 score: str = "max_softmax", arrivals: np.ndarray | None = None,
                 progress: Callable[[str], None] | None = _stderr, total: int | None = None,
                 device: str = "cpu", meta: dict[str, Any] | None = None,
                 features: bool = False) -> Trace:
    """Run a prepared model in process with every ramp active over ``inputs`` (chunks of
    samples, dict by input name) and record each ramp's top-1 and exit score and the final
    top-1 (``features``: also what each head read, the heads, the final logits of a model
    with at most ``SOFT_TARGET_CLASSES`` classes, and ``feature_share``). Latencies come
    from the manifest (measured once at preparation), not from this run, so a trace does not
    depend on how loaded the machine was while recording; ``feature_share`` is a ratio of
    alternating runs, which a busy machine slows alike."""
    model_dir = Path(model_dir)
    manifest = Manifest.load(model_dir)
    if not manifest.ramps:
        raise TraceError(f"{manifest.name} has no ramps: nothing to trace")
    rt = StageRuntime(model_dir, manifest, 0, manifest.num_blocks, device=device)
    ids = sorted(r.index for r in manifest.ramps)
    heads = {i: load_head(model_dir, manifest.ramp(i)) for i in ids} if features else {}
    rec = _Recording(ids, score, keep_logits=features and manifest.classes <= SOFT_TARGET_CLASSES)
    t0 = said = time.perf_counter()
    first: dict[str, np.ndarray] | np.ndarray | None = None
    for chunk in inputs:
        if first is None:
            first = {k: v[:1] for k, v in chunk.items()} if isinstance(chunk, dict) else chunk[:1]
        if features:
            rec.add(*_features_of(rt, chunk, heads))
        else:
            rec.add(*rt.run_all(chunk), {})
        if progress is not None and time.perf_counter() - said >= PROGRESS_EVERY_S:
            said = _report(progress, manifest.name, rec.done, total, t0)
    if progress is not None and rec.done:
        _report(progress, manifest.name, rec.done, total, t0)  # the last line: what was recorded
    if not rec.finals:
        raise TraceError("no inputs given: a trace needs at least one sample")
    prof = LatencyProfile.from_manifest(manifest)
    share = {"feature_share": round(feature_share(rt, first), 4)} if features else {}
    info = {"model": manifest.name, "model_version": manifest.version, "score": score,
            "ramp_ids": ids, "after_block": [manifest.ramp(i).after_block for i in ids],
            "latency_source": "manifest serving profile, batch 1 (LatencyProfile.from_manifest)",
            **({"head_pools": [heads[i].pool for i in ids]} if features else {}), **share,
            "trained": [bool(manifest.ramp(i).trained) for i in ids],
            **_targets_of(manifest), **(meta or {})}
    return Trace(np.concatenate(rec.preds, axis=1),
                 np.concatenate(rec.scores, axis=1).astype(np.float64),
                 np.concatenate(rec.finals), prof.prefix_ms, prof.ramp_cost_ms, arrivals, info,
                 rec.trace_features(heads) if features else None)


def _targets_of(manifest: Manifest) -> dict[str, Any]:
    """What the model's ramps learned (its preparation recipe): soft targets carry their
    temperature, so a replay's refits learn the same."""
    temperature = soft_temperature(str(manifest.meta.get("recipe", "")))
    if temperature is not None:
        return {"ramp_targets": "softmax", "soft_temperature": temperature}
    return {"ramp_targets": "top1"}


class _Recording:
    """The arrays of a trace as its chunks come in."""

    def __init__(self, ids: list[int], score: str, keep_logits: bool) -> None:
        self.ids, self.score, self.keep_logits = ids, score, keep_logits
        self.preds: list[np.ndarray] = []
        self.scores: list[np.ndarray] = []
        self.finals: list[np.ndarray] = []
        self.final_logits: list[np.ndarray] = []
        self.feats: dict[int, list[np.ndarray]] = {i: [] for i in ids}
        self.done = 0

    def add(self, final: np.ndarray, ramp_logits: dict[int, np.ndarray],
            feats: dict[int, np.ndarray]) -> None:
        self.preds.append(np.stack([ramp_logits[i].argmax(axis=1) for i in self.ids]))
        self.scores.append(np.stack([exit_score(ramp_logits[i], self.score) for i in self.ids]))
        self.finals.append(final.argmax(axis=1))
        if self.keep_logits:
            self.final_logits.append(final.astype(np.float32))
        for i, f in feats.items():
            self.feats[i].append(f)
        self.done += final.shape[0]

    def trace_features(self, heads: dict[int, LinearHead]) -> TraceFeatures:
        return TraceFeatures([np.concatenate(self.feats[i]) for i in self.ids],
                             [heads[i].weight for i in self.ids],
                             [heads[i].bias for i in self.ids],
                             np.concatenate(self.final_logits) if self.keep_logits else None)

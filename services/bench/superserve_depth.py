"""The live SuperServe bench on an early-exit model, exit depth as the variant: what
``superserve_live`` needs besides a supernet's (variants, inputs, how accuracy is scored).

The model runs in compute mode with its initial exit config (thresholds 0: no sample
leaves before its cap), so each depth cap is a fixed-depth model sharing one set of
weights, and ``depth<=final`` is the model itself. Variants are the caps the stack's
registration estimates (:func:`services.exits.depth_caps.cap_profile`); the stack's
profiler replaces them with measured ones as feedback comes in. Accuracy is measured per
answer: agreement with the full model's top-1 on the same input, computed here offline.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from services.bench.e3_inputs import model_inputs
from services.exits.depth_caps import SOURCE_MEASURED, cap_accuracy, cap_profile
from services.exits.initial import initial_ramps
from services.profiler.latency import from_manifest
from services.runtime.manifest import Manifest

REF_BATCH = 16
MEASURE_WAIT_S = 300.0  # the profiler measures a model in well under a minute here


def cap_frontier(manifest: Manifest, ramp_budget: float) -> list[dict[str, Any]]:
    """The pareto depth caps a fresh stack registers, least accurate first, in the format
    of a supernet's frontier rows (``subnet``, ``agreement``, ``latency_ms`` by str batch)."""
    doc = manifest.to_dict()
    rows = cap_profile(doc, from_manifest(manifest), initial_ramps(manifest, ramp_budget),
                       cap_accuracy(doc, {}))
    front = [{"subnet": r["variant"], "agreement": r["accuracy"],
              "latency_ms": {str(b): ms for b, ms in r["latency_ms"].items()}}
             for r in rows if r["pareto"]]
    return sorted(front, key=lambda r: r["agreement"])


def bench_inputs(manifest: Manifest, n: int, seed: int) -> list[dict[str, np.ndarray]]:
    """``n`` real inputs of the model's workload, one dict per request."""
    chunks, _about = model_inputs(manifest, n, seed)
    out: list[dict[str, np.ndarray]] = []
    for chunk in chunks:
        size = len(next(iter(chunk.values())))
        out += [{k: v[i] for k, v in chunk.items()} for i in range(size)]
    return out[:n]


def full_labels(model_dir, manifest: Manifest, inputs: list[dict[str, np.ndarray]]) -> np.ndarray:
    """The full model's top-1 on each input (the reference a depth cap is scored against)."""
    from services.runtime.stage import StageRuntime, as_numpy

    rt = StageRuntime(model_dir, manifest, 0, manifest.num_blocks)
    labels = []
    for s in range(0, len(inputs), REF_BATCH):
        part = inputs[s:s + REF_BATCH]
        x = {k: np.stack([p[k] for p in part]) for k in part[0]}
        out, _none = rt.run_range(0, manifest.num_blocks, x, x, None)
        labels.append(as_numpy(out).argmax(axis=1))
    return np.concatenate(labels)


def await_measured_caps(cfg, model: str, timeout_s: float = MEASURE_WAIT_S) -> None:
    """Wait until the stack's profiler has measured the caps on the workers' device class
    (the registration's estimates come from the preparing machine) and the router has had
    time to re-read them, so every policy starts from the same table."""
    from services.router.service import VARIANT_REFRESH_S
    from services.store.repository import Store

    deadline = time.monotonic() + timeout_s
    with Store(cfg.database_url) as store:
        while {r["source"] for r in store.subnet_profiles(model, pareto=False)} != {
                SOURCE_MEASURED}:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the profiler measured no depth caps of {model} in "
                                   f"{timeout_s:.0f} s: see its log")
            time.sleep(0.5)
    time.sleep(VARIANT_REFRESH_S + 1.0)

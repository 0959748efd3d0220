"""The live SuperServe bench on an early-exit model, exit depth as the variant: what
``superserve_live`` needs besides a supernet's (variants, inputs, how accuracy is scored).

The model runs in compute mode with the caps as its active ramps, thresholds 0 (no sample
leaves before its cap), so each depth cap is a fixed-depth model sharing one set of
weights, and ``depth<=final`` is the model itself. The caps are the lever's by default
(:func:`services.exits.depth_caps.lever_caps`), not the initial deployment's: the ramp
budget places latency-mode exits, and left the fastest cap at half the model's cost,
so one worker could not carry a burst when its peer died. Their profiles are estimated
(:func:`services.exits.depth_caps.cap_profile`) until the stack's profiler measures them.
Accuracy is measured per answer: agreement with the full model's top-1 on the same input,
computed here offline.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from services.bench.e3_inputs import model_inputs
from services.exits.depth_caps import SOURCE_MEASURED, cap_accuracy, cap_profile, lever_caps
from services.exits.initial import initial_ramps
from services.profiler.latency import from_manifest
from services.runtime.manifest import Manifest

REF_BATCH = 16
MEASURE_WAIT_S = 300.0  # the profiler measures a model in well under a minute here


def chosen_caps(manifest: Manifest, spec: str | None, ramp_budget: float) -> tuple[list[int], str]:
    """The ramps served as depth caps and where they come from: ``spec`` None (the default)
    the lever's (:func:`services.exits.depth_caps.lever_caps`), ``budget`` the initial
    deployment's within ``ramp_budget``, or a comma list of ramps. ValueError, saying
    which ramps exist, for a ramp that is not a trained ramp of the model."""
    doc = manifest.to_dict()
    if not spec:
        return lever_caps(doc), "the cheapest trained ramp and two spread over the model's cost"
    if spec == "budget":
        whence = (f"the initial deployment's, within the ramp budget ({ramp_budget:.1%}, "
                  "OFFRAMP_RAMP_BUDGET)")
        return initial_ramps(manifest, ramp_budget), whence
    trained = [r.index for r in manifest.ramps if r.trained and r.agreement is not None]
    try:
        caps = sorted({int(p) for p in spec.split(",") if p.strip()})
    except ValueError:
        caps = []
    if not caps or set(caps) - set(trained):
        raise ValueError(f"--caps {spec}: give budget or a comma list of {manifest.name}'s "
                         f"trained ramps ({', '.join(map(str, trained))})")
    return caps, "as --caps names them"


def cap_frontier(manifest: Manifest, caps: list[int]) -> list[dict[str, Any]]:
    """The pareto depth caps of ``caps`` (and the full model) a stack serving them
    registers, least accurate first, in the format of a supernet's frontier rows
    (``subnet``, ``agreement``, ``latency_ms`` by str batch)."""
    doc = manifest.to_dict()
    rows = cap_profile(doc, from_manifest(manifest), caps, cap_accuracy(doc, {}))
    front = [{"subnet": r["variant"], "agreement": r["accuracy"],
              "latency_ms": {str(b): ms for b, ms in r["latency_ms"].items()}}
             for r in rows if r["pareto"]]
    return sorted(front, key=lambda r: r["agreement"])


def serve_caps(store, manifest: Manifest, caps: list[int]) -> None:
    """Make ``caps`` the active ramps of ``manifest``'s exit config, in compute mode (where
    a cap stops the batch), thresholds 0 (no sample leaves before its cap)."""
    latest = store.latest_exit_config(manifest.name)
    if latest is not None and latest.mode == "compute" and sorted(latest.active) == caps:
        return
    store.save_exit_config(manifest.name, {r.index: 0.0 for r in manifest.ramps}, caps,
                           "compute", f"bench superserve: depth caps at ramps {caps}, "
                           "compute mode, thresholds 0")


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

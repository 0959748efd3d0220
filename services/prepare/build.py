"""The steps of preparing one model, in order: choose ramp sites, split the graph into
blocks, check the split, train the ramps on bootstrap data (or, without bootstrap data,
shape untrained zero heads from a few sample inputs), export them, measure what every
block and ramp costs through the runtime workers use, and write the manifest.

Imports torch and ONNX Runtime: ``services.prepare.pipeline`` loads this module only when
a model has to be built, so starting the stack on prepared models never pays for them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch

from services.prepare import ramps as rp
from services.prepare import sites
from services.prepare.export import to_onnx
from services.prepare.site_choice import SiteChoice
from services.prepare.source import Batches, ModelSource, SourceError
from services.runtime import onnx_blocks
from services.runtime.devices import device_class, pick_providers
from services.runtime.manifest import BlockSpec, Manifest, RampSpec, sha256_bytes
from services.runtime.stage import StageRuntime, active_in_order, as_numpy, session_options
from services.runtime.taps import tap_plan
from services.runtime.timing import costs_by_batch, interleaved_median_ms, marginal_ms, median_ms
from services.runtime.timing import tile as tile_batch

Log = Callable[[str], None]
BATCH_SIZES = (1, 4, 16)  # batch sizes whose block and ramp costs are measured
SERVE_MEASURE_S = 5.0  # paired timing of the tapped stage with every ramp against none
SITES_FILE = "sites.txt"  # the site analysis, human readable, next to the manifest
SHAPE_SAMPLES = 3  # sample inputs that shape untrained heads (those the split check runs)


@dataclass
class Build:
    """What the steps hand on to each other while one model is prepared in ``folder``."""

    src: ModelSource
    folder: Path
    device: str
    threads: int
    report: sites.SiteReport | None = None
    chosen: list[sites.Site] = field(default_factory=list)
    manifest: Manifest | None = None
    full_file: str = ""
    full_digest: str = ""
    full: ort.InferenceSession | None = None
    split_diff: float = 0.0
    seconds: dict[str, float] = field(default_factory=dict)
    bootstrap: bool = True  # False: untrained heads, no bootstrap data read

    @property
    def blocks(self) -> list[BlockSpec]:
        return self.manifest.blocks


def build(src: ModelSource, folder: Path, log: Log, progress: Log, n: int, device: str,
          threads: int, choice: SiteChoice, recipe: str, bootstrap_seed: int,
          bootstrap: bool = True) -> Manifest:
    """Prepare ``src`` into ``folder``: every step below, then the manifest. Without
    ``bootstrap`` the ramps are untrained zero heads and no bootstrap data is read."""
    b = Build(src, folder, device, threads, bootstrap=bootstrap)
    t0 = time.perf_counter()
    choose_sites(b, choice, log)
    split_model(b)
    log(f"split into {len(b.blocks)} blocks in {time.perf_counter() - t0:.1f} s")
    check_split(b)
    t1 = time.perf_counter()
    if bootstrap:
        feats = collect_features(b, n, bootstrap_seed, progress)
        t2 = time.perf_counter()
        fits = rp.train_ramps(feats, src.classes, src.pool, steps=src.ramp_steps, log=log,
                              targets=src.ramp_targets)
        b.seconds = {"features": round(t2 - t1, 2), "train": round(time.perf_counter() - t2, 2)}
    else:
        feats = site_shapes(b)
        fits = rp.untrained_ramps(feats, src.classes, src.pool)
        log(f"{len(fits)} untrained ramps (zero heads: the live refit trains them)")
        b.seconds = {"shapes": round(time.perf_counter() - t1, 2)}
    b.seconds = {"split": round(t1 - t0, 2), **b.seconds}
    export_ramps(b, feats, fits)
    rt, one = measure_costs(b)
    write_manifest(b, rt, one, feats, fits, recipe, bootstrap_seed, t0)
    return b.manifest


def choose_sites(b: Build, choice: SiteChoice, log: Log) -> None:
    """The feasible ramp sites of the graph, restricted and thinned as ``choice`` says."""
    report = sites.find_sites(b.src.model)
    keep = [int(k) if k.isdigit() else k for k in choice.keep] or None
    try:
        chosen = sites.select_sites(report, keep=keep)
    except ValueError as exc:
        raise SourceError(f"{b.src.name}: {exc}\n{report.summary()}") from None
    limit = choice.max_ramps or b.src.max_ramps
    if len(chosen) > limit:
        chosen = sites.thin_sites(chosen, limit, cheapest=True)
    if not chosen:
        raise SourceError(f"{b.src.name}: the graph has no feasible ramp site (no cut vertex "
                          f"with an N x C x H x W, N x S x H or N x F activation):\n"
                          f"{report.summary()}")
    log(f"ramp sites: {len(report.sites)} feasible, {len(report.rejected)} tensors rejected; "
        f"ramps at {len(chosen)}: " + ", ".join(s.tensor for s in chosen))
    b.report, b.chosen = report, chosen


def write_file(folder: Path, stem: str, data: bytes) -> tuple[str, str]:
    """Write ``data`` under a content-hashed name; (file name, sha256)."""
    digest = sha256_bytes(data)
    file = f"{stem}.{digest[:12]}.onnx"
    (folder / file).write_bytes(data)
    return file, digest


def split_model(b: Build) -> None:
    """One ONNX block per stretch between chosen sites, and the unsplit model beside them."""
    src = b.src
    parts = onnx_blocks.split_blocks(src.model, [s.tensor for s in b.chosen])
    blocks: list[BlockSpec] = []
    for i, part in enumerate(parts):
        file, digest = write_file(b.folder, f"block_{i}", part.SerializeToString())
        out = part.graph.output[0]
        blocks.append(BlockSpec(i, file, digest, [vi.name for vi in part.graph.input], [],
                                output_name=out.name))
    b.full_file, b.full_digest = write_file(b.folder, "full", src.model.SerializeToString())
    b.manifest = Manifest(
        name=src.name, version="", kind=src.kind, inputs=list(src.inputs),
        outputs=list(src.outputs), classes=src.classes, blocks=blocks, ramps=[],
        base_params=src.base_params, full_ms=0.0, bootstrap=b.bootstrap)


def check_split(b: Build) -> None:
    """The chained blocks must reproduce the unsplit model before anything builds on them."""
    so, providers = session_options(b.threads), pick_providers(b.device)
    b.full = ort.InferenceSession(str(b.folder / b.full_file), so, providers=providers)
    rt = StageRuntime(b.folder, b.manifest, 0, len(b.blocks), device=b.device, threads=b.threads)
    check = b.src.sample(3, 1)
    ref = b.full.run(None, check)[0]
    b.split_diff = float(np.abs(rt.run_all(check)[0] - ref).max())
    if not b.split_diff < 1e-4:
        raise RuntimeError(f"blocks of {b.src.name} differ from the unsplit model by "
                           f"{b.split_diff}")


def collect_features(b: Build, n: int, bootstrap_seed: int, progress: Log) -> rp.Features:
    """Pooled activations at every chosen site over ``n`` bootstrap samples, with the final
    model's answers: what the ramp heads are fitted on."""
    return probe_sites(b, b.src.bootstrap(n, bootstrap_seed), n, progress,
                       keep_logits=b.src.ramp_targets == "softmax")


def site_shapes(b: Build) -> rp.Features:
    """What untrained heads are shaped by (each site's raw shape, rank and pooled width),
    from the few sample inputs the split check runs: no bootstrap data."""
    few = b.src.sample(SHAPE_SAMPLES, 1)
    k = len(next(iter(few.values())))
    return probe_sites(b, iter([(few, np.zeros(k, np.int64))]), k, lambda _msg: None)


def probe_sites(b: Build, batches: Batches, total: int, progress: Log,
                keep_logits: bool = False) -> rp.Features:
    """One pass of the whole model over ``batches`` with every chosen site as an extra
    output, pooled as the ramps pool (``ramps.collect_features``)."""
    src = b.src
    masked = src.pool == "masked_mean"
    if masked and src.mask_input not in {t.name for t in src.inputs}:
        raise ValueError(f"{src.name}: masked_mean pooling reads model input "
                         f"{src.mask_input!r}, not one of {[t.name for t in src.inputs]}")
    so, providers = session_options(b.threads), pick_providers(b.device)
    probe = onnx_blocks.add_outputs(src.model, [s.tensor for s in b.chosen])
    probe_sess = ort.InferenceSession(probe.SerializeToString(), so, providers=providers)
    return rp.collect_features(probe_sess, [s.tensor for s in b.chosen], batches, total,
                               src.pool, progress, mask_input=src.mask_input if masked else "",
                               keep_logits=keep_logits)


def export_ramps(b: Build, feats: rp.Features, fits: list[rp.RampFit]) -> None:
    """Each fitted head as an ONNX file (reading the mask too where it pools over tokens)."""
    src, blocks = b.src, b.blocks
    masked = src.pool == "masked_mean"
    for k, shape in feats.shapes.items():
        blocks[k] = replace(blocks[k], output_shape=list(shape))
    blocks[-1] = replace(blocks[-1], output_shape=list(src.outputs[0].shape))
    ramps = []
    for k, fit in enumerate(fits):
        shape = feats.shapes[fit.after_block]
        spatial = {"x": {d + 1: f"d{d + 1}" for d in range(1, len(shape))}}  # keep C / H fixed
        example, names, reads = (torch.zeros(1, *shape),), ["x"], []
        if masked and len(shape) == 2:  # N x S x H: the head also reads the mask (N x S)
            dtype = getattr(torch, np.dtype(next(t.dtype for t in src.inputs
                                                 if t.name == src.mask_input)).name)
            example += (torch.ones(1, shape[0], dtype=dtype),)
            names, reads = ["x", src.mask_input], [src.mask_input]
            spatial[src.mask_input] = {1: "d1"}
        data = to_onnx(rp.head_module(fit), example, names, ["logits"], dynamic=spatial)
        file, digest = write_file(b.folder, f"ramp_{k}", data)
        ramps.append(RampSpec(k, fit.after_block, file, digest, fit.arch, fit.params,
                              round(fit.agreement, 4) if fit.trained else None, 0.0,
                              b.chosen[fit.after_block].tensor, inputs=reads,
                              trained=fit.trained))
    b.manifest.ramps = ramps


def _batch(inp: dict[str, np.ndarray] | np.ndarray, b: int) -> dict[str, np.ndarray] | np.ndarray:
    return tile_batch(inp, b) if isinstance(inp, dict) else np.repeat(inp, b, axis=0)


def measure_costs(b: Build) -> tuple[StageRuntime, dict[str, np.ndarray]]:
    """Costs on this machine through the runtime workers use: per block and ramp, per batch
    size, then what serving pays per ramp (:func:`serving_costs`)."""
    blocks, ramps = b.blocks, b.manifest.ramps
    rt = StageRuntime(b.folder, b.manifest, 0, len(blocks), device=b.device, threads=b.threads)
    one = b.src.sample(1, 2)
    acts: list[np.ndarray] = []
    x: dict[str, np.ndarray] | np.ndarray = one
    for i in range(len(blocks)):
        by_batch = costs_by_batch(lambda n, i=i, inp=x: rt.run_block(
            i, _batch(inp, n), tile_batch(one, n)), BATCH_SIZES)
        blocks[i] = replace(blocks[i], cost_ms=by_batch["1"], cost_by_batch=by_batch)
        x = rt.run_block(i, x, one)
        acts.append(x)
    for k, r in enumerate(ramps):
        # What serving pays: the head runs fused into its block's session (see
        # StageRuntime.run_range), so its cost is the fused call minus the same call without.
        i = r.after_block
        inp = one if i == 0 else acts[i - 1]
        by_batch = {}
        for n in BATCH_SIZES:
            xb, ob = _batch(inp, n), tile_batch(one, n)
            by_batch[str(n)] = marginal_ms(
                lambda xb=xb, ob=ob, r=r, i=i: rt.run_range(i, i + 1, xb, ob, r.index),
                lambda xb=xb, ob=ob, i=i: rt.run_range(i, i + 1, xb, ob))
        ramps[k] = replace(r, cost_ms=by_batch["1"], cost_by_batch=by_batch)
    return rt, one


def serving_costs(rt: StageRuntime, ramps: list[RampSpec], n_blocks: int,
                  one: dict[str, np.ndarray]) -> float:
    """What a worker pays at batch 1, in place in ``ramps``: ``prefix_ms`` (the merged range
    from the input to the ramp's site) and ``serve_ms`` (activating the ramp, over the
    unsplit range; never below the head's own cost). Returns the unsplit range's latency.

    With taps (``services.runtime.taps``), the active heads run inside the one tapped call,
    where one head adds less than a whole-model call's noise: timed ramp by ramp,
    structurally identical heads read several times apart, and the budget would admit ramps
    by luck. So the tapped stage with every ramp is timed against the plain stage in one
    long paired measurement, and that extra time is shared out in proportion to each head's
    own cost (``cost_ms``, timed on its block alone, where the noise is small). Where taps
    are unavailable each ramp splits the stage: its serving cost is that split plus its
    head, timed ramp by ramp."""
    def upto(end: int) -> object:
        return as_numpy(rt.run_range(0, end, one)[0])

    # prefixes and the full range timed together (see interleaved_median_ms)
    *prefix_ms, range_ms = interleaved_median_ms(
        [lambda i=r.after_block: upto(i + 1) for r in ramps] + [lambda: upto(n_blocks)])
    order = active_in_order(ramps, [r.index for r in ramps])
    sess = rt.tapped(order) if order else None
    if sess is not None:  # nothing exits: the cost every sample pays
        plan = tap_plan(tuple((r, 0.0) for r in order), "max_softmax")
        running = np.full(1, -1, np.int32)  # a worker makes it with or without ramps

        def tapped() -> object:
            return as_numpy(rt.run_tapped(sess, one, one, plan, running)[0])

        extra = marginal_ms(tapped, lambda: upto(n_blocks), max_runs=4001,
                            budget_s=SERVE_MEASURE_S)
        heads = sum(r.cost_ms for r in ramps)
        scale = max(1.0, extra / heads) if heads > 0 else 1.0
    for k, r in enumerate(ramps):
        i = r.after_block
        if sess is not None:
            serve = r.cost_ms * scale
        elif i + 1 < n_blocks:
            def split(i: int = i, ramp: int = r.index) -> object:
                act, _ = rt.run_range(0, i + 1, one, one, ramp)
                return as_numpy(rt.run_range(i + 1, n_blocks, act, one)[0])

            serve = marginal_ms(split, lambda: upto(n_blocks))
        else:
            serve = r.cost_ms  # nothing runs after it: no split
        ramps[k] = replace(r, prefix_ms=prefix_ms[k], serve_ms=round(max(serve, r.cost_ms), 4))
    return range_ms


def write_manifest(b: Build, rt: StageRuntime, one: dict[str, np.ndarray], feats: rp.Features,
                   fits: list[rp.RampFit], recipe: str, bootstrap_seed: int, t0: float) -> None:
    """Serving costs, whole-model latencies and what was built how, into the manifest."""
    manifest, report = b.manifest, b.report
    range_ms = serving_costs(rt, manifest.ramps, len(b.blocks), one)
    manifest.full_ms = median_ms(lambda: rt.run_all(one, one))[0]
    unsplit_ms = median_ms(lambda: b.full.run(None, one))[0]
    unsplit_by_batch = costs_by_batch(lambda n: b.full.run(None, tile_batch(one, n)),
                                      BATCH_SIZES)
    manifest.version = manifest.compute_version()
    ordinal = {s.tensor: k for k, s in enumerate(report.sites)}
    manifest.meta = {
        "recipe": recipe,
        "source": b.src.description,
        "full_model_file": b.full_file,
        "full_model_sha256": b.full_digest,
        "unsplit_ms": unsplit_ms,
        "unsplit_by_batch": unsplit_by_batch,
        "range_ms": range_ms,
        "ramp_serving": "split where noted" if rt.tap_notes else "tapped",
        "ramp_serving_notes": list(rt.tap_notes),
        **training_meta(b, feats, fits, bootstrap_seed),
        "split_max_abs_diff": b.split_diff,
        "sites": [{"tensor": s.tensor, "index": s.index, "layout": s.layout,
                   "shape": list(s.shape), "op": s.op} for s in report.sites],
        "ramp_sites": [ordinal[s.tensor] for s in b.chosen],
        "rejected": len(report.rejected),
        "providers": rt.providers,
        "device_class": device_class(b.device, rt.providers),
        "threads": b.threads,
        "seconds": {**b.seconds, "total": round(time.perf_counter() - t0, 2)},
    }
    (b.folder / SITES_FILE).write_text(report.summary() + "\n", encoding="utf-8")
    manifest.save(b.folder)


def training_meta(b: Build, feats: rp.Features, fits: list[rp.RampFit], bootstrap_seed: int
                  ) -> dict[str, object]:
    """How the ramps were trained, for the manifest's meta (untrained: on nothing)."""
    if not b.bootstrap:
        return {"bootstrap_samples": 0, "shape_samples": len(feats.labels),
                "agreement_estimate": "none: ramps untrained (prepared without bootstrap data)"}
    return {
        "bootstrap_samples": len(feats.labels),
        "bootstrap_seed": bootstrap_seed,
        "agreement_estimate": "5-fold cross-validation by scene/group",
        "distinct_labels": len(np.unique(feats.labels)),
        "fold_agreement": [f.fold_agreement for f in fits],
        "train_agreement": [round(f.train_agreement, 4) for f in fits],
    }

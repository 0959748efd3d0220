"""Prepare a zoo model: split into ONNX blocks, train and export ramps, measure costs.

Idempotent and interruption-safe: everything is built in a temp folder next to the
target, files are named after their content hash, and the result is put in place by
atomic renames. An intact prepared model (manifest + files with matching hashes) is
reused unless ``force``. A per-model lock file stops two processes doing the work twice.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from services.models.manifest import (
    MANIFEST_FILE,
    BlockSpec,
    Manifest,
    RampSpec,
    sha256_bytes,
)
from services.models.source import ModelSource, SourceError
from services.models.zoo import RECIPE_VERSION, ZOO, sample_inputs

__all__ = ["BOOTSTRAP_SEED", "ZOO", "SiteChoice", "load_if_intact", "prepare", "sample_inputs",
           "sites_json"]
SITES_FILE = "sites.txt"  # the site analysis, human readable, next to the manifest

# Bootstrap data uses its own seed so evaluations with sample_inputs(seed=0, ...) run on
# frames the ramps never saw.
BOOTSTRAP_SEED = 7919
Log = Callable[[str], None]


def _stderr(msg: str) -> None:
    import sys

    print(msg, file=sys.stderr, flush=True)


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with open(path, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def load_if_intact(model_dir: Path, name: str | None = None) -> Manifest | None:
    """The manifest at ``model_dir`` when it and every file it names are intact."""
    try:
        m = Manifest.load(model_dir)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if name is not None and m.name != name:
        return None
    return None if m.verify(model_dir) else m


def _write(folder: Path, stem: str, data: bytes) -> tuple[str, str]:
    digest = sha256_bytes(data)
    file = f"{stem}.{digest[:12]}.onnx"
    (folder / file).write_bytes(data)
    return file, digest


def _marginal_ms(with_it: Callable[[], object], without: Callable[[], object],
                 max_runs: int = 401, min_runs: int = 41, budget_s: float = 1.0) -> float:
    """Median extra time of ``with_it`` over ``without``, timed in alternating pairs so
    machine noise hits both alike (which call goes first alternates too: the second of a
    pair finds warmer caches); many pairs for cheap calls (a ramp head costs microseconds),
    at least ``min_runs`` for slow ones; never below a microsecond."""
    for _ in range(3):
        with_it()
        without()
    diffs: list[float] = []
    start = time.perf_counter()
    while len(diffs) < max_runs and (len(diffs) < min_runs
                                     or time.perf_counter() - start < budget_s):
        first, second = (with_it, without) if len(diffs) % 2 == 0 else (without, with_it)
        t = time.perf_counter()
        first()
        t1 = time.perf_counter()
        second()
        t2 = time.perf_counter()
        extra = (t1 - t) - (t2 - t1)
        diffs.append(extra if first is with_it else -extra)
    return round(max(statistics.median(diffs) * 1e3, 0.001), 4)


def _median_ms(fn: Callable[[], object], runs: int = 20, warmup: int = 3) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e3)
    return round(statistics.median(times), 4)


def _interleaved_median_ms(fns: list[Callable[[], object]], runs: int = 20, warmup: int = 3
                           ) -> list[float]:
    """Median ms of each of ``fns``, timed in rounds (one call of each per round), so a
    slow spell of a shared machine lands on all of them alike. Timed one after another,
    MiniLM's prefix to ramp 5 once read 7.83 ms where its neighbours read 3.78 and 5.34
    (the block costs put it near 4.7), and the latency profile, which keeps prefixes in
    model order, then priced ramps 5-8 as all ending near 7.8 ms."""
    for _ in range(warmup):
        for fn in fns:
            fn()
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(runs):
        for k, fn in enumerate(fns):
            t = time.perf_counter()
            fn()
            times[k].append((time.perf_counter() - t) * 1e3)
    return [round(statistics.median(t), 4) for t in times]


BATCH_SIZES = (1, 4, 16)  # batch sizes whose block and ramp costs are measured


@dataclass(frozen=True)
class SiteChoice:
    """Which candidate sites become ramps: ``keep`` restricts (tensor names or ordinals of
    the feasible sites), ``max_ramps`` thins evenly; 0 = the source's default."""

    keep: tuple[str, ...] = ()
    max_ramps: int = 0


def _ordinal_or_name(x: str) -> str | int:
    return int(x) if x.isdigit() else x


def _costs(fn: Callable[[int], object], sizes: tuple[int, ...]) -> dict[str, float]:
    return {str(b): _median_ms(lambda b=b: fn(b), runs=10 if b > 1 else 20) for b in sizes}


def _tile(inputs: dict[str, np.ndarray], b: int) -> dict[str, np.ndarray]:
    return {k: np.ascontiguousarray(np.repeat(v[:1], b, axis=0)) for k, v in inputs.items()}


def _build(src: ModelSource, folder: Path, log: Log, progress: Log, n: int, device: str,
           threads: int, choice: SiteChoice) -> tuple[Manifest, dict]:
    import onnxruntime as ort
    import torch

    from services.models import onnx_blocks, sites
    from services.models import ramps as rp
    from services.models.export import to_onnx
    from services.models.runtime import StageRuntime, pick_providers, session_options
    from services.profiler.latency import device_class

    t0 = time.perf_counter()
    report = sites.find_sites(src.model)
    keep = [_ordinal_or_name(k) for k in choice.keep] or None
    try:
        chosen = sites.select_sites(report, keep=keep)
    except ValueError as exc:
        raise SourceError(f"{src.name}: {exc}\n{report.summary()}") from None
    limit = choice.max_ramps or src.max_ramps
    if len(chosen) > limit:
        chosen = sites.thin_sites(chosen, limit, cheapest=True)
    if not chosen:
        raise SourceError(f"{src.name}: the graph has no feasible ramp site (no cut vertex "
                          f"with an N x C x H x W, N x S x H or N x F activation):\n"
                          f"{report.summary()}")
    log(f"ramp sites: {len(report.sites)} feasible, {len(report.rejected)} tensors rejected; "
        f"ramps at {len(chosen)}: " + ", ".join(s.tensor for s in chosen))
    ordinal = {s.tensor: k for k, s in enumerate(report.sites)}

    parts = onnx_blocks.split_blocks(src.model, [s.tensor for s in chosen])
    blocks: list[BlockSpec] = []
    for i, part in enumerate(parts):
        file, digest = _write(folder, f"block_{i}", part.SerializeToString())
        out = part.graph.output[0]
        blocks.append(BlockSpec(i, file, digest, [vi.name for vi in part.graph.input], [],
                                output_name=out.name))
    full_file, full_digest = _write(folder, "full", src.model.SerializeToString())
    manifest = Manifest(
        name=src.name, version="", kind=src.kind, inputs=list(src.inputs),
        outputs=list(src.outputs), classes=src.classes, blocks=blocks, ramps=[],
        base_params=src.base_params, full_ms=0.0)
    log(f"split into {len(blocks)} blocks in {time.perf_counter() - t0:.1f} s")

    # The chained blocks must reproduce the unsplit model before anything builds on them.
    so, providers = session_options(threads), pick_providers(device)
    full = ort.InferenceSession(str(folder / full_file), so, providers=providers)
    rt = StageRuntime(folder, manifest, 0, len(blocks), device=device, threads=threads)
    check = src.sample(3, 1)
    ref = full.run(None, check)[0]
    diff = float(np.abs(rt.run_all(check)[0] - ref).max())
    if not diff < 1e-4:
        raise RuntimeError(f"blocks of {src.name} differ from the unsplit model by {diff}")

    masked = src.pool == "masked_mean"
    if masked and src.mask_input not in {t.name for t in src.inputs}:
        raise ValueError(f"{src.name}: masked_mean pooling reads model input "
                         f"{src.mask_input!r}, not one of {[t.name for t in src.inputs]}")
    t1 = time.perf_counter()
    probe = onnx_blocks.add_outputs(src.model, [s.tensor for s in chosen])
    probe_sess = ort.InferenceSession(probe.SerializeToString(), so, providers=providers)
    feats = rp.collect_features(probe_sess, [s.tensor for s in chosen],
                                src.bootstrap(n, BOOTSTRAP_SEED), n, src.pool, progress,
                                mask_input=src.mask_input if masked else "",
                                keep_logits=src.ramp_targets == "softmax")
    del probe_sess
    t2 = time.perf_counter()
    fits = rp.train_ramps(feats, src.classes, src.pool, steps=src.ramp_steps, log=log,
                          targets=src.ramp_targets)
    t3 = time.perf_counter()
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
        file, digest = _write(folder, f"ramp_{k}", data)
        ramps.append(RampSpec(k, fit.after_block, file, digest, fit.arch, fit.params,
                              round(fit.agreement, 4), 0.0, chosen[fit.after_block].tensor,
                              inputs=reads))
    manifest.ramps = ramps

    # Costs on this machine through the runtime workers use: per block and ramp, per batch.
    rt = StageRuntime(folder, manifest, 0, len(blocks), device=device, threads=threads)
    one = src.sample(1, 2)
    acts: list[np.ndarray] = []
    x: dict[str, np.ndarray] | np.ndarray = one
    for i in range(len(blocks)):
        by_batch = _costs(lambda b, i=i, inp=x: rt.run_block(
            i, _tile(inp, b) if isinstance(inp, dict) else np.repeat(inp, b, axis=0),
            _tile(one, b)), BATCH_SIZES)
        blocks[i] = replace(blocks[i], cost_ms=by_batch["1"], cost_by_batch=by_batch)
        x = rt.run_block(i, x, one)
        acts.append(x)
    for k, r in enumerate(ramps):
        # What serving pays: the head runs fused into its block's session (see
        # StageRuntime.run_range), so its cost is the fused call minus the same call without.
        i = r.after_block
        inp = one if i == 0 else acts[i - 1]
        by_batch = {}
        for b in BATCH_SIZES:
            xb = _tile(inp, b) if isinstance(inp, dict) else np.repeat(inp, b, axis=0)
            ob = _tile(one, b)
            by_batch[str(b)] = _marginal_ms(
                lambda xb=xb, ob=ob, r=r, i=i: rt.run_range(i, i + 1, xb, ob, r.index),
                lambda xb=xb, ob=ob, i=i: rt.run_range(i, i + 1, xb, ob))
        ramps[k] = replace(r, cost_ms=by_batch["1"], cost_by_batch=by_batch)
    range_ms = _serving_costs(rt, ramps, len(blocks), one)
    manifest.full_ms = _median_ms(lambda: rt.run_all(one, one))
    unsplit_ms = _median_ms(lambda: full.run(None, one))
    unsplit_by_batch = _costs(lambda b: full.run(None, _tile(one, b)), BATCH_SIZES)
    manifest.version = manifest.compute_version()
    manifest.meta = {
        "recipe": _fingerprint(src, n),
        "source": src.description,
        "full_model_file": full_file,
        "full_model_sha256": full_digest,
        "unsplit_ms": unsplit_ms,
        "unsplit_by_batch": unsplit_by_batch,
        "range_ms": range_ms,
        "ramp_serving": "split where noted" if rt.tap_notes else "tapped",
        "ramp_serving_notes": list(rt.tap_notes),
        "bootstrap_samples": len(feats.labels),
        "bootstrap_seed": BOOTSTRAP_SEED,
        "agreement_estimate": "5-fold cross-validation by scene/group",
        "distinct_labels": len(np.unique(feats.labels)),
        "fold_agreement": [f.fold_agreement for f in fits],
        "train_agreement": [round(f.train_agreement, 4) for f in fits],
        "split_max_abs_diff": diff,
        "sites": [{"tensor": s.tensor, "index": s.index, "layout": s.layout,
                   "shape": list(s.shape), "op": s.op} for s in report.sites],
        "ramp_sites": [ordinal[s.tensor] for s in chosen],
        "rejected": len(report.rejected),
        "providers": rt.providers,
        "device_class": device_class(device, rt.providers),
        "threads": threads,
        "seconds": {
            "split": round(t1 - t0, 2),
            "features": round(t2 - t1, 2),
            "train": round(t3 - t2, 2),
            "total": round(time.perf_counter() - t0, 2),
        },
    }
    (folder / SITES_FILE).write_text(report.summary() + "\n", encoding="utf-8")
    manifest.save(folder)
    return manifest


SERVE_MEASURE_S = 5.0  # paired timing of the tapped stage with every ramp against none


def _serving_costs(rt, ramps: list[RampSpec], n_blocks: int, one: dict[str, np.ndarray]) -> float:
    """What a worker pays at batch 1, in place in ``ramps``: ``prefix_ms`` (the merged range
    from the input to the ramp's site) and ``serve_ms`` (activating the ramp, over the
    unsplit range; never below the head's own cost). Returns the unsplit range's latency.

    With taps (``services.models.taps``), the active heads run inside the one tapped call.
    One head adds a few hundredths of a millisecond there, below what this machine can
    resolve on a whole-model call: timed ramp by ramp, structurally identical MiniLM heads
    read 0.02-0.17 ms, and the budget then admitted ramps by luck. So the tapped stage with
    every ramp is timed against the plain stage in one long paired measurement, and that
    extra time is shared out in proportion to each head's own cost (``cost_ms``, timed on
    its block alone, where the noise is small). Where taps are unavailable each ramp splits
    the stage: its serving cost is that split plus its head, timed ramp by ramp."""
    from services.models.runtime import active_in_order, as_numpy
    from services.models.taps import tap_plan

    def upto(end: int) -> object:
        return as_numpy(rt.run_range(0, end, one)[0])

    # prefixes and the full range timed together (see _interleaved_median_ms)
    *prefix_ms, range_ms = _interleaved_median_ms(
        [lambda i=r.after_block: upto(i + 1) for r in ramps] + [lambda: upto(n_blocks)])
    order = active_in_order(ramps, [r.index for r in ramps])
    sess = rt.tapped(order) if order else None
    if sess is not None:  # nothing exits: the cost every sample pays
        plan = tap_plan(tuple((r, 0.0) for r in order), "max_softmax")
        running = np.full(1, -1, np.int32)  # a worker makes it with or without ramps

        def tapped() -> object:
            return as_numpy(rt.run_tapped(sess, one, one, plan, running)[0])

        extra = _marginal_ms(tapped, lambda: upto(n_blocks), max_runs=4001,
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

            serve = _marginal_ms(split, lambda: upto(n_blocks))
        else:
            serve = r.cost_ms  # nothing runs after it: no split
        ramps[k] = replace(r, prefix_ms=prefix_ms[k], serve_ms=round(max(serve, r.cost_ms), 4))
    return range_ms


def _fingerprint(src: ModelSource, n: int) -> str:
    targets = ""
    if src.ramp_targets != "top1":
        from services.models.ramps import SOFT_TEMPERATURE  # torch: only such models pay

        targets = f"|targets={src.ramp_targets}@{SOFT_TEMPERATURE:g}"
    return (f"{RECIPE_VERSION}|{src.recipe}|n={n}|steps={src.ramp_steps}|max={src.max_ramps}"
            f"{targets}")


def _share(part: float | None, whole: float | None) -> float | None:
    return round(part / whole, 5) if part is not None and whole else None


def sites_json(manifest: Manifest) -> dict:
    """The ``--json`` report: feasible sites in execution order and the trained ramps."""
    sites = manifest.meta.get("sites", [])
    by_tensor = {s["tensor"]: k for k, s in enumerate(sites)}
    return {
        "model": manifest.name,
        "version": manifest.version,
        "sites": [{"tensor": s["tensor"], "index": s["index"]} for s in sites],
        "ramps": [{"site": by_tensor.get(r.site, -1), "tensor": r.site, "ramp": r.index,
                   "after_block": r.after_block, "agreement": r.agreement, "cost_ms": r.cost_ms,
                   "cost_share": round(r.cost_ms / manifest.full_ms, 5) if manifest.full_ms else None,
                   "cost_share_unsplit": _share(r.cost_ms, manifest.meta.get("unsplit_ms")),
                   "cost_share_unsplit_b16": _share(r.cost_by_batch.get("16"),
                                                    (manifest.meta.get("unsplit_by_batch") or {})
                                                    .get("16")),
                   "params": r.params,
                   "params_share": round(r.params / manifest.base_params, 5)
                   if manifest.base_params else None,
                   "cost_by_batch": r.cost_by_batch,
                   "prefix_ms": r.prefix_ms, "serve_ms": r.serve_ms,
                   "serve_share_unsplit": _share(r.serve_ms, manifest.meta.get("unsplit_ms"))}
                  for r in manifest.ramps],
        "full_ms": manifest.full_ms,
        "unsplit_ms": manifest.meta.get("unsplit_ms"),
        "base_params": manifest.base_params,
    }


def _install(tmp: Path, target: Path, manifest: Manifest) -> None:
    if not target.exists():
        os.rename(tmp, target)  # atomic: the model appears complete or not at all
        return
    if not target.is_dir():
        target.unlink()
        os.rename(tmp, target)
        return
    # Replace in place: hashed names never clash with live files of other content, and
    # the manifest swap is the single atomic switch-over.
    keep = {p.name for p in tmp.iterdir()}
    for name in keep - {MANIFEST_FILE}:
        os.replace(tmp / name, target / name)
    os.replace(tmp / MANIFEST_FILE, target / MANIFEST_FILE)
    for p in target.iterdir():
        if p.name not in keep and p.suffix == ".onnx":
            p.unlink(missing_ok=True)


def prepare(
    target: str,
    models_dir: Path,
    force: bool = False,
    log: Log = print,
    *,
    bootstrap_n: int | None = None,
    device: str = "auto",
    threads: int = 0,
    progress: Log = _stderr,
    data: Path | None = None,
    name: str | None = None,
    choice: SiteChoice = SiteChoice(),
    mask_input: str | None = None,
    ramp_targets: str | None = None,
) -> Path:
    """Prepare a zoo model or a user's ONNX / torch model under ``models_dir`` (reusing an
    intact copy made by the same recipe); return its folder. ``mask_input``: the model
    input text ramps average over (``"none"``: plain mean; default: the source's choice).
    ``ramp_targets``: what the ramps learn of the final model (``ramps.TARGETS``; default:
    the source's choice, top-1 for a user's model)."""
    from services.models.source import resolve, with_mask_input

    models_dir = Path(models_dir)
    src = resolve(target, data, name)  # SourceError says what is wrong with the input
    if mask_input is not None:
        src = with_mask_input(src, mask_input)
    if ramp_targets is not None:  # part of the recipe: another choice rebuilds
        from services.models.ramps import check_targets

        check_targets(ramp_targets)  # before any work, not after the feature pass
        src = replace(src, ramp_targets=ramp_targets)
    if choice != SiteChoice():
        src = replace(src, recipe=f"{src.recipe}|keep={','.join(choice.keep)}",
                      max_ramps=choice.max_ramps or src.max_ramps)
    models_dir.mkdir(parents=True, exist_ok=True)
    target_dir = models_dir / src.name
    with _locked(models_dir / f".{src.name}.lock"):
        n = bootstrap_n or src.bootstrap_n
        recipe = _fingerprint(src, n)
        if not force and (m := load_if_intact(target_dir, src.name)) is not None:
            if m.meta.get("recipe") == recipe:
                log(f"reusing {src.name} {m.version} at {target_dir}")
                return target_dir
            log(f"{src.name} at {target_dir} was prepared by another recipe; rebuilding")
        # Holding the lock, any temp folder left is from an interrupted run.
        for stale in models_dir.glob(f".{src.name}.tmp-*"):
            shutil.rmtree(stale, ignore_errors=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{src.name}.tmp-", dir=models_dir))
        tmp.chmod(0o755)  # mkdtemp makes it private; the model folder should not be
        try:
            log(f"preparing {src.name} ({src.description}) with {n} bootstrap samples")
            manifest = _build(src, tmp, log, progress, n, device, threads, choice)
            _install(tmp, target_dir, manifest)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    log(
        f"prepared {src.name} {manifest.version} at {target_dir} in "
        f"{manifest.meta['seconds']['total']:.1f} s"
    )
    return target_dir

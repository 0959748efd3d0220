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
from dataclasses import replace
from pathlib import Path

import numpy as np

from services.models.manifest import (
    MANIFEST_FILE,
    BlockSpec,
    Manifest,
    RampSpec,
    sha256_bytes,
)
from services.models.zoo import ZOO, ModelSpec, get_spec, sample_inputs

__all__ = ["BOOTSTRAP_SEED", "ZOO", "load_if_intact", "prepare", "sample_inputs"]

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


def _median_ms(fn: Callable[[], object], runs: int = 20, warmup: int = 3) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e3)
    return round(statistics.median(times), 4)


def _build(
    spec: ModelSpec, folder: Path, log: Log, progress: Log, n: int, device: str, threads: int
) -> Manifest:
    import torch

    from services.models import ramps as rp
    from services.models.export import count_params, to_onnx
    from services.models.runtime import StageRuntime

    t0 = time.perf_counter()
    built = spec.build()
    names = [t.name for t in spec.inputs]
    blocks: list[BlockSpec] = []
    prev: tuple = tuple(built.example[k] for k in names)
    for i, seg in enumerate(built.segments):
        in_names = names if i == 0 else ["x"]
        data = to_onnx(seg, prev, in_names, ["y"])
        with torch.no_grad():
            out = seg(*prev)
        file, digest = _write(folder, f"block_{i}", data)
        blocks.append(BlockSpec(i, file, digest, in_names, list(out.shape[1:])))
        prev = (torch.zeros_like(out),)
    manifest = Manifest(
        name=spec.name,
        version="",
        kind=spec.kind,
        inputs=list(spec.inputs),
        outputs=list(spec.outputs),
        classes=spec.classes,
        blocks=blocks,
        ramps=[],
        base_params=count_params(built.segments),
        full_ms=0.0,
    )
    log(f"exported {len(blocks)} blocks in {time.perf_counter() - t0:.1f} s")

    # Exported chain must equal the unsplit torch model before anything builds on it.
    rt = StageRuntime(folder, manifest, 0, len(blocks), device=device, threads=threads)
    check = spec.sample_inputs(2, 1)
    with torch.no_grad():
        ref = built.full(*[torch.from_numpy(check[k]) for k in names]).numpy()
    diff = float(np.abs(rt.run_all(check)[0] - ref).max())
    if not diff < 1e-3:
        raise RuntimeError(f"exported {spec.name} differs from torch by {diff}")

    t1 = time.perf_counter()
    sites = list(range(len(blocks) - 1))  # a ramp after every block but the last
    feats = rp.collect_features(
        rt, sites, spec.bootstrap(n, BOOTSTRAP_SEED), n, spec.pool, progress
    )
    t2 = time.perf_counter()
    fits = rp.train_ramps(feats, spec.classes, spec.pool, steps=spec.ramp_steps, log=log)
    t3 = time.perf_counter()
    ramps = []
    for k, fit in enumerate(fits):
        example = (torch.zeros(1, *blocks[fit.after_block].output_shape),)
        data = to_onnx(rp.head_module(fit), example, ["x"], ["logits"])
        file, digest = _write(folder, f"ramp_{k}", data)
        ramps.append(
            RampSpec(
                k,
                fit.after_block,
                file,
                digest,
                fit.arch,
                fit.params,
                round(fit.agreement, 4),
                0.0,
                built.sites[fit.after_block],
            )
        )
    manifest.ramps = ramps

    # Batch-1 costs on this machine, measured through the same runtime workers use.
    rt = StageRuntime(folder, manifest, 0, len(blocks), device=device, threads=threads)
    one = spec.sample_inputs(1, 2)
    acts: list[np.ndarray] = []
    x: dict[str, np.ndarray] | np.ndarray = one
    for i in range(len(blocks)):
        cost = _median_ms(lambda i=i, inp=x: rt.run_block(i, inp))
        blocks[i] = replace(blocks[i], cost_ms=cost)
        x = rt.run_block(i, x)
        acts.append(x)
    for k, r in enumerate(ramps):
        cost = _median_ms(lambda r=r, a=acts[r.after_block]: rt.run_ramp(r.index, a))
        ramps[k] = replace(r, cost_ms=cost)

    def full() -> None:
        y: dict[str, np.ndarray] | np.ndarray = one
        for i in range(len(blocks)):
            y = rt.run_block(i, y)

    manifest.full_ms = _median_ms(full)
    manifest.version = manifest.compute_version()
    manifest.meta = {
        "recipe": spec.fingerprint(n),
        "bootstrap_samples": n,
        "bootstrap_seed": BOOTSTRAP_SEED,
        "agreement_estimate": "5-fold cross-validation by scene/group",
        "distinct_labels": len(np.unique(feats.labels)),
        "fold_agreement": [f.fold_agreement for f in fits],
        "train_agreement": [round(f.train_agreement, 4) for f in fits],
        "export_max_abs_diff": diff,
        "providers": rt.providers,
        "threads": threads,
        "seconds": {
            "export": round(t1 - t0, 2),
            "features": round(t2 - t1, 2),
            "train": round(t3 - t2, 2),
            "total": round(time.perf_counter() - t0, 2),
        },
    }
    manifest.save(folder)
    return manifest


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
    keep = {MANIFEST_FILE}
    for file, _ in manifest.artifacts():
        os.replace(tmp / file, target / file)
        keep.add(file)
    os.replace(tmp / MANIFEST_FILE, target / MANIFEST_FILE)
    for p in target.iterdir():
        if p.name not in keep and p.suffix == ".onnx":
            p.unlink(missing_ok=True)


def prepare(
    name: str,
    models_dir: Path,
    force: bool = False,
    log: Log = print,
    *,
    bootstrap_n: int | None = None,
    device: str = "auto",
    threads: int = 0,
    progress: Log = _stderr,
) -> Path:
    """Prepare ``name`` under ``models_dir`` (reusing an intact copy); return its folder."""
    spec = get_spec(name)  # ValueError listing the known models
    models_dir = Path(models_dir)
    models_dir.mkdir(parents=True, exist_ok=True)
    target = models_dir / name
    with _locked(models_dir / f".{name}.lock"):
        n = bootstrap_n or spec.bootstrap_n
        recipe = spec.fingerprint(n)
        if not force and (m := load_if_intact(target, name)) is not None:
            if m.meta.get("recipe") == recipe:
                log(f"reusing {name} {m.version} at {target}")
                return target
            log(f"{name} at {target} was prepared by another recipe; rebuilding")
        # Holding the lock, any temp folder left is from an interrupted run.
        for stale in models_dir.glob(f".{name}.tmp-*"):
            shutil.rmtree(stale, ignore_errors=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{name}.tmp-", dir=models_dir))
        tmp.chmod(0o755)  # mkdtemp makes it private; the model folder should not be
        try:
            log(f"preparing {name} ({spec.description}) with {n} bootstrap samples")
            manifest = _build(spec, tmp, log, progress, n, device, threads)
            _install(tmp, target, manifest)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    log(
        f"prepared {name} {manifest.version} at {target} in "
        f"{manifest.meta['seconds']['total']:.1f} s"
    )
    return target

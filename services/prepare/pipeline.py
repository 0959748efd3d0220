"""Prepare a zoo model: split into ONNX blocks, train and export ramps, measure costs.

Idempotent and interruption-safe: everything is built in a temp folder next to the
target, files are named after their content hash, and the result is put in place by
atomic renames. An intact prepared model (manifest + files with matching hashes) is
reused unless ``force``. A per-model lock file stops two processes doing the work twice.

Without bootstrap (``bootstrap=False``, ``offramp prepare --no-bootstrap``) the ramps are
built, exported and costed as usual but left untrained (zero heads, marked so in the
manifest) for a live refit to train; no bootstrap data is read.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

from services.prepare.site_choice import SiteChoice
from services.prepare.source import ModelSource, SourceError, resolve, with_mask_input
from services.runtime.manifest import (
    MANIFEST_FILE,
    Manifest,
)
from services.zoo.registry import RECIPE_VERSION, SUPERNETS, ZOO, sample_inputs

__all__ = ["BOOTSTRAP_SEED", "SUPERNETS", "ZOO", "SiteChoice", "load_if_intact", "prepare", "sample_inputs",
           "sites_json"]

# Bootstrap data uses its own seed so evaluations with sample_inputs(seed=0, ...) run on
# frames the ramps never saw.
BOOTSTRAP_SEED = 7919
Log = Callable[[str], None]
EVERY_SITE = SiteChoice()  # no restriction: the source's default ramps


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


def recipe_fingerprint(src: ModelSource, n: int, bootstrap: bool = True) -> str:
    """What an intact copy must have been built by to be reused. Untrained ramps keep the
    targets (what a refit of them learns) but no bootstrap size or training steps."""
    targets = ""
    if src.ramp_targets != "top1":
        from services.prepare.ramps import SOFT_TEMPERATURE  # torch: only such models pay

        targets = f"|targets={src.ramp_targets}@{SOFT_TEMPERATURE:g}"
    if not bootstrap:
        return f"{RECIPE_VERSION}|{src.recipe}|max={src.max_ramps}{targets}|bootstrap=0"
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
        "bootstrap": manifest.bootstrap,
        "sites": [{"tensor": s["tensor"], "index": s["index"]} for s in sites],
        "ramps": [{"site": by_tensor.get(r.site, -1), "tensor": r.site, "ramp": r.index,
                   "after_block": r.after_block, "trained": r.trained,
                   "agreement": r.agreement, "cost_ms": r.cost_ms,
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


def check_no_bootstrap(bootstrap_n: int | None, ramp_targets: str | None) -> None:
    """Choices that only shape ramp training make no sense without bootstrap data."""
    given = [flag for flag, value in (("--bootstrap-n", bootstrap_n),
                                      ("--ramp-targets", ramp_targets)) if value is not None]
    if given:
        raise SourceError(f"{' and '.join(given)}: only for ramp training on bootstrap data, "
                          "which --no-bootstrap skips (the live refit trains its ramps)")


def _source(target: str, data: Path | None, name: str | None, mask_input: str | None,
            ramp_targets: str | None, choice: SiteChoice, bootstrap: bool = True,
            build: bool = True) -> ModelSource:
    """The model to prepare with the user's choices applied; every choice is part of the
    recipe, so another choice rebuilds. SourceError says what is wrong with the input.
    ``build=False``: a zoo model without its model, enough to check for a reusable copy."""
    src = resolve(target, data, name, bootstrap, build)
    if mask_input is not None:
        src = with_mask_input(src, mask_input)
    if ramp_targets is not None:
        from services.prepare.ramps import check_targets  # torch: only such choices pay

        check_targets(ramp_targets)  # before any work, not after the feature pass
        src = replace(src, ramp_targets=ramp_targets)
    if choice != EVERY_SITE:
        src = replace(src, recipe=f"{src.recipe}|keep={','.join(choice.keep)}",
                      max_ramps=choice.max_ramps or src.max_ramps)
    return src


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
    choice: SiteChoice = EVERY_SITE,
    mask_input: str | None = None,
    ramp_targets: str | None = None,
    bootstrap: bool = True,
) -> Path:
    """Prepare a zoo model or a user's ONNX / torch model under ``models_dir`` (reusing an
    intact copy made by the same recipe); return its folder. ``name``: serve it under this
    name (default: the zoo name or the file's stem). ``mask_input``: the model
    input text ramps average over (``"none"``: plain mean; default: the source's choice).
    ``ramp_targets``: what the ramps learn of the final model (``ramps.TARGETS``; default:
    the source's choice, top-1 for a user's model). ``bootstrap=False``: untrained ramps
    (see the module's doc); ``data`` then only gives a user's model shapes and timing."""
    models_dir = Path(models_dir)
    if not bootstrap:
        check_no_bootstrap(bootstrap_n, ramp_targets)
    src = _source(target, data, name, mask_input, ramp_targets, choice, bootstrap, build=False)
    models_dir.mkdir(parents=True, exist_ok=True)
    target_dir = models_dir / src.name
    with _locked(models_dir / f".{src.name}.lock"):
        n = (bootstrap_n or src.bootstrap_n) if bootstrap else 0
        recipe = recipe_fingerprint(src, n, bootstrap)
        if not force and (m := load_if_intact(target_dir, src.name)) is not None:
            if m.meta.get("recipe") == recipe and m.bootstrap == bootstrap:
                log(f"reusing {src.name} {m.version} at {target_dir}")
                return target_dir
            log(f"{src.name} at {target_dir} was prepared by another recipe; rebuilding")
        if src.model is None:  # a zoo model is built only when no copy can be reused
            src = _source(target, data, name, mask_input, ramp_targets, choice, bootstrap)
        # Holding the lock, any temp folder left is from an interrupted run.
        for stale in models_dir.glob(f".{src.name}.tmp-*"):
            shutil.rmtree(stale, ignore_errors=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{src.name}.tmp-", dir=models_dir))
        tmp.chmod(0o755)  # mkdtemp makes it private; the model folder should not be
        try:
            how = f"with {n} bootstrap samples" if bootstrap else "without bootstrap data"
            log(f"preparing {src.name} ({src.description}) {how}")
            from services.prepare.build import build  # torch and ONNX Runtime: only now

            manifest = build(src, tmp, log, progress, n, device, threads, choice, recipe,
                             BOOTSTRAP_SEED, bootstrap)
            _install(tmp, target_dir, manifest)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    log(
        f"prepared {src.name} {manifest.version} at {target_dir} in "
        f"{manifest.meta['seconds']['total']:.1f} s"
    )
    return target_dir

"""``offramp prepare supernet-cnn`` / ``supernet-minilm``: a weight-shared supernet made
servable by variant.

1. The supernet: trained once and cached (``services.zoo.supernet_cnn``, or
   ``services.zoo.supernet_minilm`` for the transformer made from ``minilm-topics``).
2. The pareto profile (``services.supernet.search``): candidates calibrated and scored, and
   the frontier timed per batch size on this machine's CPU threads, as a worker runs it.
3. One artifact, ``supernet-<hash>.pt``, holds the weights, the architecture, and the
   normalization statistics of every frontier subnet. The manifest names it as the model's
   only block (kind ``supernet``, no ramps) and carries the profile in ``meta``. Like the
   zoo's other models, the folder is content-hashed and reused while the recipe is the
   same.

The manifest's ``meta.family`` (``conv`` or ``transformer``; absent in older conv
manifests) tells the runtime which supernet the artifact holds.

Registration (``launcher.supervisor.register_prepared``) writes the profile's rows to the
store's ``subnet_profiles``, where routers read the variants they choose from.
"""

from __future__ import annotations

import hashlib
import io
import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from services.prepare.staging import staged_folder
from services.runtime.devices import device_class
from services.runtime.manifest import BlockSpec, Manifest, TensorSpec
from services.supernet.operators import norms
from services.supernet.search import BATCHES, SEARCH_BATCH, Search
from services.training.adam import torch_threads
from services.zoo import chain_cnn, supernet_cnn, supernet_minilm
from services.zoo import minilm_topics as mt

KIND = "supernet"
VERSION = 1   # bump when the artifact layout or the search changes


@dataclass(frozen=True)
class SearchRecipe:
    random: int = 48          # random candidates besides the largest and smallest
    mutations: int = 16       # children of the frontier, one evolutionary round
    calib: int = 512          # training crops per subnet's normalization statistics
    held_out: int = 1024      # held-out images candidates are scored on
    seed: int = 0


# The transformer's search: no calibration, every held-out quote (0 = all); 96 subnets of
# which ~30 fit the 2-minute bound on one thread.
TEXT_SEARCH = SearchRecipe(random=18, mutations=10, calib=0, held_out=0)


def fingerprint(train: str, search: SearchRecipe, threads: int) -> str:
    """What a prepared copy must match to be reused: ``train`` names the weights (the
    training recipe's digest, plus the source's content key for the transformer)."""
    text = json.dumps({"train": train, "search": asdict(search), "threads": threads,
                       "version": VERSION}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _intact(target: Path, fp: str) -> Manifest | None:
    try:
        m = Manifest.load(target)
    except (OSError, ValueError, KeyError):
        return None
    if m.kind != KIND or m.meta.get("recipe") != fp or m.verify(target):
        return None
    return m


def prepare_supernet(models_dir: Path, force: bool = False, log: Callable[[str], None] = print,
                     recipe: supernet_cnn.Recipe = supernet_cnn.RECIPE,
                     search: SearchRecipe = SearchRecipe(), threads: int = 1,
                     teacher: torch.nn.Module | None = None, cache_dir: Path | None = None,
                     name: str = supernet_cnn.NAME) -> Path:
    """Prepare the supernet under ``models_dir / name`` (reusing an intact copy of the same
    recipe); ``threads``: the torch threads a worker serves it with, which its latency
    profile is measured on."""
    target = Path(models_dir) / name
    fp = fingerprint(recipe.digest(), search, threads)
    if not force and (m := _intact(target, fp)) is not None:
        log(f"reusing {name} {m.version} at {target}")
        return target
    started = time.monotonic()
    log(f"preparing {name} ({supernet_cnn.DESCRIPTION})")
    net = supernet_cnn.build_supernet(cache_dir, recipe, log, teacher)
    trained_s = time.monotonic() - started
    calib = [torch.from_numpy(c["image"]) for c, _ in chain_cnn.bootstrap(search.calib,
                                                                         recipe.seed + 1)]
    x, y = chain_cnn.sample_stream(search.held_out, 1)
    with torch_threads(threads):
        scores = Search(net, calib, torch.from_numpy(x), y, log).run(
            search.random, search.mutations, search.seed)
    device = device_class("cpu", threads=threads)
    inputs = [TensorSpec("image", "<f4", list(chain_cnn.IMAGE_SHAPE))]
    manifest = _write(Path(models_dir), target, name, net, scores, device, fp, inputs,
                      {"family": "conv", "seconds": {"train": trained_s,
                                                     "total": time.monotonic() - started}})
    _said(log, name, manifest, scores)
    return target


def _said(log, name: str, manifest: Manifest, scores) -> None:
    front = [s for s in scores if s.pareto]
    log(f"prepared {name} {manifest.version}: {len(scores)} subnets scored, {len(front)} on "
        f"the frontier (agreement {min(s.agreement for s in front):.3f}-"
        f"{max(s.agreement for s in front):.3f}), "
        f"{manifest.meta['seconds']['total']:.0f} s")


def prepare_minilm_supernet(models_dir: Path, force: bool = False,
                            log: Callable[[str], None] = print,
                            recipe: supernet_minilm.Recipe = supernet_minilm.RECIPE,
                            search: SearchRecipe = TEXT_SEARCH, threads: int = 1,
                            cache_dir: Path | None = None, name: str = supernet_minilm.NAME,
                            source: supernet_minilm.Source | None = None) -> Path:
    """``prepare_supernet`` for the transformer supernet: made from ``source`` (default
    ``minilm-topics`` and its splits), scored on the held-out split's quotes, timed on
    full-length (``SEQ_LEN``) requests as the worker serves them."""
    target = Path(models_dir) / name
    key = source.key if source is not None else mt.head_key(mt.corpus())[:16]
    fp = fingerprint(f"{recipe.digest()}-{key}", search, threads)
    if not force and (m := _intact(target, fp)) is not None:
        log(f"reusing {name} {m.version} at {target}")
        return target
    started = time.monotonic()
    log(f"preparing {name} ({supernet_minilm.DESCRIPTION})")
    net, source = supernet_minilm.build_supernet(cache_dir, recipe, log, source)
    trained_s = time.monotonic() - started
    n = search.held_out or len(source.held_labels)
    held = {k: v[:n] for k, v in source.held.items()}
    timing = {k: torch.from_numpy(v[:max(BATCHES)]) for k, v in source.held.items()}
    searched = Search(net, [], held, source.held_labels[:n], log, timing=timing)
    with torch_threads(threads):
        scores = searched.run(search.random, search.mutations, search.seed)
    search_s = time.monotonic() - started - trained_s
    seq = source.held["input_ids"].shape[1]
    inputs = [TensorSpec(k, "<i8", [seq]) for k in ("input_ids", "attention_mask")]
    meta = {"family": "transformer", "teacher": _teacher_row(searched.reference, source, n),
            "seconds": {"train": trained_s, "search": search_s,
                        "total": time.monotonic() - started}}
    manifest = _write(Path(models_dir), target, name, net, scores,
                      device_class("cpu", threads=threads), fp, inputs, meta)
    _said(log, name, manifest, scores)
    return target


def _teacher_row(largest, source: supernet_minilm.Source, n: int) -> dict:
    """How the supernet's largest subnet (its top-1 on the first ``n`` held-out rows)
    compares with the model it was made from, and that model's labelled accuracy."""
    with torch_threads(1):
        theirs = source.teacher.predict({k: v[:n] for k, v in source.held.items()},
                                        source.teacher.space.largest)
    return {"agreement": float((largest == theirs).mean()),
            "accuracy": float((theirs == source.held_labels[:n]).mean()), "held_out": n}


def prepare_configured(cfg, force: bool = False, log: Callable[[str], None] = print,
                       models_dir: Path | None = None, name: str = supernet_cnn.NAME) -> Path:
    """The supernet ``name`` prepared as `offramp prepare` and `offramp up` run it:
    profiled on the threads a worker of this configuration serves with
    (``OFFRAMP_ORT_THREADS``, at least one), weights cached under ``$OFFRAMP_HOME/cache``."""
    prep = prepare_minilm_supernet if name == supernet_minilm.NAME else prepare_supernet
    return prep(models_dir or cfg.models_dir, force=force, log=log,
                threads=max(1, cfg.ort_threads), cache_dir=cfg.home / "cache")


def _payload(net, served: list[str]) -> bytes:
    buf = io.BytesIO()
    torch.save({"arch": asdict(net.arch), "state": net.state_dict(),
                "norms": [dict(n.stats) for n in norms(net)], "served": served}, buf)
    return buf.getvalue()


def _write(models_dir: Path, target: Path, name: str, net, scores, device: str, fp: str,
           inputs: list[TensorSpec], meta: dict) -> Manifest:
    # what the runtime serves: the frontier, and the largest (the model as trained)
    served = sorted({s.subnet.key for s in scores if s.pareto} | {net.space.largest.key})
    data = _payload(net, served)
    digest = hashlib.sha256(data).hexdigest()
    file = f"supernet-{digest[:16]}.pt"
    largest = next(s for s in scores if s.subnet == net.space.largest)
    lat = largest.latency_ms or {SEARCH_BATCH: largest.search_ms}
    first = min(lat)
    block = BlockSpec(0, file, digest, [t.name for t in inputs], [net.arch.classes],
                      cost_ms=lat[first],
                      output_name="logits", cost_by_batch={str(b): ms for b, ms in lat.items()})
    manifest = Manifest(
        name=name, version="", kind=KIND,
        inputs=inputs,
        outputs=[TensorSpec("logits", "<f4", [net.arch.classes])],
        classes=net.arch.classes, blocks=[block], ramps=[],
        base_params=sum(p.numel() for p in net.parameters()), full_ms=lat[first],
        meta={"recipe": fp, "device": device, "arch": asdict(net.arch),
              "largest": net.space.largest.key, **meta,
              "subnets": [s.to_dict() for s in scores]})
    manifest.version = manifest.compute_version()
    with staged_folder(target) as tmp:
        (tmp / file).write_bytes(data)
        manifest.save(tmp)
    return manifest


def subnet_rows(manifest: Manifest) -> list[dict]:
    """The store's ``subnet_profiles`` rows of a prepared supernet."""
    return [{"variant": r["subnet"], "accuracy": r["agreement"],
             "labelled_accuracy": r.get("accuracy"),
             "latency_ms": {int(b): ms for b, ms in (r.get("latency_ms") or {}).items()},
             "pareto": bool(r.get("pareto"))} for r in manifest.meta.get("subnets", [])]

"""``supernet-minilm``: a weight-shared transformer supernet that offramp makes from
``minilm-topics`` (SuperServe §3.1, transformer case; DynaBERT-style; no supernet weights
ship on PyPI).

Architecture (``services.supernet.bert_supernet``): MiniLM-L6's embeddings and six layers
with ``minilm-topics``' head; elastic depth 1-6 (every-other rule), heads and FFN width
0.25-1.0 of every layer: 6 x 4 x 4 = 96 subnets sharing 22.7 M parameters, one linear head
per depth. The largest subnet is ``minilm-topics`` itself.

Making it (``RECIPE``), on ``minilm-topics``' training split only (held-out quotes stay
out of every step, they score the subnets):

1. rewire: heads and FFN neurons of every layer reordered by importance, measured on
   ``importance`` training quotes (the full model's function is unchanged);
2. one head per depth below the full one, fitted on the training split's pooled
   embeddings at that depth exactly as ``minilm-topics`` fits its own head (the full
   depth keeps ``minilm-topics``' head): LayerSelect over the pretrained layers;
3. ``steps`` steps of DynaBERT-style distillation from the full model (logits + hidden
   states, sandwich rule), layers and heads trained, embeddings frozen; 0 = none.

One intra-op thread throughout, so the weights do not depend on the core count. The
weights are cached under ``<cache_dir>/supernet_minilm-<key>.pt``, key = recipe + corpus
+ pretrained weights + ``minilm-topics``' head recipe.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import torch

from services.common import config
from services.supernet.bert_supernet import BertSupernet, arch_of, from_bert
from services.supernet.bert_training import (
    DistillConfig,
    depth_features,
    distill,
    length_batches,
    rewire,
)
from services.training.adam import torch_threads
from services.training.checkpoint import save_state
from services.zoo import minilm_topics as mt

NAME = "supernet-minilm"
DESCRIPTION = ("weight-shared MiniLM-L6 supernet from minilm-topics, 96 subnets (depth 1-6 "
               "every other layer, heads and FFN width 0.25-1), a head per depth")
_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Recipe:
    """Everything that shapes the weights besides the source; its hash names the cache."""

    head_choices: tuple[float, ...] = (0.25, 0.5, 0.75, 1.0)
    ffn_choices: tuple[float, ...] = (0.25, 0.5, 0.75, 1.0)
    min_depth: int = 1
    importance: int = 512     # training quotes head and neuron importance is summed over
    fit_heads: int = 4096     # training quotes each depth's head is fitted on (0: none)
    steps: int = 150          # distillation steps (0: LayerSelect over pretrained layers)
    batch: int = 32
    middle: int = 2           # random subnets per step besides the largest and smallest
    lr: float = 1e-4          # one-cycle peak (2e-4 wrecked depths 1-3: agreement 0.43-0.53)
    hidden: float = 1.0       # weight of the hidden-state loss against the logits'
    seed: int = 29
    version: int = 1

    def digest(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:16]


RECIPE = Recipe()


@dataclass
class Source:
    """What the supernet is made from: the full model as a supernet (every head its
    head), encoded training and held-out quotes with labels, and a content key of all."""

    teacher: BertSupernet
    train: dict[str, np.ndarray]
    train_labels: np.ndarray
    held: dict[str, np.ndarray]
    held_labels: np.ndarray
    key: str


def minilm_source(cache_dir: Path | None = None) -> Source:
    """``minilm-topics`` (its head trained and cached on first use) and its splits."""
    model = mt.build_model(cache_dir)
    arch = arch_of(model.encoder.config, mt.CLASSES)
    teacher = from_bert(model.embeddings, model.encoder.layer, model.head, arch)
    train, held = mt.splits()
    return Source(teacher.eval(), mt.encode_texts(train.texts), train.labels,
                  mt.encode_texts(held.texts), held.labels,
                  mt.head_key(mt.corpus())[:16])


def _forever(make: Callable[[int], Iterator]) -> Iterator:
    epoch = 0
    while True:
        yield from make(epoch)
        epoch += 1


def _fit_heads(net: BertSupernet, source: Source, n: int, log) -> None:
    """Each depth below the full one gets a head fitted on its pooled embeddings of the
    first ``n`` training quotes (as ``minilm-topics`` fits its head)."""
    x = {k: v[:n] for k, v in source.train.items()}
    y = source.train_labels[:n]
    for depth in net.space.depths:
        if depth == net.arch.layers:
            continue   # the full model keeps its own head
        w, b = mt.fit_head(depth_features(net, x, depth), y, classes=net.arch.classes)
        with torch.no_grad():
            net.heads[depth - 1].weight.copy_(torch.from_numpy(w))
            net.heads[depth - 1].bias.copy_(torch.from_numpy(b))
        if log:
            log(f"{NAME}: head of depth {depth} fitted on {len(y)} quotes")


def train(recipe: Recipe, source: Source, log: Callable[[str], None] | None = None
          ) -> BertSupernet:
    """A freshly made supernet (deterministic for a recipe and source)."""
    arch = replace(source.teacher.arch, head_choices=recipe.head_choices,
                   ffn_choices=recipe.ffn_choices, min_depth=recipe.min_depth)
    rng = np.random.default_rng((recipe.seed, 5))
    started = time.monotonic()
    with torch_threads(1):
        torch.manual_seed(recipe.seed)
        net = BertSupernet(arch)
        net.load_state_dict(source.teacher.state_dict())
        net.requires_grad_(False)
        n = len(source.train_labels)
        pick = rng.permutation(n)[:recipe.importance]
        rewire(net, length_batches({k: v[pick] for k, v in source.train.items()},
                                   recipe.batch, rng, source.train_labels[pick]), log)
        teacher = copy.deepcopy(net).eval()   # the full model, rewired: same function
        if recipe.fit_heads:
            _fit_heads(net, source, recipe.fit_heads, log)
        if recipe.steps:
            from services.zoo.chain_cnn import one_cycle

            batches = _forever(lambda e: length_batches(source.train, recipe.batch, rng))
            cfg = DistillConfig(recipe.steps, one_cycle(recipe.lr, recipe.steps),
                                recipe.middle, recipe.hidden)
            distill(net, teacher, batches, cfg, rng, log)
    if log:
        log(f"{NAME}: made in {time.monotonic() - started:.0f} s")
    net.requires_grad_(False)
    return net.eval()


def cache_path(cache_dir: Path | None, recipe: Recipe, source_key: str) -> Path:
    if cache_dir is None:
        cache_dir = config.load().home / "cache"
    return Path(cache_dir) / f"supernet_minilm-{recipe.digest()}-{source_key}.pt"


def build_supernet(cache_dir: Path | None = None, recipe: Recipe = RECIPE,
                   log: Callable[[str], None] | None = None,
                   source: Source | None = None) -> tuple[BertSupernet, Source]:
    """(the supernet, eval mode and frozen; its source): loaded from the cache, else made
    from ``source`` (default ``minilm-topics``) and cached."""
    source = minilm_source(cache_dir) if source is None else source
    path = cache_path(cache_dir, recipe, source.key)
    if path.exists():
        try:
            net = BertSupernet(replace(source.teacher.arch, head_choices=recipe.head_choices,
                                       ffn_choices=recipe.ffn_choices,
                                       min_depth=recipe.min_depth))
            net.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))
            net.requires_grad_(False)
            return net.eval(), source
        except Exception as exc:  # noqa: BLE001 - a torn or stale file: make it again
            _log.warning("%s: unreadable cache %s (%s); making it again", NAME, path, exc)
    net = train(recipe, source, log)
    save_state(net, path)
    return net, source

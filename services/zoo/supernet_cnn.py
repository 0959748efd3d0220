"""``supernet-cnn``: a weight-shared conv supernet that offramp trains itself on
``chain-cnn``'s data, distilled from ``chain-cnn`` (SuperServe §2.2; no supernet weights
ship on PyPI).

Architecture (``services.supernet.conv_supernet``): a small ResNet, stem 16 channels, four
stages of up to two basic blocks with 16/32/64/128 channels, elastic depth (1-2 blocks per
stage) and elastic inner width (0.25-1.0) per stage: 2^4 x 4^4 = 4,096 subnets sharing
0.40 M parameters. A third of ``chain-cnn``'s width at most: its crops are ambiguous, not
hard, and ``chain-cnn`` itself reached the same accuracy at 1/4 of its width.

Training (``RECIPE``): the sandwich rule (the largest, the smallest and two random subnets
every step, gradients summed, as slimmable networks, OFA and BigNAS train), each subnet on
half cross-entropy to the photo label and half distillation from ``chain-cnn``'s softmax,
on fresh augmented crops of training cells (``chain_cnn.bootstrap``), one intra-op thread
so the weights do not depend on the core count. Weights are cached under
``<cache_dir>/supernet_cnn-<recipe hash>.pt``. Normalization statistics are computed per
subnet afterwards (``services.supernet.search``), on training crops too.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from torch.nn import functional as F

from services.common import config
from services.supernet.conv_supernet import ConvArch, ConvSupernet
from services.training.adam import Adam, torch_threads
from services.training.checkpoint import save_state
from services.zoo import chain_cnn

NAME = "supernet-cnn"
DESCRIPTION = ("weight-shared ResNet supernet, 4,096 subnets (depth 1-2 and width 0.25-1 per "
               "stage), distilled from chain-cnn on its photo crops")
ARCH = ConvArch(channels=(16, 32, 64, 128), max_depths=(2, 2, 2, 2), stem=16,
                classes=chain_cnn.CLASSES)
_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Recipe:
    """Everything that shapes the trained weights; its hash names the cache file."""

    channels: tuple[int, ...] = ARCH.channels
    max_depths: tuple[int, ...] = ARCH.max_depths
    stem: int = ARCH.stem
    width_choices: tuple[float, ...] = ARCH.width_choices
    steps: int = 200
    batch: int = 96
    middle: int = 2             # random subnets per step besides the largest and smallest
    lr: float = 5e-3            # one-cycle peak
    weight_decay: float = 5e-4
    distill: float = 0.5        # share of the loss that is distillation from the teacher
    teacher: str = chain_cnn.RECIPE.digest()
    seed: int = 29
    version: int = 1

    @property
    def arch(self) -> ConvArch:
        return ConvArch(self.channels, self.max_depths, self.stem, 3, chain_cnn.CLASSES,
                        self.width_choices)

    def digest(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:16]


RECIPE = Recipe()


def train(recipe: Recipe = RECIPE, teacher: torch.nn.Module | None = None,
          log: Callable[[str], None] | None = None) -> ConvSupernet:
    """A freshly trained supernet (deterministic for a recipe and teacher)."""
    teacher = chain_cnn.build_model() if teacher is None else teacher
    rng = np.random.default_rng((recipe.seed, 3))
    labels = chain_cnn.cells().photo
    started = time.monotonic()
    with torch_threads(1), torch.enable_grad():
        torch.manual_seed(recipe.seed)
        net = ConvSupernet(recipe.arch).train()
        opt = Adam(list(net.parameters()), chain_cnn.one_cycle(recipe.lr, recipe.steps),
                   weight_decay=recipe.weight_decay)
        data = _batches(chain_cnn.bootstrap(recipe.steps * recipe.batch, recipe.seed),
                        recipe.batch)
        for step, (inputs, cells) in enumerate(data):
            x = torch.from_numpy(inputs)
            y = torch.from_numpy(labels[cells])
            with torch.no_grad():
                soft = F.softmax(teacher(x), dim=1)
            for subnet in net.space.sandwich(rng, recipe.middle):
                logits = net(x, subnet)
                kd = F.kl_div(F.log_softmax(logits, dim=1), soft, reduction="batchmean")
                loss = (1 - recipe.distill) * F.cross_entropy(logits, y) + recipe.distill * kd
                loss.backward()
            opt.step()
            opt.zero_grad()
            if log and (step + 1) % 25 == 0:
                log(f"{NAME}: step {step + 1}/{recipe.steps} loss {loss.item():.3f} "
                    f"({time.monotonic() - started:.0f} s)")
    for p in net.parameters():
        p.requires_grad_(False)
    return net.eval()


def _batches(chunks, size: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """The bootstrap generator's (images, cell ids) chunks re-cut into batches of
    ``size``; a last partial batch is dropped."""
    xs: list[np.ndarray] = []
    cs: list[np.ndarray] = []
    for inputs, cells in chunks:
        xs.append(inputs["image"])
        cs.append(cells)
        while sum(len(c) for c in cs) >= size:
            x, c = np.concatenate(xs), np.concatenate(cs)
            yield x[:size], c[:size]
            xs, cs = [x[size:]], [c[size:]]


def cache_path(cache_dir: Path | None = None, recipe: Recipe = RECIPE) -> Path:
    if cache_dir is None:
        cache_dir = config.load().home / "cache"
    return Path(cache_dir) / f"supernet_cnn-{recipe.digest()}.pt"


def build_supernet(cache_dir: Path | None = None, recipe: Recipe = RECIPE,
                   log: Callable[[str], None] | None = None,
                   teacher: torch.nn.Module | None = None) -> ConvSupernet:
    """The trained supernet (eval mode, frozen, no subnet calibrated yet): loaded from
    the cache, else trained (distilled from ``teacher``, default ``chain-cnn``) and
    cached."""
    path = cache_path(cache_dir, recipe)
    if path.exists():
        try:
            net = ConvSupernet(recipe.arch)
            net.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))
            for p in net.parameters():
                p.requires_grad_(False)
            return net.eval()
        except Exception as exc:  # noqa: BLE001 - a torn or stale file: train again
            _log.warning("%s: unreadable cache %s (%s); training again", NAME, path, exc)
    net = train(recipe, teacher, log)
    save_state(net, path)
    return net

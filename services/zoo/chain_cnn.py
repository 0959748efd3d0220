"""``chain-cnn``: a VGG-11-style plain chain CNN that offramp trains itself, offline.

Why it exists: a network without skip connections has a ramp site after every layer
(see ``services/prepare/sites.py``), so it shows ramps everywhere, unlike ResNet-style
models whose sites sit only between blocks.

Architecture (VGG-11 layout at 3/4 width, 32 x 32 input): eight 3x3 conv layers, each
Conv -> BatchNorm -> ReLU, with 2x2 max pooling where VGG-11 has it::

    conv48 M conv96 M conv192 conv192 M conv384 conv384 M conv384 conv384 -> GAP -> fc(384 -> 10)

Spatial sizes 32, 16, 8, 8, 4, 4, 2, 2; 5.19 M parameters, ~86 M multiply-adds per
image, 1.4-1.9 ms per image in ONNX Runtime at batch 1 on a busy 2-core box.
BatchNorm folds into the convs when exported in eval mode. The width is what it is so
that a ramp head (GAP + fc; 6-20 us as ``offramp prepare`` measures it, per-call overhead
rather than arithmetic, yet growing somewhat with the width) stays well under
2 % of the model: heads were 3-4 % of the model at 1/8 width (0.15 ms per image),
1.0-5.4 % at 1/4 width (0.3-0.5 ms), 0.6-3.3 % at 1/2 width (0.6-1.2 ms), and are
0.1-1.8 % at 3/4 width (medians of repeated measurements 0.7-1.4 %).

Data (offline, real pixels): "which photo is this crop from?" over ten of scikit-image's
bundled photos (``PHOTOS``; colour scenes and grey textures). Each photo, scaled to a
288-pixel short side (as ``workloads.photos`` does), is cut into a grid of 72 x 72 cells; a
seeded quarter of every photo's cells is held out. An image is a random window (36-72
px) inside one cell, resized to 32 x 32, randomly mirrored, with brightness, contrast,
tint, grey-scale and sensor-noise jitter. The model trains only on crops of training
cells; :func:`sample_inputs` and the reported accuracy use held-out cells only, so no
pixel of an evaluation image was seen in training. Crops of sky, flat walls or dark
background are genuinely ambiguous, and grey textures differ only in structure, so the
task needs depth: shallow ramps agree less with the final model than deep ones.
Measured: 86 % top-1 on a held-out stream (chance 10 %); 86 % averaged over ten held-out
streams, against 87 % at 1/4 and 1/2 width (ambiguous crops, not capacity, limit it).
Ramps fitted to the model's own outputs agree with it 73, 85, 91, 94, 97, 98, 99 %
(held-out folds) at the seven sites (after conv layers 1-7).

Training (``RECIPE``): 160 AdamW steps of 128 fresh crops with a one-cycle schedule, on
one intra-op thread (results do not depend on the machine's core count), takes 2-2.5
minutes on a busy 2-core box (~0.85 s a step; 200 steps gave no better held-out
accuracy), so ``offramp prepare chain-cnn`` from scratch takes about 3 minutes;
weights are cached under ``<cache_dir>/chain_cnn-<recipe hash>.pt``, so a warm
:func:`build_model` takes well under a second.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from services.common import config
from services.training.adam import Adam, torch_threads
from services.training.checkpoint import save_state
from services.workloads.frames import PHOTO_SHORT_SIDE, to_rgb01

PHOTOS = (
    "astronaut",
    "camera",
    "coins",
    "chelsea",
    "coffee",
    "rocket",
    "immunohistochemistry",
    "brick",
    "grass",
    "gravel",
)
CLASSES = len(PHOTOS)
SIZE = 32
IMAGE_SHAPE = (3, SIZE, SIZE)
# VGG-11 ("A") layout at 3/4 width: ints are 3x3 conv layers, "M" a 2x2 max pool.
LAYERS: tuple[int | str, ...] = (48, "M", 96, "M", 192, 192, "M", 384, 384, "M", 384, 384)
CONV_LAYERS = sum(isinstance(v, int) for v in LAYERS)
CELL = 72  # grid cell side in pixels of the 288-px-short-side photos
HELD_OUT = 0.25  # fraction of each photo's cells kept out of training
MEAN, STD = 0.5, 0.5  # pixels in [0, 1] -> (x - MEAN) / STD
BOOTSTRAP_CHUNK = 128
DESCRIPTION = (
    f"VGG-11-style chain CNN at 3/4 width ({CONV_LAYERS} conv layers, no skips), "
    f"3x{SIZE}x{SIZE} crops of {CLASSES} scikit-image photos, trained offline"
)


@dataclass(frozen=True)
class Recipe:
    """Everything that shapes the trained weights; its hash names the cache file."""

    layers: tuple[int | str, ...] = LAYERS
    photos: tuple[str, ...] = PHOTOS
    cell: int = CELL
    held_out: float = HELD_OUT
    steps: int = 160
    batch: int = 128
    lr: float = 1e-2  # one-cycle peak
    weight_decay: float = 5e-4
    seed: int = 20241
    version: int = 2  # bump when the data pipeline or training loop changes

    def digest(self) -> str:
        text = json.dumps(asdict(self), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


RECIPE = Recipe()
_log = logging.getLogger(__name__)


# --- model ----------------------------------------------------------------------------


class ChainCNN(nn.Module):
    """Plain chain: ``features`` (conv/BN/ReLU layers and pools) -> GAP -> ``fc``."""

    def __init__(self, layers: tuple[int | str, ...] = LAYERS, classes: int = CLASSES):
        super().__init__()
        mods: list[nn.Module] = []
        cin = IMAGE_SHAPE[0]
        for v in layers:
            if v == "M":
                mods.append(nn.MaxPool2d(2))
            else:
                assert isinstance(v, int)
                mods += [nn.Conv2d(cin, v, 3, padding=1, bias=False), nn.BatchNorm2d(v),
                         nn.ReLU(inplace=True)]
                cin = v
        self.features = nn.Sequential(*mods)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(cin, classes)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        return self.fc(self.pool(self.features(image)).flatten(1))


# --- data -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Cells:
    """The grid cells of all photos (arrays indexed by global cell id)."""

    photo: np.ndarray  # int64 class label
    y0: np.ndarray  # int64 top-left corner in photo pixels
    x0: np.ndarray
    held: np.ndarray  # bool: held out of training

    def ids(self, held: bool) -> np.ndarray:
        return np.flatnonzero(self.held == held)


@lru_cache(maxsize=4)
def _images(names: tuple[str, ...] = PHOTOS) -> tuple[torch.Tensor, ...]:
    """Each photo as float32 1 x 3 x H x W in [0, 1], scaled to a short side of 288."""
    from skimage import data

    out = []
    for name in names:
        try:
            img = torch.from_numpy(to_rgb01(getattr(data, name)())).permute(2, 0, 1)[None]
        except Exception as exc:
            raise RuntimeError(f"scikit-image photo {name!r} unavailable: {exc}") from exc
        h, w = img.shape[-2:]
        k = PHOTO_SHORT_SIDE / min(h, w)
        size = (max(PHOTO_SHORT_SIDE, round(h * k)), max(PHOTO_SHORT_SIDE, round(w * k)))
        img = F.interpolate(img, size=size, mode="bilinear", antialias=k < 1,
                            align_corners=False)
        out.append(img.clamp(0.0, 1.0).contiguous())
    return tuple(out)


@lru_cache(maxsize=4)
def cells(recipe: Recipe = RECIPE) -> Cells:
    """All cells, with a seeded ``held_out`` share of every photo's cells held out."""
    rows = []
    for k, img in enumerate(_images(recipe.photos)):
        h, w = img.shape[-2:]
        rows += [(k, r * recipe.cell, c * recipe.cell)
                 for r in range(h // recipe.cell) for c in range(w // recipe.cell)]
    arr = np.array(rows, np.int64)
    held = np.zeros(len(arr), bool)
    rng = np.random.default_rng((recipe.seed, 7))
    for k in range(len(recipe.photos)):
        idx = np.flatnonzero(arr[:, 0] == k)
        held[rng.choice(idx, max(1, round(len(idx) * recipe.held_out)), replace=False)] = True
    return Cells(arr[:, 0].copy(), arr[:, 1].copy(), arr[:, 2].copy(), held)


@dataclass
class Views:
    """Per-image rendering parameters (arrays of length n)."""

    cell: np.ndarray  # int64 global cell id
    side: np.ndarray  # window side as a fraction of the cell side
    oy: np.ndarray  # window offset inside the cell, fraction of the free range
    ox: np.ndarray
    flip: np.ndarray  # bool, mirror horizontally
    gain: np.ndarray  # brightness multiplier
    contrast: np.ndarray
    tint: np.ndarray  # n x 3 per-channel multipliers
    gray: np.ndarray  # bool, convert to grey
    noise: np.ndarray  # sensor noise standard deviation (pixels in [0, 1])


def random_views(cell_ids: np.ndarray, rng: np.random.Generator) -> Views:
    """Independent training-style augmentations of the given cells."""
    n = len(cell_ids)
    return Views(
        cell=np.asarray(cell_ids, np.int64),
        side=rng.uniform(0.5, 1.0, n),
        oy=rng.random(n),
        ox=rng.random(n),
        flip=rng.random(n) < 0.5,
        gain=rng.uniform(0.75, 1.25, n),
        contrast=rng.uniform(0.75, 1.25, n),
        tint=1.0 + 0.08 * rng.standard_normal((n, 3)),
        gray=rng.random(n) < 0.1,
        noise=rng.uniform(0.0, 0.04, n),
    )


def render(v: Views, noise: torch.Tensor, recipe: Recipe = RECIPE) -> np.ndarray:
    """float32 n x 3 x 32 x 32 normalised images; ``noise`` is n x 3 x 32 x 32 N(0, 1)."""
    cs, imgs = cells(recipe), _images(recipe.photos)
    n = len(v.cell)
    out = torch.empty((n, 3, SIZE, SIZE))
    base = (torch.arange(SIZE, dtype=torch.float64) + 0.5) / SIZE
    photo = cs.photo[v.cell]
    for k in np.unique(photo):
        sel = np.flatnonzero(photo == k)
        img = imgs[k]
        h, w = img.shape[-2:]
        side = torch.from_numpy(v.side[sel] * recipe.cell)
        y0 = torch.from_numpy(cs.y0[v.cell[sel]] + v.oy[sel] * (recipe.cell - side.numpy()))
        x0 = torch.from_numpy(cs.x0[v.cell[sel]] + v.ox[sel] * (recipe.cell - side.numpy()))
        ys = y0[:, None] + base[None] * side[:, None]
        xs = x0[:, None] + base[None] * side[:, None]
        xs = torch.where(torch.from_numpy(v.flip[sel])[:, None], xs.flip(1), xs)
        gy = (ys * (2.0 / h) - 1.0)[:, :, None].expand(-1, -1, SIZE)
        gx = (xs * (2.0 / w) - 1.0)[:, None, :].expand(-1, SIZE, -1)
        grid = torch.stack([gx, gy], -1).float().reshape(1, len(sel) * SIZE, SIZE, 2)
        crops = F.grid_sample(img, grid, mode="bilinear", padding_mode="border",
                              align_corners=False)
        out[torch.from_numpy(sel)] = crops.reshape(3, len(sel), SIZE, SIZE).transpose(0, 1)

    def col(a: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.asarray(a, np.float32)).reshape(n, -1, 1, 1)

    gray = torch.from_numpy(v.gray).reshape(n, 1, 1, 1)
    out = torch.where(gray, out.mean(1, keepdim=True).expand(-1, 3, -1, -1), out)
    mean = out.mean((1, 2, 3), keepdim=True)
    out = (out - mean) * col(v.contrast) + mean
    out = out * col(v.gain) * col(v.tint) + col(v.noise) * noise
    out = (out.clamp(0.0, 1.0) - MEAN) / STD
    return out.numpy()


def _iid(cell_pool: np.ndarray, n: int, rng: np.random.Generator, gen: torch.Generator,
         recipe: Recipe = RECIPE) -> tuple[np.ndarray, np.ndarray]:
    """n independent augmented crops of cells drawn from ``cell_pool``: (images, cell ids)."""
    ids = cell_pool[rng.integers(len(cell_pool), size=n)]
    x = render(random_views(ids, rng), torch.randn((n, 3, SIZE, SIZE), generator=gen), recipe)
    return x, ids


def bootstrap(n: int, seed: int) -> Iterator[tuple[dict[str, np.ndarray], np.ndarray]]:
    """Chunks of ``BOOTSTRAP_CHUNK`` training-distribution images and their groups.

    Images are fresh augmentations of *training* cells (so any n is available); the
    group of an image is its global cell id, so a group-wise held-out split evaluates
    ramps on windows of cells they never saw. The streams of :func:`sample_inputs` come
    from the held-out cells, which neither the model nor the ramps trained on.
    """
    pool = cells().ids(held=False)
    rng = np.random.default_rng((seed, 11))
    gen = torch.Generator().manual_seed(seed * 7919 + 11)
    for start in range(0, n, BOOTSTRAP_CHUNK):
        x, ids = _iid(pool, min(BOOTSTRAP_CHUNK, n - start), rng, gen)
        yield {"image": x}, ids


def stream_views(n: int, seed: int = 0, min_run: int = 8, max_run: int = 64) -> Views:
    """A held-out stream plan: runs of one cell (so one class) with drifting views.

    Within a run the window pans and zooms slowly across the cell; brightness and
    noise drift slowly over the whole stream (a sinusoid of ~700 and ~1100 images), so
    both consecutive images and neighbouring runs are alike. Whole runs are drawn and
    the stream cut afterwards, so any prefix of a longer stream equals the shorter one.
    """
    cs = cells()
    held = cs.ids(held=True)
    rng = np.random.default_rng((seed, 5))
    cols: dict[str, list[np.ndarray]] = {k: [] for k in
                                         ("cell", "side", "oy", "ox", "flip", "tint")}
    done, last_photo = 0, -1
    while done < n:
        length = int(rng.integers(min_run, max_run + 1))
        cell = int(held[rng.integers(len(held))])
        if cs.photo[cell] == last_photo:  # a new run shows another photo
            others = held[cs.photo[held] != last_photo]
            cell = int(others[rng.integers(len(others))])
        last_photo = int(cs.photo[cell])
        t = np.linspace(0.0, 1.0, length)

        def drift(lo: float, hi: float, step: float, t: np.ndarray = t) -> np.ndarray:
            a = rng.uniform(lo, hi)
            b = np.clip(a + rng.uniform(-step, step), lo, hi)
            return a + (b - a) * t

        cols["cell"].append(np.full(length, cell, np.int64))
        cols["side"].append(drift(0.5, 1.0, 0.3))
        cols["oy"].append(drift(0.0, 1.0, 0.6))
        cols["ox"].append(drift(0.0, 1.0, 0.6))
        cols["flip"].append(np.full(length, rng.random() < 0.5))
        cols["tint"].append(np.repeat(1.0 + 0.05 * rng.standard_normal((1, 3)), length, 0))
        done += length
    v = {k: np.concatenate(a)[:n] for k, a in cols.items()}
    i = np.arange(n, dtype=np.float64)
    ph = np.random.default_rng((seed, 6)).uniform(0.0, 2.0 * np.pi, 3)
    return Views(
        **v,
        gain=1.0 + 0.2 * np.sin(2 * np.pi * i / 700 + ph[0]),
        contrast=1.0 + 0.15 * np.sin(2 * np.pi * i / 900 + ph[1]),
        gray=np.zeros(n, bool),
        noise=0.02 + 0.02 * np.sin(2 * np.pi * i / 1100 + ph[2]),
    )


def sample_stream(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(images float32 n x 3 x 32 x 32, labels int64 n) of a held-out stream."""
    if n <= 0:
        return np.zeros((0, *IMAGE_SHAPE), np.float32), np.zeros(0, np.int64)
    v = stream_views(n, seed)
    # Noise from a small bank indexed by position: cheap, and prefix-stable.
    bank = torch.randn((16, 3, SIZE, SIZE), generator=torch.Generator().manual_seed(seed))
    x = render(v, bank[torch.arange(n) % len(bank)])
    return x, cells().photo[v.cell]


def sample_inputs(n: int, seed: int = 0) -> dict[str, np.ndarray]:
    """n held-out images as a stream with temporal locality (see :func:`stream_views`)."""
    return {"image": sample_stream(n, seed)[0]}


# --- training and cache ---------------------------------------------------------------


def one_cycle(peak: float, steps: int) -> Callable[[int], float]:
    """Learning rate at step t: linear warm-up from ``peak / 25`` over the first 20 % of
    steps, then cosine decay to ``peak / 1e4``."""
    warm = max(1, round(0.2 * steps))
    low = peak / 1e4

    def lr(t: int) -> float:
        if t < warm:
            return peak / 25 + (peak - peak / 25) * t / warm
        frac = min(1.0, (t - warm) / max(1, steps - warm))
        return low + (peak - low) * 0.5 * (1 + math.cos(math.pi * frac))

    return lr


def train(recipe: Recipe = RECIPE, log: Callable[[str], None] | None = None) -> ChainCNN:
    """Train a fresh model on crops of training cells (deterministic for a recipe).

    Runs on one intra-op thread: float reductions then happen in one fixed order, so
    the weights do not depend on the core count (and a busy box is not oversubscribed).
    """
    cs = cells(recipe)
    pool = cs.ids(held=False)
    rng = np.random.default_rng((recipe.seed, 1))
    gen = torch.Generator().manual_seed(recipe.seed)
    with torch_threads(1), torch.enable_grad():
        torch.manual_seed(recipe.seed)  # layer init draws from the global generator
        model = ChainCNN(recipe.layers, len(recipe.photos)).to(memory_format=torch.channels_last)
        opt = Adam(list(model.parameters()), one_cycle(recipe.lr, recipe.steps),
                   weight_decay=recipe.weight_decay)
        model.train()
        for step in range(recipe.steps):
            x, ids = _iid(pool, recipe.batch, rng, gen, recipe)
            xb = torch.from_numpy(x).contiguous(memory_format=torch.channels_last)
            loss = F.cross_entropy(model(xb), torch.from_numpy(cs.photo[ids]))
            loss.backward()
            opt.step()
            opt.zero_grad()
            if log and (step + 1) % 50 == 0:
                log(f"step {step + 1}/{recipe.steps} loss {loss.item():.3f}")
    model = model.to(memory_format=torch.contiguous_format)
    return _freeze(model)


def _freeze(model: ChainCNN) -> ChainCNN:
    for p in model.parameters():
        p.requires_grad_(False)
    return model.eval()


def cache_path(cache_dir: Path | None = None, recipe: Recipe = RECIPE) -> Path:
    if cache_dir is None:
        cache_dir = config.load().home / "cache"
    return Path(cache_dir) / f"chain_cnn-{recipe.digest()}.pt"


def build_model(cache_dir: Path | None = None, recipe: Recipe = RECIPE) -> ChainCNN:
    """The trained model (eval mode, frozen): loaded from the cache, else trained and cached.

    ``forward(image)`` maps float32 N x 3 x 32 x 32 to N x ``CLASSES`` logits.
    """
    path = cache_path(cache_dir, recipe)
    if path.exists():
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
            model = ChainCNN(recipe.layers, len(recipe.photos))
            model.load_state_dict(state)
            return _freeze(model)
        except Exception as exc:  # noqa: BLE001 - a torn or stale file: train again
            _log.warning("chain_cnn: unreadable cache %s (%s); training again", path, exc)
    model = train(recipe)
    save_state(model, path)
    return model


def accuracy(model: nn.Module, n: int = 2000, seed: int = 1) -> float:
    """Top-1 accuracy on a held-out stream (cells never used in training)."""
    x, y = sample_stream(n, seed)
    with torch.no_grad():
        pred = model(torch.from_numpy(x)).argmax(1).numpy()
    return float((pred == y).mean())

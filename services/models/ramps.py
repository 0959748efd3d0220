"""Ramp heads: pooling + one linear layer, trained on the model's own final top-1.

Following Apparate, ramps are shallow and the labels need no ground truth: the base
model is frozen and each ramp learns to predict what the final model will say. All
sites' pooled features are gathered in one pass through the exported ONNX blocks, then
each linear layer trains in seconds on those small feature matrices.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from services.models.runtime import StageRuntime

POOLS = ("gap", "mean", "first")
Log = Callable[[str], None]


def stderr_log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def pool_np(x: np.ndarray, pool: str = "gap") -> np.ndarray:
    """N×C×H×W -> N×C by global average; N×S×H -> N×H by mean or first token; N×C as is."""
    if x.ndim == 4:
        return x.mean(axis=(2, 3))
    if x.ndim == 3:
        return x[:, 0] if pool == "first" else x.mean(axis=1)
    if x.ndim == 2:
        return x
    raise ValueError(f"cannot pool activations of shape {x.shape}")


def arch_name(ndim: int, pool: str) -> str:
    if ndim == 2:
        return "fc"
    return f"{'gap' if ndim == 4 else pool}_fc"


class RampHead(nn.Module):
    """Pooling + Linear(C -> classes); the exported ramp."""

    def __init__(self, in_features: int, classes: int, ndim: int, pool: str = "gap"):
        super().__init__()
        if pool not in POOLS:
            raise ValueError(f"unknown pool {pool!r}; known: {POOLS}")
        self.ndim = ndim
        self.pool = pool
        self.fc = nn.Linear(in_features, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.ndim == 4:
            x = x.mean(dim=(2, 3))
        elif self.ndim == 3:
            x = x[:, 0] if self.pool == "first" else x.mean(dim=1)
        return self.fc(x)


@dataclass
class Features:
    """Pooled activations per ramp site (block index), final labels and data groups."""

    by_block: dict[int, np.ndarray]  # block index -> float32 N×C
    ndims: dict[int, int]  # block index -> rank of the raw activation (with batch)
    labels: np.ndarray  # int64 N, the final model's top-1
    groups: np.ndarray  # int64 N, e.g. scene ids, for an honest held-out split


def collect_features(
    rt: StageRuntime,
    sites: list[int],
    batches: Iterable[tuple[dict[str, np.ndarray], np.ndarray]],
    total: int,
    pool: str = "gap",
    log: Log = stderr_log,
) -> Features:
    """One pass over the bootstrap data: pool at every site right away (memory stays small)."""
    pooled: dict[int, list[np.ndarray]] = {s: [] for s in sites}
    ndims: dict[int, int] = {}
    labels, groups = [], []
    done, t0, next_report = 0, time.perf_counter(), 0.0
    for inputs, group in batches:
        x: dict[str, np.ndarray] | np.ndarray = inputs
        for i in range(rt.first_block, rt.last_block):
            x = rt.run_block(i, x)
            if i in pooled:
                ndims[i] = x.ndim
                pooled[i].append(pool_np(x, pool).astype(np.float32))
        assert isinstance(x, np.ndarray)
        labels.append(x.argmax(axis=1).astype(np.int64))
        groups.append(np.asarray(group, np.int64))
        done += len(group)
        elapsed = time.perf_counter() - t0
        if elapsed >= next_report or done >= total:
            log(f"features {done}/{total} ({elapsed:.0f} s)")
            next_report = elapsed + 5.0
    return Features(
        by_block={s: np.concatenate(v) for s, v in pooled.items()},
        ndims=ndims,
        labels=np.concatenate(labels),
        groups=np.concatenate(groups),
    )


def group_folds(groups: np.ndarray, folds: int = 5) -> list[np.ndarray]:
    """Held-out masks, one per fold: every k-th group, so held-out scenes are unseen.

    With fewer groups than folds, contiguous chunks of samples stand in for groups.
    """
    uniq = np.unique(groups)
    if len(uniq) < folds:
        chunk = np.arange(len(groups)) * folds // max(len(groups), 1)
        return [chunk == f for f in range(folds)]
    return [np.isin(groups, uniq[f::folds]) for f in range(folds)]


def fit_linear(
    x: np.ndarray,
    y: np.ndarray,
    classes: int,
    steps: int = 300,
    lr: float = 1e-2,
    l2: float = 2e-2,
    seed: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """Softmax regression (W classes×C, b classes), fitted full-batch with Adam + L2.

    The L2 penalty (on standardised features) matters for calibration more than for
    agreement: without it heads overfit (train ~97%) and their confident predictions
    on unseen scenes are often wrong, which makes exit thresholds useless.

    Only classes present in ``y`` are fitted (a few dozen of 1000 on a video stream,
    so ~20× cheaper); absent classes get zero weights and a bias far below every seen
    logit, which is where a full fit would push them anyway. Features are standardised
    for a well-conditioned fit and the scaling is folded back into W and b, so the
    exported head takes raw pooled activations.
    """
    seen = np.unique(y)
    mean = x.mean(axis=0)
    std = x.std(axis=0) + 1e-6
    xt = torch.from_numpy((x - mean) / std)
    yt = torch.from_numpy(np.searchsorted(seen, y))
    torch.manual_seed(seed)
    lin = nn.Linear(x.shape[1], len(seen))
    opt = torch.optim.Adam(lin.parameters(), lr=lr)
    with torch.enable_grad():
        for _ in range(steps):
            opt.zero_grad()
            loss = nn.functional.cross_entropy(lin(xt), yt)
            (loss + l2 * lin.weight.pow(2).sum(dim=1).mean()).backward()
            opt.step()
    with torch.no_grad():
        floor = float(lin(xt).min()) - 15.0  # e^-15: absent classes take no real mass
    w = np.zeros((classes, x.shape[1]), np.float32)
    b = np.full(classes, floor, np.float32)
    w[seen] = lin.weight.detach().numpy() / std[None, :]
    b[seen] = lin.bias.detach().numpy() - w[seen] @ mean
    return w, b


def agreement(w: np.ndarray, b: np.ndarray, x: np.ndarray, y: np.ndarray) -> float:
    if len(y) == 0:
        return float("nan")
    return float(((x @ w.T + b).argmax(axis=1) == y).mean())


@dataclass
class RampFit:
    after_block: int
    weight: np.ndarray
    bias: np.ndarray
    agreement: float  # mean held-out top-1 agreement with the final model over folds
    fold_agreement: list[float]
    train_agreement: float  # of the exported head on all its training data
    arch: str
    ndim: int
    pool: str

    @property
    def params(self) -> int:
        return int(self.weight.size + self.bias.size)


def train_ramps(
    feats: Features,
    classes: int,
    pool: str = "gap",
    folds: int = 5,
    steps: int = 300,
    log: Log = stderr_log,
) -> list[RampFit]:
    """Fit every site; agreement is k-fold by group, the exported head uses all data.

    Held-out agreement varies a lot with which scenes are held out, so one 80/20 split
    is a noisy estimate; the mean over folds is the figure recorded in the manifest.
    """
    masks = group_folds(feats.groups, folds)
    fits = []
    for site in sorted(feats.by_block):
        x, y = feats.by_block[site], feats.labels
        per_fold = []
        for test in masks:
            if test.all() or not test.any():
                continue
            w, b = fit_linear(x[~test], y[~test], classes, steps=steps)
            per_fold.append(round(agreement(w, b, x[test], y[test]), 4))
        w, b = fit_linear(x, y, classes, steps=steps)
        held = float(np.mean(per_fold)) if per_fold else float("nan")
        seen = agreement(w, b, x, y)
        ndim = feats.ndims[site]
        fits.append(RampFit(site, w, b, held, per_fold, seen, arch_name(ndim, pool), ndim, pool))
        log(
            f"ramp after block {site}: C={x.shape[1]} held-out agreement {held:.3f} "
            f"(folds {min(per_fold, default=0):.2f}-{max(per_fold, default=0):.2f}, "
            f"train {seen:.3f})"
        )
    return fits


def head_module(fit: RampFit) -> RampHead:
    head = RampHead(fit.weight.shape[1], fit.weight.shape[0], fit.ndim, fit.pool)
    with torch.no_grad():
        head.fc.weight.copy_(torch.from_numpy(fit.weight))
        head.fc.bias.copy_(torch.from_numpy(fit.bias))
    return head.eval()

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


def holdout_mask(groups: np.ndarray, fraction: float = 0.2) -> np.ndarray:
    """True for held-out samples: every k-th group, so held-out scenes are unseen."""
    uniq = np.unique(groups)
    k = max(2, round(1 / fraction))
    if len(uniq) >= k:
        return np.isin(groups, uniq[k - 1 :: k])
    # Too few groups: hold out the last contiguous chunk instead.
    mask = np.zeros(len(groups), bool)
    mask[int(len(groups) * (1 - fraction)) :] = True
    return mask


def fit_linear(
    x: np.ndarray,
    y: np.ndarray,
    classes: int,
    steps: int = 300,
    lr: float = 1e-2,
    weight_decay: float = 1e-4,
    seed: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """Softmax regression (W classes×C, b classes), fitted full-batch with AdamW.

    Features are standardised for a well-conditioned fit; the scaling is folded back
    into W and b so the exported head takes raw pooled activations.
    """
    mean = x.mean(axis=0)
    std = x.std(axis=0) + 1e-6
    xt = torch.from_numpy((x - mean) / std)
    yt = torch.from_numpy(y)
    torch.manual_seed(seed)
    lin = nn.Linear(x.shape[1], classes)
    opt = torch.optim.AdamW(lin.parameters(), lr=lr, weight_decay=weight_decay)
    with torch.enable_grad():
        for _ in range(steps):
            opt.zero_grad()
            nn.functional.cross_entropy(lin(xt), yt).backward()
            opt.step()
    w = lin.weight.detach().numpy() / std[None, :]
    b = lin.bias.detach().numpy() - w @ mean
    return w.astype(np.float32), b.astype(np.float32)


def agreement(w: np.ndarray, b: np.ndarray, x: np.ndarray, y: np.ndarray) -> float:
    if len(y) == 0:
        return float("nan")
    return float(((x @ w.T + b).argmax(axis=1) == y).mean())


@dataclass
class RampFit:
    after_block: int
    weight: np.ndarray
    bias: np.ndarray
    agreement: float  # held-out top-1 agreement with the final model
    train_agreement: float
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
    holdout: float = 0.2,
    steps: int = 300,
    log: Log = stderr_log,
) -> list[RampFit]:
    """Fit every site; score on held-out groups, then refit on all data for export."""
    test = holdout_mask(feats.groups, holdout)
    train = ~test
    fits = []
    for site in sorted(feats.by_block):
        x, y = feats.by_block[site], feats.labels
        w, b = fit_linear(x[train], y[train], classes, steps=steps)
        held = agreement(w, b, x[test], y[test])
        seen = agreement(w, b, x[train], y[train])
        # The estimate above is of the procedure; the exported head uses every sample.
        w, b = fit_linear(x, y, classes, steps=steps)
        fits.append(RampFit(site, w, b, held, seen, arch_name(feats.ndims[site], pool),
                            feats.ndims[site], pool))
        log(f"ramp after block {site}: C={x.shape[1]} held-out agreement {held:.3f} "
            f"(train {seen:.3f}, {int(test.sum())} held-out samples)")
    return fits


def head_module(fit: RampFit) -> RampHead:
    head = RampHead(fit.weight.shape[1], fit.weight.shape[0], fit.ndim, fit.pool)
    with torch.no_grad():
        head.fc.weight.copy_(torch.from_numpy(fit.weight))
        head.fc.bias.copy_(torch.from_numpy(fit.bias))
    return head.eval()

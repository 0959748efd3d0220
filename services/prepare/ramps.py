"""Ramp heads: pooling + one linear layer, trained on the model's own final output (its
top-1, or its softmax where a model's spec asks for distillation: ``TARGETS``).

Following Apparate, ramps are shallow and the labels need no ground truth: the base
model is frozen and each ramp learns to predict what the final model will say. All
sites' pooled features are gathered in one pass of the whole ONNX model, then
each linear layer trains in seconds on those small feature matrices.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from services.runtime.pooling import POOLS, pool_np
from services.training.adam import Adam, torch_threads

# "masked_mean": a text model's mean over its real tokens (the head also reads the
# attention mask). On MiniLM's fortunes it beat the plain mean, which also averages the
# padding, by 2-4 points of held-out agreement per ramp (first token: 3-7 points below).
# What a ramp learns of the final model: its top-1 ("top1") or its softmax ("softmax",
# distillation, sharpened: see below). An exit needs a ramp that is *confident exactly where
# it agrees*, and the final model's own doubt (a 0.4 / 0.35 split) is what the ramp should
# learn to doubt too.
# On MiniLM's topics (5-fold held-out bootstrap, sites 6 / 8 / 9): top-1 agreement +1.7 /
# +1.8 / +2.5 points and the share of texts a ramp answers within 0.5 % disagreement 4.4 ->
# 12.7 %, 13.5 -> 20.0 %, 17.4 -> 18.7 %.
#
# The softmax is sharpened (temperature ``SOFT_TEMPERATURE``): on three held-out MiniLM
# streams (replays of ramps fitted offline on the same features), the plain softmax moved
# exits to earlier ramps (answers by site 9: 24 -> 39 % of texts) but the last ramp grew so
# unsure that fewer texts exited at all (71 / 40 / 70 % -> 51 / 52 / 65 %); at 0.5 the early
# answers stay (41 %) and the exits come back (66 / 55 / 68 %); mean latency 16.3 / 12.7 /
# 16.1 % below vanilla with top-1 targets, 19.8 / 21.7 / 21.7 % at 0.5, agreement >= 99.1 %.
TARGETS = ("top1", "softmax")
SOFT_TEMPERATURE = 0.5
SOFT_MASS = 0.01  # softmax targets: a class no row gives this much stays unfitted
# Ramp fits are compute-bound batched products (EfficientNet: 6 fits x 4,000 rows x 59
# seen classes) run while preparing, with nothing else to share the cores: two threads
# halve them. (The zoo models' own small trainings stay on one thread.)
FIT_THREADS = max(1, min(2, os.cpu_count() or 1))
# Held-out agreement is the mean over group folds; once one fold holds this many samples
# (EfficientNet's 16,000 frames: 3,200 from about 47 scenes) a single fold estimates it,
# and the ramps train in two fits instead of six (the exported all-data fit is the same).
ONE_FOLD_ROWS = 3000
Log = Callable[[str], None]


def stderr_log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def arch_name(ndim: int, pool: str) -> str:
    if ndim == 2:
        return "fc"
    return f"{'gap' if ndim == 4 else {'masked_mean': 'mmean'}.get(pool, pool)}_fc"


class RampHead(nn.Module):
    """Pooling + Linear(C -> classes); the exported ramp. With ``masked_mean`` pooling it
    takes the attention mask (N×S, any numeric type) as a second input."""

    def __init__(self, in_features: int, classes: int, ndim: int, pool: str = "gap"):
        super().__init__()
        if pool not in POOLS:
            raise ValueError(f"unknown pool {pool!r}; known: {POOLS}")
        self.ndim = ndim
        self.pool = pool
        self.fc = nn.Linear(in_features, classes)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        if self.ndim == 4:
            x = x.mean(dim=(2, 3))
        elif self.ndim == 3 and self.pool == "masked_mean":
            if mask is None:
                raise ValueError("masked_mean pooling needs the attention mask")
            m = mask.to(x.dtype).unsqueeze(-1)
            x = (x * m).sum(dim=1) / m.sum(dim=1).clamp(min=1.0)
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
    shapes: dict[int, tuple[int, ...]] = field(default_factory=dict)  # raw, batch axis dropped
    logits: np.ndarray | None = None  # float32 N x classes, the final model's (soft targets)


def collect_features(
    session,
    sites: list[str],
    batches: Iterable[tuple[dict[str, np.ndarray], np.ndarray]],
    total: int,
    pool: str = "gap",
    log: Log = stderr_log,
    mask_input: str = "",
    keep_logits: bool = False,
) -> Features:
    """One pass of the whole model over the bootstrap data with every site tensor as an
    extra output (``onnx_blocks.add_outputs``); activations are pooled right away so memory
    stays small. ``Features.by_block[k]`` holds site ``k`` (the output of block ``k``).
    ``mask_input``: the model input that masked_mean pooling reads. ``keep_logits``: keep
    the final logits too (softmax targets; N x classes can be large, so only when asked)."""
    pooled: dict[int, list[np.ndarray]] = {k: [] for k in range(len(sites))}
    ndims: dict[int, int] = {}
    shapes: dict[int, tuple[int, ...]] = {}
    labels, groups, finals = [], [], []
    names = [i.name for i in session.get_inputs()]
    done, t0, next_report = 0, time.perf_counter(), 0.0
    for inputs, group in batches:
        outs = session.run(None, {k: inputs[k] for k in names})
        logits, acts = outs[0], outs[1:]
        mask = inputs[mask_input] if mask_input else None
        for k, a in enumerate(acts):
            ndims[k], shapes[k] = a.ndim, tuple(a.shape[1:])
            pooled[k].append(pool_np(a, pool, mask).astype(np.float32))
        labels.append(logits.argmax(axis=1).astype(np.int64))
        if keep_logits:
            finals.append(np.asarray(logits, np.float32))
        groups.append(np.asarray(group, np.int64))
        done += len(group)
        elapsed = time.perf_counter() - t0
        if elapsed >= next_report or done >= total:
            log(f"features {done}/{total} ({elapsed:.0f} s)")
            next_report = elapsed + 5.0
    if not labels:
        raise ValueError("no bootstrap data: cannot train ramps")
    return Features(
        by_block={k: np.concatenate(v) for k, v in pooled.items()},
        ndims=ndims,
        labels=np.concatenate(labels),
        groups=np.concatenate(groups),
        shapes=shapes,
        logits=np.concatenate(finals) if keep_logits else None,
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
    train_masks: list[np.ndarray] | None = None,
    steps: int = 300,
    lr: float = 1e-2,
    l2: float = 2e-2,
    seed: int = 0,
    soft: np.ndarray | None = None,
) -> list[tuple[np.ndarray, np.ndarray]]:
    """Softmax regressions (W classes×C, b classes), one per training mask over the rows of
    ``x`` (default: all rows), fitted together full-batch with Adam + L2.

    All fits of a ramp (its cross-validation folds and the final fit) train as one
    batched problem: the summed loss has independent gradients per fit and Adam is
    elementwise, so this equals separate fits at a fraction of the per-op overhead.

    The L2 penalty (on standardised features) matters for calibration more than for
    agreement: without it heads overfit (train ~97%) and their confident predictions
    on unseen scenes are often wrong, which makes exit thresholds useless.

    Only classes present in ``y`` are fitted (a few dozen of 1000 on a video stream,
    so ~20× cheaper); absent classes get zero weights and a bias far below every seen
    logit, which is where a full fit would push them anyway. Features are standardised
    per fit for a well-conditioned problem and the scaling is folded back into W and b,
    so the exported head takes raw pooled activations.
    """
    masks = [np.ones(len(y), bool)] if train_masks is None else train_masks
    seen = np.unique(y)
    if soft is not None:  # a runner-up carries the doubt a ramp should learn: fit it too
        probs = torch.softmax(torch.from_numpy(np.asarray(soft, np.float32)), dim=1)
        seen = np.union1d(seen, np.flatnonzero(probs.max(dim=0).values.numpy() >= SOFT_MASS))
    m = torch.from_numpy(np.stack(masks).astype(np.float32))  # F×N
    count = m.sum(dim=1).clamp(min=1.0)
    xs, mean, std = _standardised(x, m, count)
    if soft is None:
        target = nn.functional.one_hot(torch.from_numpy(np.searchsorted(seen, y)),
                                       len(seen)).float()
    else:  # the fitted classes' share, renormalised
        target = probs[:, seen]
        target /= target.sum(dim=1, keepdim=True)
    weight = (m / count[:, None])[:, :, None]  # F×N×1: each fit's loss is a mean over its rows
    gen = torch.Generator().manual_seed(seed)
    bound = 1.0 / np.sqrt(x.shape[1])  # nn.Linear's initialisation
    w = ((torch.rand(len(masks), len(seen), x.shape[1], generator=gen) * 2 - 1) * bound)
    b = ((torch.rand(len(masks), len(seen), generator=gen) * 2 - 1) * bound)
    opt = Adam([w, b], lr=lr)
    with torch.no_grad(), torch_threads(FIT_THREADS):
        for _ in range(steps):
            w.grad, b.grad = loss_grads(xs, w, b, target, weight, l2)
            opt.step()
    return _raw_heads(w, b, xs, m, mean, std, seen, classes)


def _standardised(x: np.ndarray, m: torch.Tensor, count: torch.Tensor
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(F×N×C features standardised per fit, F×C means, F×C deviations) over each fit's
    rows ``m`` (F×N, ``count`` rows each)."""
    xt = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))
    mean = (m @ xt) / count[:, None]  # F×C
    std = ((m @ xt.pow(2)) / count[:, None] - mean.pow(2)).clamp(min=0).sqrt() + 1e-6
    return (xt[None] - mean[:, None]) / std[:, None], mean, std


def _raw_heads(w: torch.Tensor, b: torch.Tensor, xs: torch.Tensor, m: torch.Tensor,
               mean: torch.Tensor, std: torch.Tensor, seen: np.ndarray, classes: int
               ) -> list[tuple[np.ndarray, np.ndarray]]:
    """Each fit's (W, b) over every class on raw features: the scaling folded back in, the
    unfitted classes at zero weights and a bias below every logit its rows produced."""
    out = []
    with torch.no_grad():
        logits = torch.baddbmm(b[:, None, :], xs, w.transpose(1, 2))
        for f in range(w.shape[0]):
            rows = m[f] > 0
            floor = float(logits[f][rows].min()) - 15.0  # e^-15: absent classes take no mass
            wf = np.zeros((classes, w.shape[2]), np.float32)
            bf = np.full(classes, floor, np.float32)
            wf[seen] = (w[f] / std[f][None, :]).numpy()
            bf[seen] = (b[f] - (w[f] / std[f][None, :]) @ mean[f]).numpy()
            out.append((wf, bf))
    return out


def loss_grads(xs: torch.Tensor, w: torch.Tensor, b: torch.Tensor, target: torch.Tensor,
               weight: torch.Tensor, l2: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Gradients (w.r.t. ``w`` F×K×C and ``b`` F×K) of fit_linear's loss: per fit f, the
    ``weight``-weighted sum over rows of cross-entropy against ``target`` (N×K: one-hot
    labels or class probabilities; ``weight`` F×N×1: 1/rows in the fit, 0 outside) plus
    ``l2`` × the mean over classes of ||w_fk||².

    Written out rather than left to autograd, whose backward of the batched product
    multiplies by a transposed view of ``xs``: 5× slower than ``grad^T @ xs`` here."""
    logits = torch.baddbmm(b[:, None, :], xs, w.transpose(1, 2))  # F×N×K
    grad = torch.softmax(logits, dim=2).sub_(target).mul_(weight)  # d loss / d logits
    return (torch.bmm(grad.transpose(1, 2), xs).add_(w, alpha=2 * l2 / w.shape[1]),
            grad.sum(dim=1))


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
    trained: bool = True  # False: the zero placeholder of :func:`untrained_ramps`

    @property
    def params(self) -> int:
        return int(self.weight.size + self.bias.size)


def check_targets(targets: str) -> None:
    if targets not in TARGETS:
        raise ValueError(f"unknown ramp targets {targets!r}; known: {', '.join(TARGETS)}")


def train_ramps(
    feats: Features,
    classes: int,
    pool: str = "gap",
    folds: int = 5,
    steps: int = 300,
    log: Log = stderr_log,
    targets: str = "top1",
) -> list[RampFit]:
    """Fit every site; agreement is k-fold by group, the exported head uses all data.
    ``targets``: what the heads learn (``TARGETS``).

    Held-out agreement varies a lot with which scenes are held out, so one 80/20 split
    is a noisy estimate; the mean over folds is the figure recorded in the manifest (one
    fold once it holds ``ONE_FOLD_ROWS`` samples).
    """
    check_targets(targets)
    if targets == "softmax" and feats.logits is None:
        raise ValueError("softmax targets need the final model's logits in the features")
    soft = feats.logits / SOFT_TEMPERATURE if targets == "softmax" else None
    masks = [m for m in group_folds(feats.groups, folds) if m.any() and not m.all()]
    if masks and len(feats.labels) / len(masks) >= ONE_FOLD_ROWS:
        masks = masks[:1]  # one large held-out fold: as steady as five small ones, 1/3 the fits
    fits = []
    for site in sorted(feats.by_block):
        x, y = feats.by_block[site], feats.labels
        # The folds' fits and the exported all-data fit train together (see fit_linear).
        train = [~t for t in masks] + [np.ones(len(y), bool)]
        *per_fold_wb, (w, b) = fit_linear(x, y, classes, train, steps=steps, soft=soft)
        per_fold = [round(agreement(fw, fb, x[t], y[t]), 4)
                    for (fw, fb), t in zip(per_fold_wb, masks, strict=True)]
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


def untrained_ramps(feats: Features, classes: int, pool: str = "gap") -> list[RampFit]:
    """A head per site with the trained heads' architecture but zero weights and bias
    (``offramp prepare --no-bootstrap``): its softmax is uniform, so it never looks
    confident and no threshold lets it answer, and a live refit warm-started from it starts
    from the plain regression's usual zero start. ``feats`` need only the sites' pooled
    widths and ranks (a few sample inputs), not bootstrap data."""
    nan = float("nan")
    return [RampFit(site, np.zeros((classes, feats.by_block[site].shape[1]), np.float32),
                    np.zeros(classes, np.float32), nan, [], nan,
                    arch_name(feats.ndims[site], pool), feats.ndims[site], pool, trained=False)
            for site in sorted(feats.by_block)]


def head_module(fit: RampFit) -> RampHead:
    head = RampHead(fit.weight.shape[1], fit.weight.shape[0], fit.ndim, fit.pool)
    with torch.no_grad():
        head.fc.weight.copy_(torch.from_numpy(fit.weight))
        head.fc.bias.copy_(torch.from_numpy(fit.bias))
    return head.eval()

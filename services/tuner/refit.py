"""Online refits of ramp heads from the feedback latency mode already produces (pure).

Every sample reaches the final layer, so the final model's answer labels every input for
free. A worker publishes, for a sample of inputs, each ramp's pooled features beside the
final answer; the tuner keeps the newest of them per ramp (:class:`RampBuffer`) and, from
time to time, refits the ramp's linear layer on them (:func:`refit`), warm-started from
the head it serves. A candidate is deployed only when it beats the serving head on the
newest samples, held back from the fit, by ``margin`` in agreement with the final model,
and is no more over-confident there (:func:`judge`): thresholds are set on scores, and a
head that is right more often but confident in the wrong places would exit the wrong
samples. Only over-confidence counts against it: a head surer of less than it gets right
exits fewer samples at a threshold, not wrong ones, and the thresholds of a changed head
are chosen again on its own scores. A two-sided calibration error kept heads learned from
scratch (``prepare --no-bootstrap``) behind barely-trained predecessors whenever softening
left them unsure (the ``--no-bootstrap`` replay in docs/benchmarks.md).

The fit is softmax regression on standardised features (the scaling is folded back into
the weights, so a head still takes raw pooled features). Only the classes that matter on
the buffer move: those some sample is labelled with, and those the serving head ranks
first somewhere (it must learn to stop saying them). The other classes' weights stay as
they are and enter the softmax through one log-sum-exp computed once per refit, which
keeps a refit of a 1000-class head within tens of milliseconds on a small CPU.

A fit on a thousand samples of a few scenes separates them with logits far apart: its
exit scores collapse to 0 in float32, below the threshold climb's finest step, and no
threshold can tell its right answers from its wrong ones. So the candidate is softened by
the temperature (never below 1) that best fits a fit on the older half of the same
samples scored on the newer half (:func:`fold_temperature`), which spreads its scores as
its mistakes on samples it has not seen warrant; its answers do not change.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from services.exits.linear_head import LinearHead
from services.exits.scores import softmax

LEVEL_GAP = 5.0  # logits below the answer from which a labelled class counts as never learned


@dataclass(frozen=True)
class RefitConfig:
    capacity: int = 1024        # samples a ramp's buffer keeps (the newest)
    min_samples: int = 128      # a buffer refits once it holds this many
    holdout: float = 0.25       # the newest share, held back to judge the candidate
    steps: int = 40             # Adam steps per refit
    lr: float = 0.05            # on standardised features
    l2: float = 1e-3            # pulls the moved weights towards the serving head's
    margin: float = 0.01        # agreement the candidate must gain on the held-back samples
    significance: float = 3.0   # ... and that many standard deviations of the disagreeing pairs
    calibration_slack: float = 0.01  # how much more over-confident it may be
    calibrate: bool = True      # soften a winning candidate (fold_temperature)


class RampBuffer:
    """The newest ``capacity`` (features, target) pairs of one ramp, oldest first.

    A target is the final model's top-1 (int) or its probabilities (K floats, soft targets).
    """

    def __init__(self, capacity: int, dim: int, soft_classes: int = 0) -> None:
        if capacity < 1 or dim < 1:
            raise ValueError("a ramp buffer needs capacity >= 1 and dim >= 1")
        self.capacity, self.dim = capacity, dim
        self.x = np.zeros((capacity, dim), np.float32)
        self.y = np.zeros((capacity, soft_classes), np.float32) if soft_classes \
            else np.zeros(capacity, np.int64)
        self.n = 0       # samples held
        self.next = 0    # where the next sample goes

    def __len__(self) -> int:
        return self.n

    def add(self, x: np.ndarray, y: np.ndarray) -> None:
        x = np.asarray(x, np.float32)
        if x.ndim != 2 or x.shape[1] != self.dim or len(y) != len(x):
            raise ValueError(f"need N x {self.dim} features and N targets, got {x.shape} and "
                             f"{np.shape(y)}")
        if len(x) > self.capacity:  # only the newest can stay
            x, y = x[-self.capacity:], y[-self.capacity:]
        idx = (self.next + np.arange(len(x))) % self.capacity
        self.x[idx], self.y[idx] = x, y
        self.next = int((self.next + len(x)) % self.capacity)
        self.n = min(self.capacity, self.n + len(x))

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """(features, targets) held, oldest first."""
        order = (self.next - self.n + np.arange(self.n)) % self.capacity
        return self.x[order], self.y[order]


def top1(y: np.ndarray) -> np.ndarray:
    """Hard labels of targets that may be probabilities."""
    return y if y.ndim == 1 else y.argmax(axis=1)


def _moving_classes(z: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Classes the refit moves: every label of the buffer and every serving top-1 on it
    (``z``: the serving head's logits)."""
    classes = np.union1d(np.unique(top1(y)), np.unique(z.argmax(axis=1)))
    if y.ndim == 2:  # soft targets: the classes that carry mass somewhere
        classes = np.union1d(classes, np.flatnonzero(y.max(axis=0) >= 0.01))
    return classes


def refit(head: LinearHead, x: np.ndarray, y: np.ndarray, cfg: RefitConfig = RefitConfig()
          ) -> LinearHead:
    """Softmax regression of ``x`` on ``y`` warm-started from ``head``: Adam on standardised
    features over the moving classes, the other classes fixed. Returns the new head."""
    x = np.asarray(x, np.float32)
    z = head.logits(x)
    k = _moving_classes(z, y)
    rest = np.setdiff1d(np.arange(head.weight.shape[0]), k)
    mean, std = x.mean(axis=0), x.std(axis=0) + 1e-6
    xs = (x - mean) / std
    w0 = head.weight[k] * std                                   # the same logits, standardised
    b0 = head.bias[k] + head.weight[k] @ mean + _levelling(z, y, k)
    if len(rest):  # the fixed classes' share of every softmax
        fixed = z[:, rest]
        top = fixed.max(axis=1, keepdims=True)
        lse_rest = (top + np.log(np.exp(fixed - top).sum(axis=1, keepdims=True)))[:, 0]
    else:
        lse_rest = np.full(len(x), -np.inf, np.float32)
    target = _targets(y, k)
    w, b = _adam(xs, target, lse_rest, w0, b0, cfg)
    weight, bias = head.weight.copy(), head.bias.copy()
    weight[k] = w / std
    bias[k] = b - (w / std) @ mean
    return LinearHead(weight.astype(np.float32), bias.astype(np.float32), head.pool)


MAX_TEMPERATURE = 64.0  # softening only (>= 1): a refit never gets surer than it was fitted
MIN_FOLD = 16  # samples per half below which a candidate is left as fitted


def _target_logit(z: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Per row, the logit of the label (or the targets' mean logit)."""
    if y.ndim == 1:
        return z[np.arange(len(y)), y]
    return (z * y).sum(axis=1) / np.maximum(y.sum(axis=1), 1e-12)


def best_temperature(logits: np.ndarray, y: np.ndarray,
                     max_temperature: float = MAX_TEMPERATURE) -> float:
    """The temperature in [1, ``max_temperature``] that minimises the cross-entropy of
    ``logits / T``: safeguarded Newton on beta = 1/T, where the cross-entropy is convex
    (a handful of passes over the logits instead of a grid's dozens)."""
    z = np.asarray(logits, np.float32)
    zbar, top = _target_logit(z, y), z.max(axis=1, keepdims=True)

    def slope_curve(beta: float) -> tuple[float, float]:
        """d/dbeta and d2/dbeta2 of the cross-entropy at ``beta``."""
        e = np.exp(beta * (z - top))
        total = e.sum(axis=1)
        mean = np.einsum("ij,ij->i", e, z) / total
        second = np.einsum("ij,ij->i", e * z, z) / total
        return float((mean - zbar).mean()), float(np.maximum(second - mean * mean, 0).mean())

    lo, hi, beta = 1.0 / max_temperature, 1.0, 1.0
    g, h = slope_curve(beta)
    if g <= 0:
        return 1.0          # sharper would fit better: left as fitted
    for _ in range(12):     # g > 0 at hi, the minimum is below beta
        lo, hi = (beta, hi) if g < 0 else (lo, beta)
        step = beta - g / h if h > 0 else lo
        new = step if lo < step < hi else float(np.sqrt(lo * hi))
        if abs(new - beta) <= 1e-3 * beta or hi - lo <= 1e-3 * lo:
            beta = new
            break
        beta = new
        g, h = slope_curve(beta)
    return float(1.0 / max(beta, 1.0 / max_temperature))


def fold_temperature(head: LinearHead, x: np.ndarray, y: np.ndarray,
                     cfg: RefitConfig = RefitConfig()) -> float:
    """The temperature that best fits a refit (from ``head``) on the older half of ``x``
    scored on the newer half: a head fitted on the past, judged on what came next, as a
    deployed head is. Its logits on its own samples say nothing about the next ones."""
    half = len(x) // 2
    if half < MIN_FOLD:
        return 1.0
    return best_temperature(refit(head, x[:half], y[:half], cfg).logits(x[half:]), y[half:])


def softened(head: LinearHead, temperature: float) -> LinearHead:
    """``head`` with its logits divided by ``temperature`` (the same answers)."""
    if temperature == 1.0:
        return head
    return LinearHead((head.weight / temperature).astype(np.float32),
                      (head.bias / temperature).astype(np.float32), head.pool)


def _levelling(z: np.ndarray, y: np.ndarray, k: np.ndarray) -> np.ndarray:
    """Bias lifts for the moving classes: a class the head never learned sits far below every
    answer (``prepare`` floors absent classes), where a few refit steps cannot lift it; it
    starts level with the head's answers on its own samples instead (``z``: the head's
    logits)."""
    top, labels = z.max(axis=1), top1(y)
    lift = np.zeros(len(k), np.float32)
    for j, c in enumerate(k):
        rows = labels == c
        if rows.any():
            gap = float((top[rows] - z[rows, c]).mean())
            lift[j] = gap if gap > LEVEL_GAP else 0.0
    return lift


def _targets(y: np.ndarray, k: np.ndarray) -> np.ndarray:
    """N x (|k| + 1) target distribution over the moving classes and "any other class"."""
    if y.ndim == 1:
        t = (y[:, None] == k[None, :]).astype(np.float32)
    else:
        t = y[:, k].astype(np.float32)
    return np.concatenate([t, np.clip(1.0 - t.sum(axis=1, keepdims=True), 0.0, 1.0)], axis=1)


def _adam(xs: np.ndarray, target: np.ndarray, lse_rest: np.ndarray, w0: np.ndarray,
          b0: np.ndarray, cfg: RefitConfig) -> tuple[np.ndarray, np.ndarray]:
    """Minimise mean cross-entropy + ``l2`` * ||w - w0||^2 over (w, b)."""
    w, b = w0.copy(), b0.copy()
    mw, vw, mb, vb = (np.zeros_like(w), np.zeros_like(w), np.zeros_like(b), np.zeros_like(b))
    n = len(xs)
    for t in range(1, cfg.steps + 1):
        z = np.concatenate([xs @ w.T + b, lse_rest[:, None]], axis=1)
        p = softmax(z)
        g = (p - target)[:, :-1] / n                               # d loss / d moving logits
        gw = g.T @ xs + 2 * cfg.l2 * (w - w0)
        gb = g.sum(axis=0)
        for param, grad, m, v in ((w, gw, mw, vw), (b, gb, mb, vb)):
            m *= 0.9
            m += 0.1 * grad
            v *= 0.999
            v += 0.001 * grad * grad
            param -= cfg.lr * (m / (1 - 0.9 ** t)) / (np.sqrt(v / (1 - 0.999 ** t)) + 1e-8)
    return w, b


def _confidence_gaps(logits: np.ndarray, labels: np.ndarray, bins: int
                     ) -> tuple[np.ndarray, np.ndarray]:
    """Per top-1 confidence bin: its samples and its mean confidence minus its agreement
    with ``labels``."""
    p = softmax(logits)
    conf, right = p.max(axis=1), (p.argmax(axis=1) == labels)
    edges = np.minimum((conf * bins).astype(int), bins - 1)
    counts = np.bincount(edges, minlength=bins).astype(np.float64)
    used = np.maximum(counts, 1.0)
    gaps = (np.bincount(edges, conf, bins) - np.bincount(edges, right, bins)) / used
    return counts, gaps


def calibration_error(logits: np.ndarray, labels: np.ndarray, bins: int = 10) -> float:
    """Expected calibration error of the top-1 confidence against agreement with ``labels``."""
    counts, gaps = _confidence_gaps(logits, labels, bins)
    return float((counts * np.abs(gaps)).sum() / max(len(labels), 1))


def overconfidence_error(logits: np.ndarray, labels: np.ndarray, bins: int = 10) -> float:
    """The over-confident part of :func:`calibration_error`: per confidence bin, how far the
    mean top-1 confidence exceeds the agreement with ``labels`` (0 where it does not)."""
    counts, gaps = _confidence_gaps(logits, labels, bins)
    return float((counts * np.maximum(gaps, 0.0)).sum() / max(len(labels), 1))


@dataclass(frozen=True)
class Verdict:
    accept: bool
    serving_agreement: float
    candidate_agreement: float
    serving_calibration: float
    candidate_calibration: float
    reason: str
    judged_on: int = 0  # held-back samples it was judged on
    gains: bool = False  # its agreement gain passed (whatever its calibration)


def judge(serving: LinearHead, candidate: LinearHead, x: np.ndarray, y: np.ndarray,
          cfg: RefitConfig = RefitConfig()) -> Verdict:
    """Whether ``candidate`` may replace ``serving``, judged on held-back samples."""
    labels = top1(y)
    ls, lc = serving.logits(x), candidate.logits(x)
    a_s, a_c = float((ls.argmax(1) == labels).mean()), float((lc.argmax(1) == labels).mean())
    e_s, e_c = calibration_error(ls, labels), calibration_error(lc, labels)
    gained = int(((lc.argmax(1) == labels) & (ls.argmax(1) != labels)).sum())
    lost = int(((lc.argmax(1) != labels) & (ls.argmax(1) == labels)).sum())
    needed = max(cfg.margin * len(labels), cfg.significance * np.sqrt(gained + lost))
    if gained - lost < needed:
        why = (f"agreement {a_c:.3f} does not beat the serving {a_s:.3f} by {cfg.margin:.3f} "
               f"beyond chance ({gained} gained, {lost} lost)")
        return Verdict(False, a_s, a_c, e_s, e_c, why, len(labels))
    # a head that never learned (prepare --no-bootstrap: zero weights) says 1/K everywhere;
    # its calibration is an accident of the class mix, nothing to stay close to
    o_s, o_c = overconfidence_error(ls, labels), overconfidence_error(lc, labels)
    if o_c > o_s + cfg.calibration_slack and serving.weight.any():
        why = f"over-confidence {o_c:.3f} worse than the serving {o_s:.3f}"
        return Verdict(False, a_s, a_c, e_s, e_c, why, len(labels), True)
    return Verdict(True, a_s, a_c, e_s, e_c,
                   f"agreement {a_s:.3f} -> {a_c:.3f}, calibration error {e_s:.3f} -> {e_c:.3f}",
                   len(labels), True)


def propose(serving: LinearHead, buffer: RampBuffer, cfg: RefitConfig = RefitConfig()
            ) -> tuple[LinearHead | None, Verdict | None]:
    """Refit on the older part of ``buffer`` and judge on the newest ``holdout`` share:
    (the head to deploy or None, the verdict or None when the buffer is too small). The
    head deployed is the head judged: one that also learned the held-back samples would be
    surer on them than on what follows, and the thresholds are chosen on them (at the live
    delays such heads cost agreement, docs/benchmarks.md)."""
    if len(buffer) < cfg.min_samples:
        return None, None
    x, y = buffer.arrays()
    cut = len(x) - max(1, round(len(x) * cfg.holdout))
    candidate = refit(serving, x[:cut], y[:cut], cfg)
    verdict = judge(serving, candidate, x[cut:], y[cut:], cfg)
    temperature = 1.0
    if cfg.calibrate and verdict.gains:  # softening keeps its answers: only a winner needs it
        temperature = fold_temperature(serving, x[:cut], y[:cut], cfg)
        verdict = judge(serving, softened(candidate, temperature), x[cut:], y[cut:], cfg)
    if not verdict.accept:
        return None, verdict
    return softened(candidate, temperature), verdict

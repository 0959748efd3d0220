"""A minimal Adam for the small full-batch fits done while preparing models.

``torch.optim`` imports ``torch._dynamo`` on first use, which costs 2-10 s per process on
a small machine: more than the fits themselves. Same update rule as ``torch.optim.Adam``
(no amsgrad); also shared by the zoo models' own training.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch


class Adam:
    """Adam; with ``weight_decay`` it is AdamW (decoupled decay, applied before the update),
    and ``lr`` may be a schedule: a function of the step number (0-based)."""

    def __init__(self, params: list[torch.Tensor], lr: float | Callable[[int], float] = 1e-3,
                 betas=(0.9, 0.999), eps: float = 1e-8, weight_decay: float = 0.0) -> None:
        self.params = list(params)
        self.lr, (self.b1, self.b2), self.eps, self.wd = lr, betas, eps, weight_decay
        self.m = [torch.zeros_like(p) for p in self.params]
        self.v = [torch.zeros_like(p) for p in self.params]
        self.t = 0

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self) -> None:
        lr = self.lr(self.t) if callable(self.lr) else self.lr
        self.t += 1
        c1, c2 = 1 - self.b1 ** self.t, 1 - self.b2 ** self.t
        for p, m, v in zip(self.params, self.m, self.v, strict=True):
            if p.grad is None:
                continue
            if self.wd:
                p.mul_(1 - lr * self.wd)
            m.mul_(self.b1).add_(p.grad, alpha=1 - self.b1)
            v.mul_(self.b2).addcmul_(p.grad, p.grad, value=1 - self.b2)
            p.addcdiv_(m, (v / c2).sqrt_().add_(self.eps), value=-lr / c1)


@contextlib.contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """Small fits run faster on one thread: more threads only contend with ONNX Runtime
    and the other processes on a 2-core machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)

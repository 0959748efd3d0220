"""A minimal Adam for the small full-batch fits done while preparing models.

``torch.optim`` imports ``torch._dynamo`` on first use, which costs 2-10 s per process on
a small machine: more than the fits themselves. Same update rule as ``torch.optim.Adam``
(no weight decay, no amsgrad).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


class Adam:
    def __init__(self, params: list[torch.Tensor], lr: float = 1e-3, betas=(0.9, 0.999),
                 eps: float = 1e-8) -> None:
        self.params = list(params)
        self.lr, (self.b1, self.b2), self.eps = lr, betas, eps
        self.m = [torch.zeros_like(p) for p in self.params]
        self.v = [torch.zeros_like(p) for p in self.params]
        self.t = 0

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self) -> None:
        self.t += 1
        c1, c2 = 1 - self.b1 ** self.t, 1 - self.b2 ** self.t
        for p, m, v in zip(self.params, self.m, self.v, strict=True):
            if p.grad is None:
                continue
            m.mul_(self.b1).add_(p.grad, alpha=1 - self.b1)
            v.mul_(self.b2).addcmul_(p.grad, p.grad, value=1 - self.b2)
            p.addcdiv_(m, (v / c2).sqrt_().add_(self.eps), value=-self.lr / c1)


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

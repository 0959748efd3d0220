"""SubNetAct's operators (SuperServe §3.1, App. A.1) in torch: one copy of the supernet's
weights serves every subnet, and the subnet is an argument of each forward call.

- ``LayerSelect`` runs ``depth`` blocks of a stage and skips the rest: the first ones
  (conv stages), or every other one (a transformer's layers, SuperServe §3.1);
- ``SlicedConv2d`` (WeightSlice for convolutions) runs the first ``out_channels`` filters
  over however many input channels arrive, all read from the full weight tensor;
- ``SubnetNorm`` is batch norm whose statistics are kept per subnet (its key) while the
  affine weights are shared: a subnet's activations have their own mean and variance,
  and normalizing them with another subnet's statistics costs tens of accuracy points.

There is no module state naming an "active" subnet, so two batches with different subnets
may run back to back (or at once, from two threads) on the same module.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn
from torch.nn import functional as F


class LayerSelect(nn.Module):
    """A stage's blocks; ``forward(x, depth, *args)`` runs the ``depth`` blocks that
    ``select(len(blocks), depth)`` names, in order, each called as ``block(x, *args)``.
    By default the first ``depth`` (a conv stage, as OFA runs it); a transformer's single
    stage passes the every-other rule (``bert_subnet.kept_layers``)."""

    def __init__(self, blocks: Sequence[nn.Module],
                 select: Callable[[int, int], Sequence[int]] | None = None) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(blocks)
        self.select = select

    def forward(self, x: torch.Tensor, depth: int, *args) -> torch.Tensor:
        if not 1 <= depth <= len(self.blocks):
            raise ValueError(f"depth {depth} is outside 1..{len(self.blocks)}")
        if self.select is None:
            for block in self.blocks[:depth]:
                x = block(x, *args)
            return x
        for i in self.select(len(self.blocks), depth):
            x = self.blocks[i](x, *args)
        return x


class SlicedConv2d(nn.Module):
    """A convolution with ``max_out`` filters over up to ``max_in`` channels, of which a
    call uses the first ``out_channels`` filters and the input's channel count."""

    def __init__(self, max_in: int, max_out: int, kernel: int, stride: int = 1) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(max_out, max_in, kernel, kernel))
        nn.init.kaiming_normal_(self.weight, mode="fan_out", nonlinearity="relu")
        self.stride, self.padding = stride, kernel // 2

    def sliced(self, in_channels: int, out_channels: int) -> torch.Tensor:
        return self.weight[:out_channels, :in_channels]

    def forward(self, x: torch.Tensor, out_channels: int) -> torch.Tensor:
        return F.conv2d(x, self.sliced(x.shape[1], out_channels), None, self.stride,
                        self.padding)


Stats = tuple[torch.Tensor, torch.Tensor]   # (mean, var) over one subnet's channels


class SubnetNorm(nn.Module):
    """Batch norm over up to ``channels`` channels with shared affine weights and
    statistics per subnet key.

    - training: normalizes with the batch's statistics (supernet training, as OFA does);
    - ``collecting`` (calibration of one subnet): the same, and it accumulates the exact
      mean and variance of everything it sees into ``pending``;
    - evaluation: normalizes with the stored statistics of the call's subnet, and refuses
      a subnet that was never calibrated (guessing would be silently wrong).
    """

    def __init__(self, channels: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(channels))
        self.bias = nn.Parameter(torch.zeros(channels))
        self.eps = eps
        self.stats: dict[str, Stats] = {}
        self.collecting = False
        self.pending: list[torch.Tensor] = []   # [count, sum, sum of squares] of a calibration

    def forward(self, x: torch.Tensor, key: str) -> torch.Tensor:
        c = x.shape[1]
        w, b = self.weight[:c], self.bias[:c]
        if self.training or self.collecting:
            if self.collecting:
                self._collect(x.detach())
            return F.batch_norm(x, None, None, w, b, True, 0.0, self.eps)
        if key not in self.stats:
            raise KeyError(f"subnet {key} has no normalization statistics: calibrate it "
                           "first")
        mean, var = self.stats[key]
        if mean.numel() != c:
            raise ValueError(f"subnet {key}'s statistics cover {mean.numel()} channels, "
                             f"the input has {c}")
        return F.batch_norm(x, mean, var, w, b, False, 0.0, self.eps)

    def _collect(self, x: torch.Tensor) -> None:
        dims = [d for d in range(x.dim()) if d != 1]
        n = torch.tensor(float(x.numel() // x.shape[1]), dtype=torch.float64)
        s = x.double().sum(dims)
        q = (x.double() ** 2).sum(dims)
        if self.pending:
            self.pending = [self.pending[0] + n, self.pending[1] + s, self.pending[2] + q]
        else:
            self.pending = [n, s, q]

    def finish(self, key: str) -> None:
        """Store what a calibration collected as ``key``'s statistics (population
        variance over every position of every batch, as a full-data pass would give).
        A norm the subnet skips (a block LayerSelect leaves out) collected nothing and
        keeps no statistics for it."""
        if not self.pending:
            self.stats.pop(key, None)
            return
        n, s, q = self.pending
        mean = s / n
        var = (q / n - mean ** 2).clamp_min(0.0)
        self.stats[key] = (mean.float(), var.float())
        self.pending = []


def norms(module: nn.Module) -> list[SubnetNorm]:
    return [m for m in module.modules() if isinstance(m, SubnetNorm)]


@torch.no_grad()
def calibrate(module: nn.Module, key: str, run: Callable[[torch.Tensor], object],
              batches: Sequence[torch.Tensor]) -> None:
    """Compute subnet ``key``'s statistics in every ``SubnetNorm`` of ``module``:
    ``run(batch)`` must forward the batch through that subnet."""
    was_training = module.training
    module.eval()
    for norm in norms(module):
        norm.collecting, norm.pending = True, []
    try:
        for batch in batches:
            run(batch)
        if not any(norm.pending for norm in norms(module)):
            raise ValueError(f"calibrating {key}: no batch reached a norm")
        for norm in norms(module):
            norm.finish(key)
    finally:
        for norm in norms(module):
            norm.collecting, norm.pending = False, []
        module.train(was_training)


def stats_bytes(module: nn.Module, keys: Sequence[str] | None = None) -> int:
    """Bytes the per-subnet statistics take (of ``keys`` only, when given)."""
    total = 0
    for norm in norms(module):
        for key, (mean, var) in norm.stats.items():
            if keys is None or key in keys:
                total += mean.numel() * mean.element_size() + var.numel() * var.element_size()
    return total

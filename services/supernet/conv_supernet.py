"""A convolutional supernet built from SubNetAct's operators: a small ResNet with elastic
depth per stage and elastic width inside each block, as OFA-ResNet has (SuperServe §3.1).

Layout: a 3x3 stem, then stages of basic residual blocks (conv3x3 -> norm -> ReLU ->
conv3x3 -> norm, plus the shortcut, then ReLU). A stage's first block halves the spatial
size (stride 2, except in stage 0) and changes the channel count, with a 1x1 conv +
norm shortcut; the others keep both and add the identity. The subnet decides:

- depth: how many of a stage's blocks run (LayerSelect; the first always runs);
- width: how many of each block's inner channels run (WeightSlice on the first conv's
  filters and the second conv's inputs). A block's output channels stay whole so the
  residual additions line up, as OFA-ResNet slices its bottlenecks' middle width.

``forward(x, subnet)`` serves any subnet from one copy of the weights; ``extract(subnet)``
copies one subnet out as a standalone module of plain torch layers (what serving it as
a separate model would load), against which the operators are tested.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from services.supernet.operators import LayerSelect, SlicedConv2d, SubnetNorm
from services.supernet.subnet import Subnet, SubnetSpace, active_channels


@dataclass(frozen=True)
class ConvArch:
    """The supernet's shape: input channels, stem width, channels and maximal depth per
    stage, classes, and the width choices of its subnet space."""

    channels: tuple[int, ...] = (24, 48, 96, 192)
    max_depths: tuple[int, ...] = (2, 2, 2, 2)
    stem: int = 24
    in_channels: int = 3
    classes: int = 10
    width_choices: tuple[float, ...] = (0.25, 0.5, 0.75, 1.0)

    @property
    def space(self) -> SubnetSpace:
        return SubnetSpace(self.max_depths, self.width_choices)


class ElasticBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.cout = cout
        self.conv1, self.norm1 = SlicedConv2d(cin, cout, 3, stride), SubnetNorm(cout)
        self.conv2, self.norm2 = SlicedConv2d(cout, cout, 3), SubnetNorm(cout)
        self.shortcut = None
        if stride != 1 or cin != cout:
            self.shortcut = SlicedConv2d(cin, cout, 1, stride)
            self.short_norm = SubnetNorm(cout)

    def forward(self, x: torch.Tensor, width: float, key: str) -> torch.Tensor:
        mid = active_channels(width, self.cout)
        y = F.relu(self.norm1(self.conv1(x, mid), key))
        y = self.norm2(self.conv2(y, self.cout), key)
        s = x if self.shortcut is None else self.short_norm(self.shortcut(x, self.cout), key)
        return F.relu(y + s)


class ConvSupernet(nn.Module):
    def __init__(self, arch: ConvArch = ConvArch()) -> None:
        super().__init__()
        if len(arch.channels) != len(arch.max_depths):
            raise ValueError("one channel count and one maximal depth per stage")
        self.arch, self.space = arch, arch.space
        self.stem = SlicedConv2d(arch.in_channels, arch.stem, 3)
        self.stem_norm = SubnetNorm(arch.stem)
        stages, cin = [], arch.stem
        for m, (cout, depth) in enumerate(zip(arch.channels, arch.max_depths, strict=True)):
            first = ElasticBlock(cin, cout, 1 if m == 0 else 2)
            stages.append(LayerSelect([first, *(ElasticBlock(cout, cout, 1)
                                                for _ in range(depth - 1))]))
            cin = cout
        self.stages = nn.ModuleList(stages)
        self.fc = nn.Linear(cin, arch.classes)

    def forward(self, x: torch.Tensor, subnet: Subnet) -> torch.Tensor:
        self.space.check(subnet)
        key = subnet.key
        x = F.relu(self.stem_norm(self.stem(x, self.arch.stem), key))
        for stage, depth, width in zip(self.stages, subnet.depths, subnet.widths, strict=True):
            x = stage(x, depth, width, key)
        return self.fc(x.mean((2, 3)))

    def extract(self, subnet: Subnet) -> StaticResNet:
        """``subnet`` as a standalone eval-mode module with its own copy of its weights."""
        self.space.check(subnet)
        key = subnet.key
        stem = (_conv(self.stem, self.arch.in_channels, self.arch.stem),
                _norm(self.stem_norm, key, self.arch.stem))
        blocks, cin = [], self.arch.stem
        for stage, depth, width in zip(self.stages, subnet.depths, subnet.widths, strict=True):
            for block in stage.blocks[:depth]:
                blocks.append(_static_block(block, cin, width, key))
                cin = block.cout
        fc = nn.Linear(cin, self.arch.classes)
        fc.load_state_dict(self.fc.state_dict())
        return StaticResNet(stem, blocks, fc).eval()


class StaticBlock(nn.Module):
    def __init__(self, convs: Sequence[nn.Module], shortcut: Sequence[nn.Module] | None):
        super().__init__()
        self.conv1, self.norm1, self.conv2, self.norm2 = convs
        self.shortcut = None if shortcut is None else nn.Sequential(*shortcut)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.norm2(self.conv2(F.relu(self.norm1(self.conv1(x)))))
        return F.relu(y + (x if self.shortcut is None else self.shortcut(x)))


class StaticResNet(nn.Module):
    """One subnet of :class:`ConvSupernet` in plain torch layers."""

    def __init__(self, stem: Sequence[nn.Module], blocks: Sequence[nn.Module], fc: nn.Linear):
        super().__init__()
        self.stem = nn.Sequential(*stem, nn.ReLU())
        self.blocks = nn.Sequential(*blocks)
        self.fc = fc

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.blocks(self.stem(x)).mean((2, 3)))


def _conv(op: SlicedConv2d, cin: int, cout: int) -> nn.Conv2d:
    w = op.sliced(cin, cout)
    conv = nn.Conv2d(cin, cout, w.shape[-1], op.stride, op.padding, bias=False)
    conv.weight.data.copy_(w.detach())
    return conv


def _norm(op: SubnetNorm, key: str, channels: int) -> nn.BatchNorm2d:
    if key not in op.stats:
        raise KeyError(f"subnet {key} has no normalization statistics: calibrate it first")
    bn = nn.BatchNorm2d(channels, eps=op.eps)
    mean, var = op.stats[key]
    bn.weight.data.copy_(op.weight.detach()[:channels])
    bn.bias.data.copy_(op.bias.detach()[:channels])
    bn.running_mean.copy_(mean)
    bn.running_var.copy_(var)
    return bn


def _static_block(block: ElasticBlock, cin: int, width: float, key: str) -> StaticBlock:
    mid = active_channels(width, block.cout)
    convs = (_conv(block.conv1, cin, mid), _norm(block.norm1, key, mid),
             _conv(block.conv2, mid, block.cout), _norm(block.norm2, key, block.cout))
    shortcut = None
    if block.shortcut is not None:
        shortcut = (_conv(block.shortcut, cin, block.cout),
                    _norm(block.short_norm, key, block.cout))
    return StaticBlock(convs, shortcut)


def module_bytes(module: nn.Module) -> int:
    """Bytes of a module's parameters and buffers (what loading it as a model takes)."""
    tensors = [*module.parameters(), *module.buffers()]
    return sum(t.numel() * t.element_size() for t in tensors)

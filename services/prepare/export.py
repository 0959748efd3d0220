"""Export torch modules to ONNX bytes with a dynamic batch axis."""

from __future__ import annotations

import io
import warnings

import torch
from torch import nn

OPSET = 17


def to_onnx(
    module: nn.Module,
    example: tuple[torch.Tensor, ...],
    input_names: list[str],
    output_names: list[str],
    dynamic: dict[str, dict[int, str]] | None = None,
) -> bytes:
    """ONNX model bytes of ``module`` traced on ``example``; axis 0 of every I/O is dynamic,
    plus any axes named in ``dynamic`` (e.g. a ramp's spatial or sequence axes)."""
    module.eval()
    axes = {n: {0: "batch"} for n in [*input_names, *output_names]}
    for name, more in (dynamic or {}).items():
        axes.setdefault(name, {}).update(more)
    buf = io.BytesIO()
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")  # the legacy exporter's deprecation chatter
        torch.onnx.export(
            module,
            example,
            buf,
            input_names=input_names,
            output_names=output_names,
            dynamic_axes=axes,
            opset_version=OPSET,
            do_constant_folding=True,
            dynamo=False,
        )
    # export can restore a training flag on shared submodules: force eval again.
    module.eval()
    return buf.getvalue()


def count_params(modules: list[nn.Module]) -> int:
    seen: set[int] = set()
    total = 0
    for m in modules:
        for p in m.parameters():
            if id(p) not in seen:
                seen.add(id(p))
                total += p.numel()
    return total

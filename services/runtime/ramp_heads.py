"""A ramp's head as numbers: the linear layer (W, b) its ONNX file holds and the pooling in
front of it, so pooled features can be scored, and heads refitted, without ONNX Runtime."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from services.runtime.manifest import RampSpec
from services.runtime.pooling import pool_of_arch


@dataclass(frozen=True, eq=False)
class LinearHead:
    """``logits = features @ weight.T + bias`` on the ramp's pooled features."""

    weight: np.ndarray   # float32 classes x C
    bias: np.ndarray     # float32 classes
    pool: str            # services.runtime.pooling.POOLS

    def logits(self, features: np.ndarray) -> np.ndarray:
        return np.asarray(features, np.float32) @ self.weight.T + self.bias


def load_head(model_dir: str | Path, ramp: RampSpec) -> LinearHead:
    """The head of ``ramp`` read from its ONNX file; ValueError when the file holds no single
    linear layer (a Gemm with constant weights) after the pooling."""
    model = onnx.load(str(Path(model_dir) / ramp.file))
    consts = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    gemms = [n for n in model.graph.node if n.op_type == "Gemm"]
    if len(gemms) != 1 or not {gemms[0].input[1], gemms[0].input[2]} <= consts.keys():
        raise ValueError(f"ramp {ramp.index} ({ramp.file}): not one linear layer with "
                         f"constant weights")
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in gemms[0].attribute}
    weight = consts[gemms[0].input[1]].astype(np.float32)
    if not attrs.get("transB", 0):
        weight = weight.T  # stored C x classes
    bias = consts[gemms[0].input[2]].astype(np.float32)
    return LinearHead(np.ascontiguousarray(weight), bias, pool_of_arch(ramp.arch))

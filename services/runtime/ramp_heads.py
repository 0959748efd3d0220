"""A ramp's head as numbers: the linear layer (W, b) its ONNX file holds and the pooling in
front of it, so pooled features can be scored, and heads refitted, without ONNX Runtime."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from services.exits.linear_head import LinearHead
from services.runtime.manifest import RampSpec, sha256_bytes
from services.runtime.onnx_blocks import head_gemm
from services.runtime.pooling import pool_of_arch


def load_head(model_dir: str | Path, ramp: RampSpec, file: str | None = None) -> LinearHead:
    """The head of ``ramp`` read from its ONNX file (``file``: another version's); ValueError
    when the file holds no single linear layer (a Gemm with constant weights) after the
    pooling."""
    model = onnx.load(str(Path(model_dir) / (file or ramp.file)))
    consts = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    try:
        gemm = head_gemm(model)
    except ValueError:
        gemm = None
    if gemm is None or not {gemm.input[1], gemm.input[2]} <= consts.keys():
        raise ValueError(f"ramp {ramp.index} ({ramp.file}): not one linear layer with "
                         f"constant weights")
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in gemm.attribute}
    weight = consts[gemm.input[1]].astype(np.float32)
    if not attrs.get("transB", 0):
        weight = weight.T  # stored C x classes
    bias = consts[gemm.input[2]].astype(np.float32)
    return LinearHead(np.ascontiguousarray(weight), bias, pool_of_arch(ramp.arch))


def head_file_name(ramp: RampSpec, version: int, data: bytes) -> str:
    """Where version ``version`` of ``ramp``'s head lives: named by its content, so a file
    of that name is that head (workers and the store agree without a lookup)."""
    return f"ramp_{ramp.index}.v{version}.{sha256_bytes(data)[:12]}.onnx"


def head_onnx(model_dir: str | Path, ramp: RampSpec, head: LinearHead) -> bytes:
    """The prepared head's ONNX graph (same pooling, inputs and outputs) with ``head``'s
    linear layer: what a refitted head is served as."""
    model = onnx.load(str(Path(model_dir) / ramp.file))
    gemm = head_gemm(model)
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in gemm.attribute}
    weight = head.weight if attrs.get("transB", 0) else head.weight.T
    arrays = {gemm.input[1]: weight, gemm.input[2]: head.bias}
    for t in model.graph.initializer:
        if t.name in arrays:
            want = np.asarray(arrays[t.name], np.float32)
            if tuple(t.dims) != want.shape:
                raise ValueError(f"ramp {ramp.index}: head {t.name} must be {tuple(t.dims)}, "
                                 f"got {want.shape}")
            t.CopyFrom(numpy_helper.from_array(want, t.name))
    return model.SerializeToString()


def save_head(model_dir: str | Path, ramp: RampSpec, version: int, head: LinearHead
              ) -> tuple[str, str]:
    """Write ``head`` as version ``version`` of ``ramp`` next to the model's other files
    (atomically: a worker never reads half a file); (file name, sha256)."""
    data = head_onnx(model_dir, ramp, head)
    name = head_file_name(ramp, version, data)
    path = Path(model_dir) / name
    if not path.exists():
        tmp = path.with_name(f".{name}.tmp")
        tmp.write_bytes(data)
        tmp.replace(path)
    return name, sha256_bytes(data)

"""Multiply-accumulate counts of ONNX graphs (what the modeled GPU class is picked by)."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from services.runtime.onnx_macs import graph_macs


def _model(nodes, inits, out_shape):
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", *out_shape])],
        [numpy_helper.from_array(a, n) for n, a in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


def test_conv_matmul_and_gemm_count_per_sample():
    rng = np.random.default_rng(0)
    inits = {"w": rng.standard_normal((4, 3, 3, 3)).astype(np.float32),
             "shape": np.array([-1, 256], dtype=np.int64),
             "m": rng.standard_normal((256, 10)).astype(np.float32),
             "g": rng.standard_normal((5, 10)).astype(np.float32)}
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("Reshape", ["r", "shape"], ["f"]),
             helper.make_node("MatMul", ["f", "m"], ["h"]),
             helper.make_node("Gemm", ["h", "g"], ["y"], transB=1)]
    model = _model(nodes, inits, [5])
    onnx.checker.check_model(model)
    got, _ = graph_macs(model, {"x": np.zeros((1, 3, 8, 8), np.float32)})
    # conv: 4 out x 3 in x 3x3 kernel x 8x8 positions; matmul 256 x 10; gemm 10 x 5
    assert got.macs == 4 * 3 * 9 * 64 + 256 * 10 + 10 * 5
    assert got.unknown == []


def test_a_strided_conv_counts_its_output_positions_only():
    w = np.ones((2, 3, 3, 3), np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1], strides=[2, 2])]
    got, _ = graph_macs(_model(nodes, {"w": w}, [2, 4, 4]), {"x": np.zeros((1, 3, 8, 8), np.float32)})
    assert got.macs == 2 * 3 * 9 * 16


def test_a_grouped_conv_counts_its_groups_weights():
    w = np.ones((3, 1, 3, 3), np.float32)  # depthwise: one input channel per output
    nodes = [helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1], group=3)]
    got, _ = graph_macs(_model(nodes, {"w": w}, [3, 8, 8]), {"x": np.zeros((1, 3, 8, 8), np.float32)})
    assert got.macs == 3 * 9 * 64


def test_a_feed_of_the_wrong_shape_is_an_error():
    w = np.ones((2, 3, 3, 3), np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])]
    with pytest.raises(Exception):  # noqa: B017 - onnxruntime's own error type
        graph_macs(_model(nodes, {"w": w}, [2, 8, 8]), {"x": np.zeros((1, 5, 8, 8), np.float32)})

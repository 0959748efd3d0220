"""Multiply-accumulates per sample of an ONNX graph: what a model's compute is compared by
when a published device curve of another network has to stand in for it (OFA and most
NAS papers call this count "FLOPs").

Counted: ``Conv`` (``C_out x C_in/groups x kernel x output positions``), ``MatMul`` and
``Gemm`` (``M x K x N`` over any leading axes). Elementwise ops, norms, pooling and
softmax are left out, as in those papers' counts, and so are ops inside subgraphs (``If``,
``Loop``). Shapes are the runtime's on one real sample; a counted op the runtime gives no
shape for is reported, not guessed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx

COUNTED = ("Conv", "MatMul", "Gemm")


@dataclass
class MacCount:
    macs: float = 0.0
    unknown: list[str] = field(default_factory=list)  # counted ops the runtime gave no shapes

    def add(self, other: MacCount) -> None:
        self.macs += other.macs
        self.unknown.extend(other.unknown)


def _node_macs(node: onnx.NodeProto, shape: dict[str, tuple[int, ...]]) -> float | None:
    if node.op_type == "Conv":
        w, y = shape.get(node.input[1]), shape.get(node.output[0])
        if w is None or y is None:
            return None
        return float(np.prod(w)) * float(np.prod(y[2:])) * y[0]
    if node.op_type in ("MatMul", "Gemm"):
        a, y = shape.get(node.input[0]), shape.get(node.output[0])
        if a is None or y is None or not a:
            return None
        trans_a = any(at.name == "transA" and at.i for at in node.attribute)
        k = a[-2] if node.op_type == "Gemm" and trans_a else a[-1]
        return float(np.prod(y)) * k
    return 0.0


def graph_macs(model: onnx.ModelProto, feeds: dict[str, np.ndarray]
               ) -> tuple[MacCount, np.ndarray]:
    """Multiply-accumulates of one sample through ``model`` fed ``feeds`` (batch 1; see
    the module docstring), and the graph's first output: the graph runs once with every
    operand of a counted op as an output, so the shapes are the ones the runtime computes."""
    import onnxruntime as ort

    counted = [n for n in model.graph.node if n.op_type in COUNTED]
    shape = {t.name: tuple(int(d) for d in t.dims) for t in model.graph.initializer}
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    have = {o.name for o in probe.graph.output}
    wanted = [x for n in counted for x in (n.input[0], n.output[0])
              if x not in shape and x not in have]
    for name in dict.fromkeys(wanted):
        probe.graph.output.append(onnx.ValueInfoProto(name=name))
    sess = ort.InferenceSession(probe.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    values = sess.run(names, feeds)
    for name, val in zip(names, values, strict=True):
        shape[name] = tuple(np.shape(val))
    out = MacCount()
    for node in counted:
        got = _node_macs(node, shape)
        if got is None:
            out.unknown.append(f"{node.op_type} {node.name}")
        else:
            out.macs += got
    return out, values[0]


def chain_macs(model_dir: Path, manifest, feed: dict[str, np.ndarray]) -> MacCount:
    """The sum over a prepared model's blocks, each fed what the block before it gave on
    ``feed`` (one sample's model inputs; later blocks also read the model inputs they name)."""
    total, x = MacCount(), None
    for i, spec in enumerate(manifest.blocks):
        if i == 0:
            feeds = {k: feed[k] for k in spec.input_names}
        else:
            feeds = {spec.input_names[0]: np.ascontiguousarray(x, dtype=np.float32)}
            feeds |= {k: feed[k] for k in spec.input_names[1:]}
        count, x = graph_macs(onnx.load(str(Path(model_dir) / spec.file)), feeds)
        total.add(count)
    return total

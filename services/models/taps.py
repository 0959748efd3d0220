"""Ramp taps: a stage with active ramps runs as ONE ONNX Runtime call, and each ramp's
logits reach Python from inside that call, the moment its head has run.

Splitting a stage at every active ramp (two runtime calls per ramp) costs far more than
the ramp's own arithmetic on a CPU: a second call, and ONNX Runtime's blocked NCHWc layout
converted out and back at the cut (about 3 % of EfficientNet-Lite0 per ramp on a 2-core
machine, more than the 2 % ramp budget). A tapped stage instead fuses every active head
into the stage graph and feeds its logits to a tap, a Python custom op
(onnxruntime-extensions ``PyOp``) that hands them to the caller's handler and returns a
tiny dummy output. The activations never leave the runtime's layout.

When a tap runs is up to ONNX Runtime's node order. Its default order visits the graph's
leaf nodes last-index-first and runs each one's missing ancestors before it, so the taps
go last in the node list, the earliest ramp's last: each tap runs right after its head,
before any node of the blocks after its site. That is an implementation detail of the
runtime, so every tapped session is checked once with the runtime's profiler
(``verify_order``) and a stage whose taps do not run in place falls back to split calls.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper

TAP_DOMAIN = "ai.onnx.contrib"   # onnxruntime-extensions' domain for Python ops
TAP_OP = "OfframpRampTap"

# handler(ramp index, logits [batch, classes]); runs inside the runtime call, GIL held
TapHandler = Callable[[int, np.ndarray], None]

_local = threading.local()
_registered = threading.Lock()
_library: str | None = None


def _tap(logits: np.ndarray, ramp: int) -> np.ndarray:
    handler = getattr(_local, "handler", None)
    if handler is not None:
        handler(int(ramp), logits)
    return np.zeros(1, dtype=np.float32)  # the runtime copies outputs out: keep it tiny


def library_path() -> str | None:
    """The custom-op library to register in a session's options (the tap op is declared
    on first use), or None when onnxruntime-extensions is not installed."""
    global _library
    with _registered:
        if _library is None:
            try:
                from onnxruntime_extensions import PyCustomOpDef, get_library_path, onnx_op
            except ImportError:
                return None
            onnx_op(op_type=TAP_OP, inputs=[PyCustomOpDef.dt_float],
                    outputs=[PyCustomOpDef.dt_float], attrs={"ramp": PyCustomOpDef.dt_int64})(_tap)
            _library = get_library_path()
        return _library


class handling:
    """``with handling(fn): session.run(...)``: taps on this thread call ``fn``. The runtime
    runs a custom op on the thread that called it (``verify_order`` checks that too)."""

    def __init__(self, handler: TapHandler) -> None:
        self.handler = handler

    def __enter__(self) -> None:
        self.previous = getattr(_local, "handler", None)
        _local.handler = self.handler

    def __exit__(self, *exc: object) -> None:
        _local.handler = self.previous


def tap_output(ramp: int) -> str:
    """Name of a ramp's tap node and of its dummy output."""
    return f"ramp{ramp}/tap"


def tapped(stage: onnx.ModelProto, heads: Sequence[tuple[int, str, onnx.ModelProto]]
           ) -> onnx.ModelProto:
    """``stage`` plus, for each ``(ramp, site tensor, head model)`` in site order, the head
    reading the site tensor and a tap on its logits. Outputs: the stage's, then one dummy
    per tap (a graph output keeps the tap alive)."""
    out = onnx.ModelProto()
    out.CopyFrom(stage)
    g = out.graph
    made = {o for n in g.node for o in n.output if o} | {i.name for i in g.input}
    head_nodes: list[onnx.NodeProto] = []
    taps: list[onnx.NodeProto] = []
    opsets = {o.domain: o.version for o in out.opset_import}
    for ramp, site, head in heads:
        if site not in made:
            raise ValueError(f"ramp {ramp}: site tensor {site!r} is not in the stage")
        h = onnx.compose.add_prefix(_pool_in_layout(head), f"ramp{ramp}/")
        for o in h.opset_import:
            if o.domain in ("", "ai.onnx") and o.version > opsets.get(o.domain, o.version):
                raise ValueError(f"ramp {ramp}'s head needs opset {o.version} > the stage's")
        x, logits = h.graph.input[0].name, h.graph.output[0].name
        for n in h.graph.node:
            n.input[:] = [site if i == x else i for i in n.input]
            head_nodes.append(n)
        g.initializer.extend(h.graph.initializer)
        taps.append(helper.make_node(TAP_OP, [logits], [tap_output(ramp)], domain=TAP_DOMAIN,
                                     name=tap_output(ramp), ramp=ramp))
    g.node.extend(head_nodes)
    g.node.extend(reversed(taps))   # the earliest ramp's tap is the last leaf: it runs first
    for ramp, _, _ in heads:
        g.output.append(helper.make_tensor_value_info(tap_output(ramp), TensorProto.FLOAT, None))
    if TAP_DOMAIN not in opsets:
        out.opset_import.append(helper.make_opsetid(TAP_DOMAIN, 1))
    return out


def _pool_in_layout(head: onnx.ModelProto) -> onnx.ModelProto:
    """A head that opens with a spatial mean (ReduceMean over axes 2, 3) gets the equal
    GlobalAveragePool + Flatten instead: ONNX Runtime runs that in its blocked layout, so
    the site tensor is not converted back to NCHW just to be averaged."""
    first = head.graph.node[0] if head.graph.node else None
    if first is None or first.op_type != "ReduceMean" or len(first.input) != 1:
        return head
    attrs = {a.name: helper.get_attribute_value(a) for a in first.attribute}
    if sorted(attrs.get("axes", [])) not in ([2, 3], [-2, -1]) or attrs.get("keepdims", 1) != 0:
        return head
    out = onnx.ModelProto()
    out.CopyFrom(head)
    pooled = f"{first.output[0]}/pooled"
    nodes = [helper.make_node("GlobalAveragePool", [first.input[0]], [pooled],
                              name=f"{first.name}/gap"),
             helper.make_node("Flatten", [pooled], [first.output[0]], axis=1,
                              name=f"{first.name}/flatten")]
    nodes.extend(out.graph.node[1:])
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    return out


@dataclass(frozen=True)
class OrderCheck:
    ok: bool
    reason: str


def profile_into(so, folder: str) -> None:
    """Session options that profile the first run(s) into ``folder`` (see verify_order)."""
    so.enable_profiling = True
    so.profile_file_prefix = os.path.join(folder, "tapped")


def verify_order(sess, feeds: dict[str, np.ndarray], ramps: Sequence[int],
                 later_nodes: dict[int, set[str]]) -> OrderCheck:
    """Run a tapped session built with ``profile_into`` once and check that every tap ran
    on the calling thread, in ramp order, before any node of the blocks after its site
    (``later_nodes[ramp]``: names of those nodes in the source graph; nodes the optimizer
    renamed are not checked). Ends the profiling: the session then serves as usual."""
    seen: list[int] = []
    with handling(lambda r, _logits: seen.append(r)):
        sess.run(None, feeds)
    path = sess.end_profiling()
    with open(path) as f:
        events = json.load(f)
    if seen != list(ramps):
        return OrderCheck(False, f"taps ran {seen} on the calling thread, expected {list(ramps)}")
    kernels = sorted((e for e in events if e.get("cat") == "Node"
                      and str(e.get("name", "")).endswith("_kernel_time")),
                     key=lambda e: e["ts"])
    names = [e["name"][: -len("_kernel_time")] for e in kernels]
    for r in ramps:
        tap = tap_output(r)  # the tap node is named after its output
        if tap not in names:
            return OrderCheck(False, f"the profile shows no run of {tap}")
        early = [n for n in names[: names.index(tap)] if n in later_nodes.get(r, set())]
        if early:
            return OrderCheck(False, f"{len(early)} nodes after ramp {r}'s site ran before its "
                              f"tap (first: {early[0]})")
    return OrderCheck(True, "every tap ran right after its head")

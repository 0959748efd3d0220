"""Ramp taps: a stage with active ramps runs as ONE ONNX Runtime call, and each ramp's exits
are decided inside that call, the moment its head has run.

Splitting a stage at every active ramp (two runtime calls per ramp) costs far more than
the ramp's own arithmetic on a CPU: a second call, and ONNX Runtime's blocked NCHWc layout
converted out and back at the cut (about 3 % of EfficientNet-Lite0 per ramp on a 2-core
machine, more than the 2 % ramp budget). A tapped stage instead fuses every active head
into the stage graph and ends it in a ``RampTap`` (``ramp_tap.c``, a native custom op): it
scores each row, marks the rows below the ramp's threshold as exited and hands only those
to Python (the ``on_exit`` of ``run_with_taps``), so their answers leave while the stage
goes on. A ramp where nothing exits costs its head and a loop over its logits: no Python
call inside the runtime (the Python custom op used before called Python at every ramp).
Every row's top-1 and score come back as an output of the call (telemetry).

When a tap runs is up to ONNX Runtime's node order. Its default order visits the graph's
leaf nodes last-index-first and runs each one's missing ancestors before it, so the taps
go last in the node list, the earliest ramp's last: each tap runs right after its head,
before any node of the blocks after its site. That is an implementation detail of the
runtime, so every tapped session is checked once with the runtime's profiler
(``verify_order``) and a stage whose taps do not run in place falls back to split calls.
A tapped stage may also output the pooled features at every ramp site (``site_features``):
their nodes go before the taps in the node list, so they are visited after every tap and
never pull a later block ahead of one.
"""

from __future__ import annotations

import ctypes
import functools
import json
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
import onnx
from onnx import TensorProto, helper

from services.exits.scores import SCORE_KINDS
from services.runtime import tap_library
from services.runtime.onnx_blocks import BoundHead, bind_head, features_name, head_pooling

TAP_DOMAIN = "offramp"
TAP_OP = "RampTap"

# on_exit(ramp, rows, labels, scores, logits) for the rows that exit at ``ramp``; runs
# inside the runtime call on its thread (the GIL held), must not block
ExitHandler = Callable[[int, np.ndarray, np.ndarray, np.ndarray, np.ndarray], None]
T = TypeVar("T")


@dataclass(frozen=True)
class TapPlan:
    """An exit config as the taps read it: thresholds by ramp index (0: never exits)."""

    thresholds: np.ndarray    # float32, indexed by ramp
    score_kind: int           # index into SCORE_KINDS
    address: int              # of ``thresholds`` (asking numpy per batch costs ~15 us cold)


@functools.lru_cache(maxsize=64)
def tap_plan(thresholds: tuple[tuple[int, float], ...], score: str) -> TapPlan:
    """The plan of ``(ramp, threshold)`` pairs and a score kind (cached: a worker builds one
    per exit config, not per batch)."""
    if score not in SCORE_KINDS:
        raise ValueError(f"unknown score kind {score!r}; known: {', '.join(SCORE_KINDS)}")
    th = np.zeros(max((r for r, _ in thresholds), default=-1) + 1, np.float32)
    for r, t in thresholds:
        th[r] = t
    th.flags.writeable = False
    return TapPlan(th, SCORE_KINDS.index(score), th.ctypes.data)


class _Run:
    __slots__ = ("errors", "on_exit", "reported")

    def __init__(self, on_exit: ExitHandler | None) -> None:
        self.on_exit = on_exit
        self.reported: list[int] = []
        self.errors: list[BaseException] = []


_local = threading.local()
_lib: ctypes.CDLL | None = None


@tap_library.EXIT_CALLBACK
def _on_exit(ramp, batch, n, rows, logits, classes, outcome) -> None:
    run: _Run | None = getattr(_local, "run", None)
    if run is None:
        return
    try:
        run.reported.append(int(ramp))
        if n == 0 or run.on_exit is None:
            return
        idx = np.ctypeslib.as_array(rows, shape=(n,)).copy()
        got = np.ctypeslib.as_array(outcome, shape=(batch, 2))[idx]
        run.on_exit(int(ramp), idx, got[:, 0].astype(np.int32), got[:, 1].copy(),
                    np.ctypeslib.as_array(logits, shape=(batch, classes))[idx])
    except BaseException as exc:  # noqa: BLE001 - raised again after the runtime call
        run.errors.append(exc)


def _library() -> ctypes.CDLL:
    global _lib
    if _lib is None:
        lib = tap_library.load()
        if lib is None:
            raise RuntimeError(tap_library.failure() or "no ramp tap library")
        lib.lib.offramp_tap_callback(_on_exit)
        _lib = lib.lib
    return _lib


def run_with_taps(call: Callable[[], T], plan: TapPlan, exit_at: np.ndarray,
                  on_exit: ExitHandler | None = None, report_all: bool = False
                  ) -> tuple[T, list[int]]:
    """``call()`` (a runtime call of a tapped session, on this thread) with its taps deciding
    by ``plan`` on the batch's exit state ``exit_at`` (int32 per row, -1 = running; the taps
    write the ramp a row exits at) and calling ``on_exit`` for the rows that exit. The
    runtime runs a custom op on the thread that called it (``verify_order`` checks that).
    ``report_all``: every tap calls back and nothing exits (the order check). Returns the
    call's result and the ramps that called back, in order; a handler's exception is raised
    when the call is over."""
    lib = _lib or _library()  # every step here is paid per batch, on caches the model run
    if exit_at.dtype != np.int32 or not exit_at.flags.c_contiguous:  # just evicted: few steps
        raise ValueError("exit_at must be a contiguous int32 array")
    run = _local.run = _Run(on_exit)  # runs do not nest (one state per thread in C)
    lib.offramp_tap_begin(plan.address, plan.thresholds.size,
                          exit_at.__array_interface__["data"][0], exit_at.shape[0],
                          plan.score_kind, int(report_all))
    try:
        result = call()
    finally:
        lib.offramp_tap_end()
        _local.run = None
    if run.errors:
        raise run.errors[0]
    return result, run.reported


def tap_node(ramp: int) -> str:
    """Name of a ramp's tap node."""
    return f"ramp{ramp}/tap"


def tap_output(ramp: int) -> str:
    """Name of a ramp's tap output: float [batch, 2] of (top-1 label, exit score) per row."""
    return f"ramp{ramp}/outcome"


def feature_output(ramp: int) -> str:
    """Name of the output holding a ramp site's pooled features: float [batch, dim] (or
    [batch, dim, 1, 1]: a spatial pooling, see ``site_features``)."""
    return f"ramp{ramp}/features"


def tapped(stage: onnx.ModelProto, heads: Sequence[tuple[int, str, onnx.ModelProto]],
           features: Sequence[tuple[int, str, onnx.ModelProto]] = ()) -> onnx.ModelProto:
    """``stage`` plus, for each ``(ramp, site tensor, head model)`` in site order, the head
    reading the site tensor and a tap on its logits. Outputs: the stage's, then each tap's
    outcome in ramp order (a graph output keeps the tap alive), then the ``features``
    sites' pooled features (``site_features``)."""
    out = onnx.ModelProto()
    out.CopyFrom(stage)
    out.MergeFrom(tap_extension(StageFacts.of(stage), heads, features))
    return out


@dataclass(frozen=True)
class StageFacts:
    """What ``tap_extension`` checks heads against: the stage's tensors and opsets."""

    tensors: frozenset[str]
    opsets: tuple[tuple[str, int], ...]

    @classmethod
    def of(cls, stage: onnx.ModelProto) -> StageFacts:
        g = stage.graph
        return cls(frozenset({o for n in g.node for o in n.output if o} |
                             {i.name for i in g.input}),
                   tuple((o.domain, o.version) for o in stage.opset_import))


def _check_opsets(ramp: int, h: BoundHead, opsets: dict[str, int], exact: bool = False) -> None:
    for domain, version in h.opsets.items():
        have = opsets.get(domain, version)
        if domain in ("", "ai.onnx") and (version > have or (exact and version != have)):
            raise ValueError(f"ramp {ramp}'s head needs opset {version}, the stage has {have}")


def tap_extension(stage: StageFacts, heads: Sequence[tuple[int, str, onnx.ModelProto]],
                  features: Sequence[tuple[int, str, onnx.ModelProto]] = ()
                  ) -> onnx.ModelProto:
    """What a tapped stage adds to its stage, as a ModelProto to merge into it: the heads'
    nodes and weights, the nodes of the ``features`` sites' outputs (``site_features``; an
    active head's features are its Gemm's input), the taps (last: the earliest ramp's tap
    is the last leaf, so it runs first), their outputs, then the features', and the tap
    domain's opset. Protobuf parses concatenated serializations as one merged message
    (repeated fields append), so a worker appends these few bytes to its stage's cached
    serialization instead of copying and re-serializing the whole stage (about 0.3 s with
    the GIL held for MiniLM's 90 MB, long enough to stall the worker's heartbeats)."""
    ext = onnx.ModelProto()
    g = ext.graph
    opsets = dict(stage.opsets)
    head_nodes: list[onnx.NodeProto] = []
    tap_nodes: list[onnx.NodeProto] = []
    added_inputs: set[str] = set()
    fused: dict[int, str] = {}
    for ramp, site, head in heads:
        if site not in stage.tensors:
            raise ValueError(f"ramp {ramp}: site tensor {site!r} is not in the stage")
        h = bind_head(pool_in_layout(head), f"ramp{ramp}/", site)
        _check_opsets(ramp, h, opsets)
        fused[ramp] = features_name(head, f"ramp{ramp}/", site)
        head_nodes.extend(h.nodes)
        g.initializer.extend(h.initializers)
        for vi in h.inputs:  # e.g. the attention mask, where the stage does not read it
            if vi.name not in stage.tensors and vi.name not in added_inputs:
                g.input.append(vi)
                added_inputs.add(vi.name)
        tap_nodes.append(helper.make_node(TAP_OP, [h.output.name], [tap_output(ramp)],
                                          domain=TAP_DOMAIN, name=tap_node(ramp), ramp=ramp))
    g.node.extend(head_nodes)
    feats = site_features(StageFacts(stage.tensors | added_inputs, stage.opsets), features,
                          fused) if features else None
    if feats is not None:  # before the taps: visited after every tap (see the module doc)
        g.node.extend(feats.graph.node)
        g.initializer.extend(feats.graph.initializer)
        g.input.extend(feats.graph.input)
    g.node.extend(reversed(tap_nodes))
    for ramp, _, _ in heads:
        g.output.append(helper.make_tensor_value_info(tap_output(ramp), TensorProto.FLOAT, None))
    if feats is not None:
        g.output.extend(feats.graph.output)
    if TAP_DOMAIN not in opsets:
        ext.opset_import.append(helper.make_opsetid(TAP_DOMAIN, 1))
    return ext


def site_features(stage: StageFacts, sites: Sequence[tuple[int, str, onnx.ModelProto]],
                  fused: Mapping[int, str]) -> onnx.ModelProto:
    """What outputting the pooled features of ``sites`` (``(ramp, site tensor, head)``
    each) adds to a graph, as a ModelProto to merge into it: outputs ``feature_output(ramp)``
    in that order, each the input of the head's linear layer. A ramp in ``fused`` (ramp ->
    that tensor: its whole head is in the graph already) exposes it; any other site gets
    its head's pooling alone, names prefixed ``feat{ramp}/``, as the head file has it (not
    ``pool_in_layout``: ONNX Runtime adds a blocked-layout pooling as a new node at the end of
    its order, a leaf it then runs first, with every block before it, so the taps ran late;
    a head that pools and flattens leaves [batch, C, 1, 1] for the reader to flatten). Its
    opsets must equal the graph's (a ReduceMean changed)."""
    ext = onnx.ModelProto()
    g = ext.graph
    opsets = dict(stage.opsets)
    have = set(stage.tensors)
    for ramp, site, head in sites:
        src = fused.get(ramp)
        if src is None:
            if site not in stage.tensors:
                raise ValueError(f"ramp {ramp}: site tensor {site!r} is not in the graph")
            prefix = f"feat{ramp}/"
            h = bind_head(head_pooling(head), prefix, site)
            if h.nodes:
                _check_opsets(ramp, h, opsets, exact=True)
            src = features_name(head, prefix, site)
            if _flattens(h.nodes[-1:], src):  # a kernel call per site (~5 us): the reader
                src = h.nodes.pop().input[0]  # flattens [batch, C, 1, 1] for free instead
            g.node.extend(h.nodes)
            g.initializer.extend(h.initializers)
            for vi in h.inputs:  # a mask the graph does not read yet
                if vi.name not in have:
                    g.input.append(vi)
                    have.add(vi.name)
        g.node.append(helper.make_node("Identity", [src], [feature_output(ramp)],
                                       name=f"feat{ramp}/out"))
        g.output.append(helper.make_tensor_value_info(feature_output(ramp), TensorProto.FLOAT,
                                                      None))
    return ext


def _flattens(nodes: Sequence[onnx.NodeProto], output: str) -> bool:
    """Whether ``nodes`` is one Flatten to 2-D (axis 1) making ``output``."""
    if len(nodes) != 1 or nodes[0].op_type != "Flatten" or nodes[0].output[0] != output:
        return False
    axis = {a.name: helper.get_attribute_value(a) for a in nodes[0].attribute}.get("axis", 1)
    return axis == 1


def pool_in_layout(head: onnx.ModelProto) -> onnx.ModelProto:
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


def _source_name(node: str) -> str:
    """The source graph's name of a profiled node: ONNX Runtime's blocked-layout (NCHWc)
    transformer runs a node under its name + ``_nchwc``."""
    return node.removesuffix("_nchwc")


def verify_order(sess, feeds: dict[str, np.ndarray], ramps: Sequence[int],
                 later_nodes: dict[int, set[str]]) -> OrderCheck:
    """Run a tapped session built with ``profile_into`` once and check that every tap ran
    on the calling thread, in ramp order, before any node of the blocks after its site
    (``later_nodes[ramp]``: names of those nodes in the source graph, also under the names
    the NCHWc transformer gives them; nodes the optimizer renamed otherwise are not checked). Ends the profiling: the session then serves as usual."""
    batch = next(iter(feeds.values())).shape[0] if feeds else 1
    _, reported = run_with_taps(lambda: sess.run(None, feeds), tap_plan((), "max_softmax"),
                                np.full(batch, -1, np.int32), report_all=True)
    path = sess.end_profiling()
    with open(path) as f:
        events = json.load(f)
    if reported != list(ramps):
        return OrderCheck(False, f"taps ran {reported} on the calling thread, "
                          f"expected {list(ramps)}")
    kernels = sorted((e for e in events if e.get("cat") == "Node"
                      and str(e.get("name", "")).endswith("_kernel_time")),
                     key=lambda e: e["ts"])
    names = [e["name"][: -len("_kernel_time")] for e in kernels]
    for r in ramps:
        tap = tap_node(r)
        if tap not in names:
            return OrderCheck(False, f"the profile shows no run of {tap}")
        later = later_nodes.get(r, set())
        early = [n for n in names[: names.index(tap)] if _source_name(n) in later]
        if early:
            return OrderCheck(False, f"{len(early)} nodes after ramp {r}'s site ran before its "
                              f"tap (first: {early[0]})")
    return OrderCheck(True, "every tap ran right after its head")

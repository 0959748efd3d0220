"""The ONNX graph index that ramp sites and block surgery share: nodes in topological order,
which of them are "free" (computable from constants and graph inputs alone, so any stage
can recompute them) and the live-tensor sweep that finds cut vertices
(see ``services.prepare.sites``)."""

from __future__ import annotations

import heapq
from collections import defaultdict
from dataclasses import dataclass

import onnx

# Cheap ops that may be recomputed from graph inputs in any block (see module doc).
LIGHT_OPS = frozenset({
    "Constant", "ConstantOfShape", "Shape", "Size", "Gather", "Unsqueeze", "Squeeze",
    "Reshape", "Flatten", "Cast", "CastLike", "Expand", "Concat", "Slice", "Range",
    "Identity", "Equal", "Not", "And", "Or", "Xor", "Less", "Greater", "LessOrEqual",
    "GreaterOrEqual", "Where", "Add", "Sub", "Mul", "Div", "Neg", "Min", "Max", "Transpose",
    "Tile", "CumSum", "Sqrt", "Pow", "Abs",
})
# Ops with real compute; a site followed by at most one of them only feeds the classifier.
COMPUTE_OPS = frozenset({
    "Conv", "ConvTranspose", "ConvInteger", "QLinearConv", "Gemm", "MatMul", "MatMulInteger",
    "QLinearMatMul", "Einsum", "LSTM", "GRU", "RNN", "Attention",
})
LIVE_HEAD_SHOWN = 3  # live tensor names quoted in a rejection reason


@dataclass
class GraphIndex:
    """Topologically sorted nodes with free flags, producers and live-set sizes."""

    nodes: list[onnx.NodeProto]
    node_inputs: list[list[str]]  # explicit inputs plus outer names used by subgraphs
    producer: dict[str, int]
    free: list[bool]
    initializers: set[str]
    graph_inputs: list[str]
    graph_outputs: list[str]
    last_use: dict[str, int]  # position of the last non-free consumer (len(nodes): output)
    live_count: list[int]  # after node i (0 for free nodes)
    live_head: list[tuple[str, ...]]  # the first few live tensor names after node i
    computes_after: list[int]  # non-free COMPUTE_OPS nodes after node i
    next_busy: list[int]  # the next non-free node after node i (len(nodes) if none)

    def is_free(self, name: str) -> bool:
        i = self.producer.get(name)
        return i is None or self.free[i]


def _subgraph_refs(g: onnx.GraphProto) -> set[str]:
    """Names a subgraph (If/Loop/Scan body) reads from the enclosing scope."""
    local = {i.name for i in g.input} | {t.name for t in g.initializer}
    refs: set[str] = set()
    for n in g.node:
        for name in _inputs(n):
            if name not in local:
                refs.add(name)
        local.update(n.output)
    return refs


def _inputs(node: onnx.NodeProto) -> list[str]:
    names = [x for x in node.input if x]
    for a in node.attribute:
        for g in ([a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)):
            names.extend(sorted(_subgraph_refs(g) - set(names)))
    return names


def _toposort(nodes: list[onnx.NodeProto], ins: list[list[str]]) -> list[int]:
    """Stable topological order (original order wherever valid)."""
    prod = {o: k for k, n in enumerate(nodes) for o in n.output if o}
    deps = [{prod[x] for x in xs if x in prod} - {k} for k, xs in enumerate(ins)]
    if all(d < k for k, ds in enumerate(deps) for d in ds):
        return list(range(len(nodes)))
    users: dict[int, list[int]] = defaultdict(list)
    for k, ds in enumerate(deps):
        for d in ds:
            users[d].append(k)
    pending = [len(ds) for ds in deps]
    ready = [k for k, p in enumerate(pending) if p == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        k = heapq.heappop(ready)
        order.append(k)
        for u in users[k]:
            pending[u] -= 1
            if pending[u] == 0:
                heapq.heappush(ready, u)
    if len(order) != len(nodes):
        raise ValueError("graph has a cycle or reads a tensor nothing produces")
    return order


def index_graph(model: onnx.ModelProto) -> GraphIndex:
    g = model.graph
    inits = {t.name for t in g.initializer} | {t.values.name for t in g.sparse_initializer}
    graph_inputs = [i.name for i in g.input if i.name not in inits]
    raw = list(g.node)
    raw_ins = [_inputs(n) for n in raw]
    order = _toposort(raw, raw_ins)
    nodes = [raw[k] for k in order]
    node_inputs = [raw_ins[k] for k in order]
    producer = {o: i for i, n in enumerate(nodes) for o in n.output if o}
    free, avail = _free_nodes(nodes, node_inputs, inits, graph_inputs)
    outputs = [o.name for o in g.output]
    last_use = _last_uses(node_inputs, free, avail, outputs)
    live_count, live_head = _live_sets(nodes, free, last_use)
    end = len(nodes)
    computes_after, next_busy = [0] * end, [end] * end
    computes, busy = 0, end
    for i in range(end - 1, -1, -1):
        computes_after[i], next_busy[i] = computes, busy
        if not free[i]:
            computes += nodes[i].op_type in COMPUTE_OPS
            busy = i
    return GraphIndex(nodes, node_inputs, producer, free, inits, graph_inputs, outputs,
                      last_use, live_count, live_head, computes_after, next_busy)


def _free_nodes(nodes: list[onnx.NodeProto], node_inputs: list[list[str]], inits: set[str],
                graph_inputs: list[str]) -> tuple[list[bool], set[str]]:
    """Which nodes are free (see the module doc) and every tensor computable without a
    non-free activation."""
    const = set(inits)  # computable from constants alone
    avail = const | set(graph_inputs)  # computable without any non-free activation
    free: list[bool] = []
    for n, xs in zip(nodes, node_inputs, strict=True):
        has_graph = any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
                        for a in n.attribute)
        random = n.op_type.startswith("Random") or n.op_type in ("Bernoulli", "Multinomial")
        is_const = not has_graph and not random and all(x in const for x in xs)
        is_free = is_const or (n.op_type in LIGHT_OPS and not has_graph
                               and all(x in avail for x in xs))
        if is_const:
            const.update(n.output)
        if is_free:
            avail.update(n.output)
        free.append(is_free)
    return free, avail


def _last_uses(node_inputs: list[list[str]], free: list[bool], avail: set[str],
               outputs: list[str]) -> dict[str, int]:
    """Position of each non-free tensor's last non-free consumer (graph outputs: the end)."""
    last_use: dict[str, int] = {}
    for i, xs in enumerate(node_inputs):
        if not free[i]:
            for x in xs:
                if x not in avail:
                    last_use[x] = i
    for o in outputs:
        last_use[o] = len(node_inputs)
    return last_use


def _live_sets(nodes: list[onnx.NodeProto], free: list[bool], last_use: dict[str, int]
               ) -> tuple[list[int], list[tuple[str, ...]]]:
    """After each non-free node: how many tensors are live, and the first few of them."""
    end = len(nodes)
    leaving: dict[int, list[str]] = defaultdict(list)
    for name, i in last_use.items():
        leaving[i].append(name)
    live: dict[str, None] = {}
    live_count = [0] * end
    live_head: list[tuple[str, ...]] = [()] * end
    for i, n in enumerate(nodes):
        if free[i]:
            continue
        for name in leaving.get(i, ()):
            live.pop(name, None)
        for o in n.output:
            if o and last_use.get(o, -1) > i:
                live[o] = None
        live_count[i] = len(live)
        head = []
        for name in live:
            head.append(name)
            if len(head) > LIVE_HEAD_SHOWN:
                break
        live_head[i] = tuple(head)
    return live_count, live_head


def infer(model: onnx.ModelProto) -> onnx.ModelProto:
    """Shape-inferred, topologically sorted copy (inference walks nodes in stored order).

    Uses data propagation, so Shape->Gather->Reshape chains resolve.
    """
    nodes = list(model.graph.node)
    order = _toposort(nodes, [_inputs(n) for n in nodes])
    if order != list(range(len(nodes))):
        model = _copy(model)
        del model.graph.node[:]
        model.graph.node.extend(nodes[k] for k in order)
    try:
        return onnx.shape_inference.infer_shapes(model, data_prop=True)
    except Exception:  # noqa: BLE001 - fall back to plain inference on exotic graphs
        return onnx.shape_inference.infer_shapes(model)


def _copy(model: onnx.ModelProto) -> onnx.ModelProto:
    out = onnx.ModelProto()
    out.CopyFrom(model)
    return out


def value_infos(model: onnx.ModelProto) -> dict[str, onnx.ValueInfoProto]:
    g = model.graph
    return {v.name: v for v in [*g.input, *g.value_info, *g.output]}

"""Split an ONNX model into blocks at ramp sites, and reassemble stages from blocks.

Block k runs the non-free nodes between site k-1 (exclusive) and site k (inclusive):
its inputs are site k-1's tensor (named as in the full model) plus any graph inputs it
reads; its output is site k's tensor, or the graph outputs for the last block. Free
nodes (constants and cheap ops on graph inputs, see ``sites``) are copied into every
block that reads them, so e.g. an attention-mask bias is recomputed per block instead
of being passed along. Plain protobuf surgery keeps every tensor name unchanged, which
makes assembling a stage from contiguous blocks a union of nodes.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import onnx
from onnx import helper

from services.runtime.onnx_graph import GraphIndex, index_graph, infer, value_infos


def _model_like(model: onnx.ModelProto, graph: onnx.GraphProto) -> onnx.ModelProto:
    out = helper.make_model(graph, opset_imports=list(model.opset_import),
                            functions=list(model.functions))
    out.ir_version = model.ir_version
    out.producer_name = model.producer_name or "offramp"
    out.producer_version = model.producer_version
    out.domain, out.model_version = model.domain, model.model_version
    onnx.checker.check_model(out)
    return out


def _io(vis: dict[str, onnx.ValueInfoProto], name: str) -> onnx.ValueInfoProto:
    vi = vis.get(name)
    if vi is None or not vi.type.HasField("tensor_type") or not vi.type.tensor_type.elem_type:
        raise ValueError(f"no inferred type for tensor {name!r}; cannot make it a block boundary")
    out = onnx.ValueInfoProto()
    out.CopyFrom(vi)
    return out


def _check_cut(gi: GraphIndex, name: str) -> int:
    i = gi.producer.get(name)
    if i is None or gi.free[i]:
        raise ValueError(f"unknown site {name!r}: no non-constant node produces it")
    if name in gi.graph_outputs or gi.last_use.get(name, -1) <= i:
        raise ValueError(f"site {name!r} is a graph output or unused")
    if gi.live_count[i] != 1:
        others = [x for x in gi.live_head[i] if x != name]
        raise ValueError(f"site {name!r} is not a cut vertex: {gi.live_count[i]} tensors are "
                         f"live there ({', '.join([name, *others])}, ...)")
    return i


def split_blocks(model: onnx.ModelProto, site_tensors: list[str]) -> list[onnx.ModelProto]:
    """``len(site_tensors) + 1`` checked block models; sites must be cut vertices in order."""
    inferred = infer(model)
    gi = index_graph(inferred)
    vis = value_infos(inferred)
    cuts = [_check_cut(gi, name) for name in site_tensors]
    if any(b <= a for a, b in itertools.pairwise(cuts)):
        raise ValueError(f"sites must be distinct and in execution order: {site_tensors}")
    inits = {t.name: t for t in inferred.graph.initializer}
    sparse = {t.values.name: t for t in inferred.graph.sparse_initializer}
    graph_inputs = set(gi.graph_inputs)
    bounds = [-1, *cuts, len(gi.nodes)]
    blocks: list[onnx.ModelProto] = []
    for k in range(len(bounds) - 1):
        lo, hi = bounds[k], bounds[k + 1]
        own = [i for i in range(lo + 1, min(hi + 1, len(gi.nodes))) if not gi.free[i]]
        wanted = list(gi.graph_outputs) if k == len(cuts) else [site_tensors[k]]
        picked = _with_free_cone(gi, own, wanted)
        nodes = [gi.nodes[i] for i in picked]
        used = {x for i in picked for x in gi.node_inputs[i]} | set(wanted)
        entry = [] if k == 0 else [site_tensors[k - 1]]
        inputs = [*entry, *(x for x in gi.graph_inputs if x in used)]
        graph = helper.make_graph(
            nodes,
            f"{inferred.graph.name or 'model'}_block{k}",
            [_io(vis, x) for x in inputs],
            [_io(vis, x) for x in wanted],
            initializer=[inits[x] for x in inits if x in used],
            sparse_initializer=[sparse[x] for x in sparse if x in used],
        )
        produced = {o for n in nodes for o in n.output} | set(inputs) | set(inits) | set(sparse)
        missing = used - produced - graph_inputs
        if missing:  # only reachable if the analysis and the split disagree
            raise ValueError(f"block {k} reads tensors it cannot get: {sorted(missing)[:5]}")
        blocks.append(_model_like(inferred, graph))
    return blocks


def _with_free_cone(gi: GraphIndex, own: list[int], wanted: list[str]) -> list[int]:
    """``own`` plus every free node whose output they (or ``wanted``) need, in order."""
    picked = set(own)
    stack = [x for i in own for x in gi.node_inputs[i]] + list(wanted)
    while stack:
        j = gi.producer.get(stack.pop())
        if j is not None and gi.free[j] and j not in picked:
            picked.add(j)
            stack.extend(gi.node_inputs[j])
    return sorted(picked)


def assemble(blocks: list[onnx.ModelProto], start: int, end: int) -> onnx.ModelProto:
    """One stage model running ``blocks[start:end]`` (half-open, like a slice).

    Names are shared with the full model, so merging is a union: block inputs not
    produced earlier in the stage become stage inputs, duplicated free nodes (recomputed
    per block) and shared initializers are kept once.
    """
    if not 0 <= start < end <= len(blocks):
        raise ValueError(f"bad block range [{start}, {end}) of {len(blocks)} blocks")
    part = blocks[start:end]
    if len(part) == 1:
        out = onnx.ModelProto()
        out.CopyFrom(part[0])
        return out
    nodes: list[onnx.NodeProto] = []
    inputs: list[onnx.ValueInfoProto] = []
    inits: dict[str, onnx.TensorProto] = {}
    sparse: dict[str, onnx.SparseTensorProto] = {}
    produced: set[str] = set()
    for b in part:
        for vi in b.graph.input:
            if vi.name not in produced:
                inputs.append(vi)
                produced.add(vi.name)
        for t in b.graph.initializer:
            inits.setdefault(t.name, t)
        for st in b.graph.sparse_initializer:
            sparse.setdefault(st.values.name, st)
        for n in b.graph.node:
            if not all(o in produced for o in n.output if o):
                nodes.append(n)
                produced.update(o for o in n.output if o)
    first = part[0]
    graph = helper.make_graph(nodes, f"{first.graph.name}_to_{end - 1}", inputs,
                              list(part[-1].graph.output), initializer=list(inits.values()),
                              sparse_initializer=list(sparse.values()))
    return _model_like(first, graph)


def add_outputs(model: onnx.ModelProto, tensors: list[str]) -> onnx.ModelProto:
    """Copy of ``model`` that also outputs ``tensors`` (ramp-training activations in one
    pass). Types come from shape inference; a tensor of unknown type gets an untyped
    output, which ONNX Runtime fills in at run time."""
    vis = value_infos(infer(model))
    made = {o for n in model.graph.node for o in n.output if o}
    out = onnx.ModelProto()
    out.CopyFrom(model)
    have = {o.name for o in out.graph.output}
    for name in tensors:
        if name not in made:
            raise ValueError(f"unknown tensor {name!r}: no node of the model produces it")
        if name in have:
            continue
        vi = vis.get(name)
        if vi is not None and vi.type.tensor_type.elem_type:
            out.graph.output.append(vi)
        else:
            out.graph.output.append(helper.make_empty_tensor_value_info(name))
        have.add(name)
    onnx.checker.check_model(out)
    return out


@dataclass
class BoundHead:
    """A ramp head ready to join a graph (``bind_head``)."""

    nodes: list[onnx.NodeProto]
    initializers: list[onnx.TensorProto]
    inputs: list[onnx.ValueInfoProto]  # model inputs it reads, for a graph that lacks them
    output: onnx.ValueInfoProto  # its logits
    opsets: dict[str, int]


def bind_head(head: onnx.ModelProto, prefix: str, site: str) -> BoundHead:
    """``head``'s nodes and weights, names prefixed with ``prefix`` so they cannot clash,
    reading the graph tensor ``site`` as its first input and any further inputs (model
    inputs such as an attention mask) under their own names."""
    extra = [vi.name for vi in head.graph.input[1:]]
    h = onnx.compose.add_prefix(head, prefix)
    rename = {h.graph.input[0].name: site, **{prefix + n: n for n in extra}}
    nodes = []
    for n in h.graph.node:
        n.input[:] = [rename.get(i, i) for i in n.input]
        nodes.append(n)
    inputs = []
    for vi in head.graph.input[1:]:
        copy = onnx.ValueInfoProto()
        copy.CopyFrom(vi)
        inputs.append(copy)
    return BoundHead(nodes, list(h.graph.initializer), inputs, h.graph.output[0],
                     {o.domain or "": o.version for o in h.opset_import})


def with_head(model: onnx.ModelProto, head: onnx.ModelProto, prefix: str) -> onnx.ModelProto:
    """``model`` whose (first) output also feeds ``head``: outputs [activation, head
    logits]. One graph, so a ramp costs its own arithmetic and no extra runtime call.
    The head's names get ``prefix``; a model input the head reads joins the graph's
    inputs if the model does not read it already."""
    act = model.graph.output[0].name
    b = bind_head(head, prefix, act)
    ours = {o.domain or "": o.version for o in model.opset_import}
    for domain, version in b.opsets.items():
        if ours.get(domain, version) != version:
            raise ValueError(f"head opset {domain or 'ai.onnx'} {version} != the model's "
                             f"{ours[domain]}")
    out = onnx.ModelProto()
    out.CopyFrom(model)
    g = out.graph
    del g.output[1:]
    g.node.extend(b.nodes)
    g.initializer.extend(b.initializers)
    have = {i.name for i in g.input}
    g.input.extend(vi for vi in b.inputs if vi.name not in have)
    g.output.append(b.output)
    out.opset_import.extend(helper.make_opsetid(d, v) for d, v in b.opsets.items()
                            if d not in ours)
    onnx.checker.check_model(out)
    return out


def head_gemm(head: onnx.ModelProto) -> onnx.NodeProto:
    """The linear layer of a ramp head (its one Gemm); ValueError if it has none or several."""
    gemms = [n for n in head.graph.node if n.op_type == "Gemm"]
    if len(gemms) != 1:
        raise ValueError(f"a ramp head must hold one Gemm, {head.graph.name!r} holds {len(gemms)}")
    return gemms[0]


def head_pooling(head: onnx.ModelProto) -> onnx.ModelProto:
    """``head`` up to its linear layer: the nodes computing the Gemm's input (the pooled
    features, its one output), the weights and the inputs they read. No nodes when the Gemm
    reads the site itself (an N×C activation)."""
    want = head_gemm(head).input[0]
    nodes = list(head.graph.node)
    producer = {o: i for i, n in enumerate(nodes) for o in n.output if o}
    picked: set[int] = set()
    stack = [want]
    while stack:
        i = producer.get(stack.pop())
        if i is not None and i not in picked:
            picked.add(i)
            stack.extend(nodes[i].input)
    kept = [nodes[i] for i in sorted(picked)]
    used = {x for n in kept for x in n.input} | {want}
    inputs = [head.graph.input[0], *(vi for vi in head.graph.input[1:] if vi.name in used)]
    graph = helper.make_graph(
        kept, f"{head.graph.name}_pooling", inputs,
        [helper.make_tensor_value_info(want, onnx.TensorProto.FLOAT, None)],
        initializer=[t for t in head.graph.initializer if t.name in used])
    out = helper.make_model(graph, opset_imports=list(head.opset_import))
    out.ir_version = head.ir_version
    return out


def features_name(head: onnx.ModelProto, prefix: str, site: str) -> str:
    """The tensor that ``head`` bound by ``bind_head(head, prefix, site)`` (or its
    ``head_pooling``) feeds its linear layer: the ramp's pooled features in that graph."""
    want = head_gemm(head).input[0]
    if want == head.graph.input[0].name:
        return site
    if any(vi.name == want for vi in head.graph.input[1:]):
        return want
    return prefix + want

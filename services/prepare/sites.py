"""Ramp-site analysis for arbitrary ONNX classifiers (paper §3.1: ramps at cut vertices).

A tensor ``T`` produced by the node at position ``i`` of the topologically sorted graph
is a feasible ramp site iff every value flowing from nodes at positions <= i to nodes at
positions > i is ``T`` itself: no edge starts before the ramp and re-enters after it.
A ramp there sees everything the rest of the model will see, and the model can be split
there into stages that pass exactly one activation. So residual networks get sites
between blocks (never inside one) and chain networks such as VGG after every layer.

"Free" tensors never count as live, because any stage can obtain them on its own:

- initializers, ``Constant`` outputs and anything computed from constants only;
- graph inputs: every stage may receive the original request inputs (BERT's
  ``attention_mask`` is consumed by every layer, which would otherwise leave no cut
  vertex inside the layer stack);
- outputs of cheap ops (``LIGHT_OPS``: shape, cast, compare, elementwise, gather, ...)
  whose inputs are all free, e.g. the extended attention mask that HF BERT computes
  once from ``attention_mask`` and adds in every layer. ``onnx_blocks.split_blocks``
  recomputes such nodes in every block that consumes them.

A consequence of the graph-input choice: a skip connection straight from a raw graph
input does not block a site (the later stage re-reads the input), which is what makes
the mask case work and is harmless for image models, whose input feeds only the stem.

The sweep is O(nodes + edges): each non-free tensor enters the live set at its producer
and leaves it at its last consumer; a site is where the live set is exactly ``{T}``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

import onnx

from services.runtime.onnx_graph import (
    COMPUTE_OPS,
    LIVE_HEAD_SHOWN,
    GraphIndex,
    index_graph,
    infer,
    value_infos,
)

Layout = Literal["nchw", "nsh", "nf"]
_LAYOUTS: dict[int, Layout] = {4: "nchw", 3: "nsh", 2: "nf"}
_FLOATS = {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16,
           onnx.TensorProto.DOUBLE}

# Ops that finish a layer: with one_per_layer a site feeding one of them is folded into it.
TAIL_OPS = frozenset({
    "Relu", "LeakyRelu", "PRelu", "Sigmoid", "HardSigmoid", "HardSwish", "Tanh", "Elu", "Selu",
    "Celu", "Gelu", "Softplus", "Softsign", "Mish", "Clip", "Erf", "BatchNormalization",
    "InstanceNormalization", "LayerNormalization", "GroupNormalization", "Dropout", "Identity",
    "MaxPool", "AveragePool", "LpPool", "Add", "Sub", "Mul", "Div",
})
# Re-layouts (and padding): a site that only reshapes the previous site adds nothing.
LAYOUT_OPS = frozenset({"Flatten", "Reshape", "Squeeze", "Unsqueeze", "Transpose", "Identity",
                        "Pad"})


@dataclass(frozen=True)
class Site:
    """A tensor a ramp can read and the model can be split at."""

    tensor: str
    index: int  # position of its producer in the topologically sorted node list
    layout: Layout
    shape: tuple[int, ...]  # -1 for dynamic dims
    op: str = ""


@dataclass(frozen=True)
class Rejection:
    tensor: str
    index: int
    reason: str


@dataclass(frozen=True)
class _Tensor:
    index: int
    op: str
    shape: tuple[int, ...] | None  # None: unknown rank
    elem_type: int


@dataclass
class SiteReport:
    sites: list[Site]
    rejected: list[Rejection]
    n_nodes: int = 0
    # every non-constant node output, for select_sites(add=...)
    tensors: dict[str, _Tensor] = field(default_factory=dict, repr=False, compare=False)

    def summary(self) -> str:
        """One line per candidate tensor in execution order: its site ordinal or why not."""
        rows = [(s.index, s.op, s.tensor, s.layout, _fmt(s.shape), f"site {k}")
                for k, s in enumerate(self.sites)]
        for r in self.rejected:
            t = self.tensors.get(r.tensor)
            rows.append((r.index, t.op if t else "", r.tensor, "", "", r.reason))
        rows.sort(key=lambda row: row[0])
        head = ("node", "op", "tensor", "layout", "shape", "site / reason")
        w = [max(len(str(x)) for x in col) for col in zip(head, *rows, strict=True)]
        w[2], w[4] = min(w[2], 48), min(w[4], 24)
        lines = [f"{len(self.sites)} sites, {len(self.rejected)} rejected, {self.n_nodes} nodes"]
        for row in (head, *rows):
            cells = [str(x).ljust(w[j]) for j, x in enumerate(row[:5])]
            lines.append("  ".join([*cells, str(row[5])]).rstrip())
        return "\n".join(lines)


def _fmt(shape: tuple[int, ...]) -> str:
    return "x".join("?" if d < 0 else str(d) for d in shape)


def _tensor_type(vi: onnx.ValueInfoProto | None) -> tuple[tuple[int, ...] | None, int]:
    if vi is None or not vi.type.HasField("tensor_type"):
        return None, 0
    tt = vi.type.tensor_type
    if not tt.HasField("shape"):
        return None, tt.elem_type
    dims = tuple(d.dim_value if d.HasField("dim_value") else -1 for d in tt.shape.dim)
    return dims, tt.elem_type


def _live_reason(gi: GraphIndex, i: int, name: str) -> str:
    count = gi.live_count[i]
    others = [x for x in gi.live_head[i] if x != name][:LIVE_HEAD_SHOWN]
    more = count - 1 - len(others)
    shown = ", ".join([name, *others]) + (f", +{more} more" if more > 0 else "")
    return f"inside a skip connection: {count} live tensors ({shown})"


def _head_reason(gi: GraphIndex, i: int) -> str | None:
    """Why only the classifier head follows node i, or None if real compute remains."""
    if gi.computes_after[i] > 1:
        return None
    ops: list[str] = []
    j, scanned = gi.next_busy[i], 0
    while j < len(gi.nodes) and len(ops) <= 5 and scanned < 100:  # bounded: O(1) per site
        if gi.nodes[j].op_type not in ops:
            ops.append(gi.nodes[j].op_type)
        j, scanned = gi.next_busy[j], scanned + 1
    more = len(ops) > 5 or j < len(gi.nodes)
    shown = ", ".join(ops[:5]) + (", ..." if more else "")
    return f"only the head remains ({shown})" if ops else "nothing remains"


def find_sites(model: onnx.ModelProto, one_per_layer: bool = True) -> SiteReport:
    """Feasible ramp sites of ``model`` (cut vertices with a poolable activation).

    Rejected: tensors inside skip connections, graph outputs, non-float tensors, unknown
    shapes, ranks other than 4 (N,C,H,W), 3 (N,S,H) or 2 (N,F) since a ramp must pool
    them to N x features, sites followed by at most one compute op (a ramp there would
    just duplicate the classifier) and sites preceded by none (input padding and such).

    With ``one_per_layer`` runs of sites are thinned to one per layer: a site whose next
    node is a layer-tail op (activation, norm, pooling, bias add) that consumes it and is
    itself a site is folded into that one (Conv->BN->Relu->MaxPool yields the MaxPool
    output), and a site that only re-layouts or pads the previous site (Flatten, Reshape,
    Pad, ...) is dropped. Dropped sites are listed in ``rejected`` with the reason.
    """
    inferred = infer(model)
    gi = index_graph(inferred)
    vis = value_infos(inferred)
    outputs = set(gi.graph_outputs)
    tensors: dict[str, _Tensor] = {}
    rejected: list[Rejection] = []
    feasible: list[Site] = []
    computes = 0  # compute ops at or before node i
    for i, n in enumerate(gi.nodes):
        if gi.free[i]:
            continue
        computes += n.op_type in COMPUTE_OPS
        for o in n.output:
            if not o:
                continue
            shape, elem = _tensor_type(vis.get(o))
            tensors[o] = _Tensor(i, n.op_type, shape, elem)
            if gi.last_use.get(o, -1) <= i:
                continue  # dead output: nothing downstream reads it
            reason = _reject_reason(gi, i, o, shape, elem, outputs)
            if reason is None and not computes:
                reason = "no compute op before it (input preprocessing)"
            if reason:
                rejected.append(Rejection(o, i, reason))
            else:
                assert shape is not None
                feasible.append(Site(o, i, _LAYOUTS[len(shape)], shape, n.op_type))
    sites = _one_per_layer(gi, feasible, rejected) if one_per_layer else feasible
    rejected.sort(key=lambda r: r.index)
    return SiteReport(sites, rejected, len(gi.nodes), tensors)


def _reject_reason(gi: GraphIndex, i: int, name: str, shape: tuple[int, ...] | None,
                   elem: int, outputs: set[str]) -> str | None:
    if name in outputs:
        return "graph output"
    if gi.live_count[i] != 1:
        return _live_reason(gi, i, name)
    if shape is None:
        return "unknown shape"
    if elem not in _FLOATS:
        return f"non-float tensor ({onnx.TensorProto.DataType.Name(elem)})"
    if len(shape) not in _LAYOUTS:
        return f"rank {len(shape)} activation: a ramp pools only N,C,H,W / N,S,H / N,F"
    return _head_reason(gi, i)


def _one_per_layer(gi: GraphIndex, feasible: list[Site], rejected: list[Rejection]) -> list[Site]:
    names = {s.tensor for s in feasible}
    kept: list[Site] = []
    for s in feasible:
        j = gi.next_busy[s.index]
        nxt = gi.nodes[j] if j < len(gi.nodes) else None
        node = gi.nodes[s.index]
        if (nxt is not None and nxt.op_type in TAIL_OPS and s.tensor in gi.node_inputs[j]
                and nxt.output[0] in names):
            rejected.append(Rejection(s.tensor, s.index, f"same layer as {nxt.output[0]}"))
        elif node.op_type in LAYOUT_OPS and node.input[0] in names:
            rejected.append(Rejection(s.tensor, s.index, f"re-layout of {node.input[0]}"))
        else:
            kept.append(s)
    return kept


def select_sites(report: SiteReport, keep: list[str | int] | None = None,
                 add: list[str] | None = None) -> list[Site]:
    """Restrict ``report.sites`` (by tensor name or site ordinal) and/or force extra sites.

    A forced tensor need not be a cut vertex (a ramp may read it), but it must be a
    non-constant node output of rank 2-4; ``split_blocks`` only splits at cut vertices.
    """
    by_name = {s.tensor: s for s in report.sites}
    why = {r.tensor: r.reason for r in report.rejected}
    chosen: dict[str, Site] = {}
    for k in report.sites if keep is None else keep:
        if isinstance(k, Site):
            k = k.tensor
        if isinstance(k, int):
            if not 0 <= k < len(report.sites):
                raise ValueError(f"site ordinal {k} out of range: {len(report.sites)} sites")
            s = report.sites[k]
        elif k in by_name:
            s = by_name[k]
        elif k in why:
            raise ValueError(f"{k!r} is not a feasible site ({why[k]}); force it with add=")
        else:
            raise ValueError(f"unknown site {k!r}: not a candidate tensor of this model")
        chosen[s.tensor] = s
    for name in add or []:
        t = report.tensors.get(name)
        if t is None:
            raise ValueError(f"unknown tensor {name!r}: no non-constant node produces it")
        if t.shape is None or len(t.shape) not in _LAYOUTS:
            raise ValueError(f"tensor {name!r} cannot host a ramp: shape {t.shape}")
        chosen.setdefault(name, Site(name, t.index, _LAYOUTS[len(t.shape)], t.shape, t.op))
    return sorted(chosen.values(), key=lambda s: s.index)


def thin_sites(sites: list[Site], max_sites: int, cheapest: bool = False) -> list[Site]:
    """An evenly spaced subset of at most ``max_sites`` sites, by ordinal among feasible
    sites (paper §3.1: "ramps are uniformly spaced across feasible positions").

    Picks the sites nearest the centres of ``max_sites`` equal slices of the list, so
    neither end is favoured. With ``cheapest``, each slice instead contributes its site
    with the fewest channels (ties: the later one): a pool + fc ramp costs in proportion
    to its input width, and e.g. EfficientNet's narrow block outputs are 6x thinner than
    the expanded activations inside a block, at the same depth.
    """
    if max_sites < 0:
        raise ValueError(f"max_sites must be >= 0, got {max_sites}")
    ordered = sorted(sites, key=lambda s: s.index)
    n = len(ordered)
    if n <= max_sites:
        return ordered
    if not cheapest:
        return [ordered[math.floor((j + 0.5) * n / max_sites)] for j in range(max_sites)]
    picks = []
    for j in range(max_sites):
        part = ordered[math.floor(j * n / max_sites):math.floor((j + 1) * n / max_sites)]
        picks.append(min(reversed(part), key=_width))
    return picks


def _width(site: Site) -> float:
    """Channels (N x C x H x W), hidden size (N x S x H) or features (N x F); unknown = inf."""
    dim = site.shape[2] if site.layout == "nsh" else site.shape[1]
    return float("inf") if dim < 0 else dim

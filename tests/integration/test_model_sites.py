"""Ramp-site analysis on small exported torch models with known block structure.

Sites are checked by counting the Conv / MatMul nodes that precede them: a site between
blocks has exactly the convs of the finished blocks before it, so any site inside a
block would show up as an unexpected count.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import onnx
import pytest
import torch
from torch import nn

from services.prepare.export import to_onnx
from services.prepare.sites import Site, find_sites, select_sites, thin_sites


class _Res(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int = 1):
        super().__init__()
        self.c1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.b1 = nn.BatchNorm2d(cout)
        self.c2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.b2 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                      nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.b2(self.c2(torch.relu(self.b1(self.c1(x)))))
        return torch.relu(y + (x if self.down is None else self.down(x)))


class ResNetish(nn.Module):
    """Stem, identity block, downsample block (1x1 conv skip), 2 identity blocks, head."""

    CONVS_AT_SITES = (1, 3, 6, 8)  # stem, +2, +3 (downsample), +2; the last block is head

    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, 1, 1), nn.BatchNorm2d(8), nn.ReLU())
        self.blocks = nn.Sequential(_Res(8, 8), _Res(8, 16, 2), _Res(16, 16), _Res(16, 16))
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(16, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.pool(self.blocks(self.stem(x))).flatten(1))


class VGGish(nn.Module):
    CONVS_AT_SITES = (1, 2, 3)

    def __init__(self):
        super().__init__()
        # explicit padding (as TF-style "same" exports have) around the first two convs
        self.features = nn.Sequential(
            nn.ZeroPad2d(1), nn.Conv2d(3, 8, 3), nn.ReLU(),
            nn.ZeroPad2d(1), nn.Conv2d(8, 8, 3), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        )
        self.classifier = nn.Sequential(nn.Linear(16 * 4 * 4, 32), nn.ReLU(), nn.Linear(32, 5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.features(x), 1))


class _Layer(nn.Module):
    def __init__(self, d: int):
        super().__init__()
        self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.ff1, self.ff2 = nn.Linear(d, 2 * d), nn.Linear(2 * d, d)

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        scores = self.q(x) @ self.k(x).transpose(1, 2) / math.sqrt(x.shape[-1]) + bias
        x = self.ln1(x + self.o(scores.softmax(-1) @ self.v(x)))
        return self.ln2(x + self.ff2(torch.relu(self.ff1(x))))


class TinyBert(nn.Module):
    """Post-LN encoder; the additive mask bias is computed once and read by every layer.

    Each layer is two residual sub-blocks (attention: q, k, v, qk, attn@v, o = 6 MatMuls;
    feed-forward: 2 MatMuls), so after each sub-block's LayerNorm the stream is a cut vertex.
    """

    LAYERS = 3
    MATMULS_AT_SITES = (6, 8, 14, 16, 22)  # after every sub-block but the last

    def __init__(self, vocab: int = 50, d: int = 16, seq: int = 8):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.randn(seq, d) * 0.1)
        self.ln = nn.LayerNorm(d)
        self.layers = nn.ModuleList(_Layer(d) for _ in range(self.LAYERS))
        self.fc = nn.Linear(d, 4)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        bias = (1.0 - mask[:, None, :].float()) * -1e4
        x = self.ln(self.emb(ids) + self.pos[: ids.shape[1]])
        for layer in self.layers:
            x = layer(x, bias)
        return self.fc(x[:, 0])


def _seeded(cls: type[nn.Module]) -> nn.Module:
    torch.manual_seed(0)
    m = cls()
    for mod in m.modules():  # non-trivial BN statistics, so folding errors would show
        if isinstance(mod, nn.BatchNorm2d):
            mod.running_mean.uniform_(-0.5, 0.5)
            mod.running_var.uniform_(0.5, 1.5)
    return m.eval()


@functools.cache
def resnet_onnx() -> onnx.ModelProto:
    return onnx.load_from_string(
        to_onnx(_seeded(ResNetish), (torch.randn(1, 3, 16, 16),), ["x"], ["logits"]))


@functools.cache
def vgg_onnx() -> onnx.ModelProto:
    return onnx.load_from_string(
        to_onnx(_seeded(VGGish), (torch.randn(1, 3, 16, 16),), ["x"], ["logits"]))


@functools.cache
def bert_onnx() -> onnx.ModelProto:
    ids, mask = torch.randint(0, 50, (1, 8)), torch.ones(1, 8, dtype=torch.int64)
    return onnx.load_from_string(
        to_onnx(_seeded(TinyBert), (ids, mask), ["ids", "mask"], ["logits"]))


def image_feeds(batch: int) -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(batch).standard_normal((batch, 3, 16, 16), np.float32)}


def bert_feeds(batch: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(batch)
    mask = np.ones((batch, 8), np.int64)
    mask[:, 5:] = rng.integers(0, 2, (batch, 3))
    return {"ids": rng.integers(0, 50, (batch, 8)).astype(np.int64), "mask": mask}


def _ops_before(model: onnx.ModelProto, site: Site, op: str) -> int:
    return sum(n.op_type == op for n in list(model.graph.node)[: site.index + 1])


def test_resnet_sites_are_exactly_block_boundaries():
    m = resnet_onnx()
    report = find_sites(m)
    assert [_ops_before(m, s, "Conv") for s in report.sites] == list(ResNetish.CONVS_AT_SITES)
    assert all(s.layout == "nchw" and s.shape[0] == -1 for s in report.sites)
    assert [s.shape[1:] for s in report.sites] == [(8, 16, 16), (8, 16, 16), (16, 8, 8),
                                                   (16, 8, 8)]
    # Every conv output sits inside a block (its skip input is live), except the stem's.
    conv_outs = {n.output[0] for n in m.graph.node if n.op_type == "Conv"}
    reasons = {r.tensor: r.reason for r in report.rejected}
    inside = [t for t in conv_outs if reasons.get(t, "").startswith("inside a skip connection")]
    assert len(inside) == len(conv_outs) - 1
    # The last block's output only feeds pool + fc: no ramp there.
    last_relu = [n for n in m.graph.node if n.op_type == "Relu"][-1].output[0]
    assert reasons[last_relu].startswith("only the head remains")


def test_resnet_skip_reason_names_the_live_tensors():
    m = resnet_onnx()
    report = find_sites(m)
    first_block_conv = [n for n in m.graph.node if n.op_type == "Conv"][1].output[0]
    reason = {r.tensor: r.reason for r in report.rejected}[first_block_conv]
    assert reason == (f"inside a skip connection: 2 live tensors "
                      f"({first_block_conv}, {report.sites[0].tensor})")


def test_chain_cnn_has_one_site_per_conv_layer():
    m = vgg_onnx()
    report = find_sites(m)
    assert [_ops_before(m, s, "Conv") for s in report.sites] == list(VGGish.CONVS_AT_SITES)
    assert [s.op for s in report.sites] == ["Relu", "MaxPool", "MaxPool"]
    assert not any("skip" in r.reason for r in report.rejected)
    reasons = {r.reason.split(" ")[0] for r in report.rejected}
    assert reasons == {"no", "same", "re-layout", "only", "graph"}
    pad_in, pad_mid = (n.output[0] for n in m.graph.node if n.op_type == "Pad")
    why = {r.tensor: r.reason for r in report.rejected}
    assert why[pad_in] == "no compute op before it (input preprocessing)"
    assert why[pad_mid] == f"re-layout of {report.sites[0].tensor}"
    # Without thinning every layer output is a site, conv outputs included.
    every = find_sites(m, one_per_layer=False).sites
    assert [s.op for s in every] == ["Conv", "Relu", "Pad", "Conv", "Relu", "MaxPool", "Conv",
                                     "Relu", "MaxPool", "Flatten"]


def test_transformer_with_mask_has_sites_between_layers():
    m = bert_onnx()
    assert [i.name for i in m.graph.input] == ["ids", "mask"]
    report = find_sites(m)
    # The mask bias is read by every layer but derives from a graph input: not live.
    assert [_ops_before(m, s, "MatMul") for s in report.sites] == list(TinyBert.MATMULS_AT_SITES)
    assert all(s.op == "LayerNormalization" and s.layout == "nsh" for s in report.sites)
    assert all(s.shape == (-1, 8, 16) for s in report.sites)
    # the embeddings' LayerNorm is a cut vertex too, but no compute precedes it
    emb = next(n.output[0] for n in m.graph.node if n.op_type == "LayerNormalization")
    assert {r.tensor: r.reason for r in report.rejected}[emb].startswith("no compute op")


def test_select_sites_by_name_and_ordinal():
    report = find_sites(resnet_onnx())
    s = report.sites
    assert select_sites(report) == s
    assert select_sites(report, keep=[2, s[0].tensor]) == [s[0], s[2]]
    inner = next(r for r in report.rejected if "skip" in r.reason)
    forced = select_sites(report, keep=[1], add=[inner.tensor])
    assert [x.tensor for x in forced] == sorted([s[1].tensor, inner.tensor],
                                                key=lambda t: report.tensors[t].index)


@pytest.mark.parametrize(("kw", "match"), [
    ({"keep": ["nope"]}, "unknown site 'nope'"),
    ({"keep": [99]}, "site ordinal 99 out of range"),
    ({"add": ["nope"]}, "unknown tensor 'nope'"),
])
def test_select_sites_rejects_unknown(kw, match):
    with pytest.raises(ValueError, match=match):
        select_sites(find_sites(resnet_onnx()), **kw)


def test_select_sites_rejects_infeasible_keep_with_reason():
    report = find_sites(resnet_onnx())
    inner = next(r for r in report.rejected if "skip" in r.reason)
    with pytest.raises(ValueError, match="not a feasible site .inside a skip connection"):
        select_sites(report, keep=[inner.tensor])


def test_summary_lists_sites_and_rejections():
    report = find_sites(resnet_onnx())
    text = report.summary()
    lines = text.splitlines()
    assert lines[0].startswith(f"{len(report.sites)} sites, {len(report.rejected)} rejected")
    assert len(lines) == 2 + len(report.sites) + len(report.rejected)
    assert "site 3" in text and "inside a skip connection: 2 live tensors" in text
    assert "only the head remains" in text and "same layer as" in text


def test_thin_sites_even_spacing():
    sites = [Site(f"t{i}", i, "nf", (-1, 4)) for i in range(10)]
    assert [s.index for s in thin_sites(sites, 3)] == [1, 5, 8]
    assert [s.index for s in thin_sites(sites, 1)] == [5]
    assert thin_sites(sites, 20) == sites
    assert thin_sites(sites, 0) == []
    with pytest.raises(ValueError):
        thin_sites(sites, -1)


def test_unsorted_nodes_are_sorted_first():
    m = onnx.ModelProto()
    m.CopyFrom(vgg_onnx())
    nodes = list(m.graph.node)
    del m.graph.node[:]
    m.graph.node.extend(reversed(nodes))
    assert [s.op for s in find_sites(m).sites] == ["Relu", "MaxPool", "MaxPool"]

"""Blocks split at ramp sites, chained or assembled into stages, equal the unsplit model."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from services.prepare.sites import find_sites
from services.runtime.onnx_blocks import add_outputs, assemble, split_blocks
from tests.integration.test_model_sites import (
    bert_feeds,
    bert_onnx,
    image_feeds,
    resnet_onnx,
    vgg_onnx,
)

CASES = {
    "resnet": (resnet_onnx, image_feeds),
    "vgg": (vgg_onnx, image_feeds),
    "bert": (bert_onnx, bert_feeds),
}


def _session(model: onnx.ModelProto) -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), opts,
                                providers=["CPUExecutionProvider"])


def _run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    sess = _session(model)
    names = {i.name for i in sess.get_inputs()}
    return sess.run(None, {k: v for k, v in feeds.items() if k in names})


def _chain(blocks: list[onnx.ModelProto], feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """Run blocks one after the other; returns each block's first output."""
    outs: list[np.ndarray] = []
    env = dict(feeds)
    for b in blocks:
        (out,) = _run(b, env)[:1]
        env[b.graph.output[0].name] = out
        outs.append(out)
    return outs


@pytest.fixture(scope="module", params=list(CASES))
def case(request):
    build, feeds = CASES[request.param]
    model = build()
    sites = [s.tensor for s in find_sites(model).sites]
    return model, sites, split_blocks(model, sites), feeds


def test_block_interfaces(case):
    model, sites, blocks, _ = case
    graph_inputs = [i.name for i in model.graph.input]
    assert len(blocks) == len(sites) + 1
    for k, b in enumerate(blocks):
        ins = [i.name for i in b.graph.input]
        outs = [o.name for o in b.graph.output]
        assert ins[0] == (graph_inputs[0] if k == 0 else sites[k - 1])
        assert set(ins[1:]) <= set(graph_inputs)
        assert outs == ([o.name for o in model.graph.output] if k == len(sites) else [sites[k]])
        # the batch axis stays dynamic on every boundary
        for vi in [*b.graph.input, *b.graph.output]:
            assert not vi.type.tensor_type.shape.dim[0].HasField("dim_value"), vi.name
        assert list(b.opset_import) == list(model.opset_import)
    # initializers are kept only where used, and none is lost
    for b in blocks:
        used = {x for n in b.graph.node for x in n.input}
        assert {t.name for t in b.graph.initializer} <= used
    kept = {t.name for b in blocks for t in b.graph.initializer}
    assert kept == {t.name for t in model.graph.initializer}


@pytest.mark.parametrize("batch", [1, 3])
def test_chained_blocks_and_stages_match_full_model(case, batch):
    model, sites, blocks, make_feeds = case
    feeds = make_feeds(batch)
    (want,) = _run(model, feeds)
    chained = _chain(blocks, feeds)
    np.testing.assert_allclose(chained[-1], want, atol=1e-4, rtol=1e-4)
    # stage = blocks 1..2 (inclusive), fed the site-0 activation; then the rest
    stage = assemble(blocks, 1, 3)
    assert stage.graph.input[0].name == sites[0]
    (mid,) = _run(stage, {**feeds, sites[0]: chained[0]})
    np.testing.assert_allclose(mid, chained[2], atol=1e-4, rtol=1e-4)
    rest = assemble(blocks, 3, len(blocks))
    (out,) = _run(rest, {**feeds, sites[2]: mid})
    np.testing.assert_allclose(out, want, atol=1e-4, rtol=1e-4)
    (whole,) = _run(assemble(blocks, 0, len(blocks)), feeds)
    np.testing.assert_allclose(whole, want, atol=1e-4, rtol=1e-4)


def test_add_outputs_returns_site_activations(case):
    model, sites, blocks, make_feeds = case
    feeds = make_feeds(3)
    chained = _chain(blocks, feeds)
    probe = add_outputs(model, sites)
    assert [o.name for o in probe.graph.output] == [model.graph.output[0].name, *sites]
    assert len(model.graph.output) == 1  # the input model is untouched
    got = _run(probe, feeds)
    np.testing.assert_allclose(got[0], chained[-1], atol=1e-4, rtol=1e-4)
    for act, want in zip(got[1:], chained[:-1], strict=True):
        assert act.shape == want.shape and act.shape[0] == 3
        np.testing.assert_allclose(act, want, atol=1e-5, rtol=1e-5)


def test_mask_bias_is_recomputed_per_block():
    model = bert_onnx()
    blocks = split_blocks(model, [s.tensor for s in find_sites(model).sites])
    attention = [b for b in blocks if any(n.op_type == "Softmax" for n in b.graph.node)]
    assert len(attention) == 3  # layer sub-blocks alternate attention / feed-forward
    for b in blocks:
        reads_mask = "mask" in {i.name for i in b.graph.input}
        assert reads_mask == (b in attention)
        assert reads_mask == any(n.op_type == "Cast" for n in b.graph.node)


def test_split_rejects_bad_sites():
    model = resnet_onnx()
    report = find_sites(model)
    inner = next(r.tensor for r in report.rejected if "skip" in r.reason)
    with pytest.raises(ValueError, match="not a cut vertex"):
        split_blocks(model, [inner])
    with pytest.raises(ValueError, match="unknown site"):
        split_blocks(model, ["nope"])
    s = [x.tensor for x in report.sites]
    with pytest.raises(ValueError, match="execution order"):
        split_blocks(model, [s[1], s[0]])
    with pytest.raises(ValueError, match="unknown tensor"):
        add_outputs(model, ["nope"])
    with pytest.raises(ValueError, match="bad block range"):
        assemble(split_blocks(model, s), 2, 2)

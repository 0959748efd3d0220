"""chain-cnn: the project-trained VGG-style chain CNN and its offline photo-crop data.

The full model comes from the default cache (``$OFFRAMP_HOME/cache``): the first run
ever trains it (~2-2.5 min on one thread of a busy 2-core box), later runs load it in well
under a second.
Determinism of training itself is checked on a few-step recipe in a tmp cache.
"""

from __future__ import annotations

import io
import warnings
from dataclasses import replace

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from services.prepare.sites import find_sites
from services.zoo import chain_cnn as cc

SHORT = replace(cc.RECIPE, steps=4, batch=16)  # same code path, a second of work


@pytest.fixture(scope="module")
def model() -> cc.ChainCNN:
    return cc.build_model()


@pytest.fixture(scope="module")
def onnx_bytes(model) -> bytes:
    buf = io.BytesIO()
    x = torch.from_numpy(cc.sample_inputs(4)["image"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (x,), buf, input_names=["image"], output_names=["logits"],
                          dynamic_axes={"image": {0: "batch"}, "logits": {0: "batch"}},
                          opset_version=17, dynamo=False)
    return buf.getvalue()


def _same(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_model_is_frozen_eval_and_maps_images_to_logits(model):
    assert not model.training and not any(p.requires_grad for p in model.parameters())
    x = torch.from_numpy(cc.sample_inputs(5)["image"])
    assert model(x).shape == (5, cc.CLASSES)
    convs = [m for m in model.modules() if isinstance(m, torch.nn.Conv2d)]
    assert len(convs) == cc.CONV_LAYERS == 8
    assert not any(isinstance(m, torch.nn.BatchNorm2d) and m.training for m in model.modules())


def _no_training(recipe):
    raise AssertionError("trained again: the cached weights were not used")


def test_training_is_deterministic_and_cached(tmp_path, monkeypatch):
    a, b = cc.train(SHORT), cc.train(SHORT)
    assert _same(a, b)
    built = cc.build_model(tmp_path, SHORT)
    path = cc.cache_path(tmp_path, SHORT)
    assert path.exists() and _same(built, a)
    monkeypatch.setattr(cc, "train", _no_training)
    assert _same(cc.build_model(tmp_path, SHORT), a)
    # a different recipe is a different file
    assert cc.cache_path(tmp_path, replace(SHORT, seed=1)) != path


def test_a_warm_build_loads_the_cached_weights(model, monkeypatch):
    monkeypatch.setattr(cc, "train", _no_training)
    assert _same(cc.build_model(), model)


def test_held_out_accuracy_is_far_above_chance(model):
    acc = cc.accuracy(model, n=1000, seed=1)
    assert acc > 0.7, acc  # chance is 0.1; ~0.86-0.9 measured


def test_onnx_export_matches_torch(model, onnx_bytes):
    sess = ort.InferenceSession(onnx_bytes, providers=["CPUExecutionProvider"])
    x = cc.sample_inputs(33, seed=2)["image"]
    got = sess.run(None, {"image": x})[0]
    with torch.no_grad():
        ref = model(torch.from_numpy(x)).numpy()
    assert got.shape == (33, cc.CLASSES)
    assert np.abs(got - ref).max() < 1e-4


def test_find_sites_after_every_conv_layer_but_the_last(onnx_bytes):
    m = onnx.load_from_string(onnx_bytes)
    nodes = list(m.graph.node)
    assert not any(n.op_type == "BatchNormalization" for n in nodes)  # folded into Conv
    report = find_sites(m)
    pos = {o: i for i, n in enumerate(nodes) for o in n.output}
    convs_before = [sum(n.op_type == "Conv" for n in nodes[: pos[s.tensor]])
                    for s in report.sites]
    # One site per conv layer (its Relu, or the MaxPool that ends the layer); the last
    # conv layer gets none: only GAP + fc follow it, and a ramp there would merely
    # duplicate the classifier ("only the head remains").
    assert convs_before == list(range(1, cc.CONV_LAYERS))
    assert [s.op for s in report.sites] == ["MaxPool", "MaxPool", "Relu", "MaxPool", "Relu",
                                            "MaxPool", "Relu"]
    # Each site carries its conv layer's width at that layer's (pooled) resolution.
    w = [v for v in cc.LAYERS if isinstance(v, int)]
    assert [s.shape[1:] for s in report.sites] == [(w[0], 16, 16), (w[1], 8, 8), (w[2], 8, 8),
                                                   (w[3], 4, 4), (w[4], 4, 4), (w[5], 2, 2),
                                                   (w[6], 2, 2)]
    last_relu = [n for n in nodes if n.op_type == "Relu"][-1].output[0]
    why = {r.tensor: r.reason for r in report.rejected}
    assert why[last_relu].startswith("only the head remains")
    assert not any("skip" in r for r in why.values())


def test_sample_inputs_are_a_deterministic_held_out_stream_with_runs():
    a = cc.sample_inputs(300, seed=3)["image"]
    assert a.shape == (300, *cc.IMAGE_SHAPE) and a.dtype == np.float32
    assert np.array_equal(a, cc.sample_inputs(300, seed=3)["image"])
    assert np.array_equal(a[:100], cc.sample_inputs(100, seed=3)["image"])  # prefix-stable
    assert not np.array_equal(a, cc.sample_inputs(300, seed=4)["image"])
    assert a.min() >= -1.0 and a.max() <= 1.0
    assert cc.sample_inputs(0)["image"].shape == (0, *cc.IMAGE_SHAPE)
    x, y = cc.sample_stream(2000, seed=3)
    assert np.array_equal(x[:300], a)
    assert (y[1:] == y[:-1]).mean() > 0.9  # runs of one class
    assert len(np.unique(y)) == cc.CLASSES
    views = cc.stream_views(2000, seed=3)
    assert cc.cells().held[views.cell].all()  # only cells never trained on


def test_bootstrap_chunks_training_cells_with_cell_groups():
    chunks = list(cc.bootstrap(300, seed=5))
    assert [len(g) for _, g in chunks] == [128, 128, 44]
    x = np.concatenate([c["image"] for c, _ in chunks])
    groups = np.concatenate([g for _, g in chunks])
    assert x.shape == (300, *cc.IMAGE_SHAPE) and x.dtype == np.float32
    cs = cc.cells()
    assert not cs.held[groups].any()  # training cells only: streams stay unseen
    assert len(np.unique(cs.photo[groups])) == cc.CLASSES
    again = np.concatenate([c["image"] for c, _ in cc.bootstrap(300, seed=5)])
    assert np.array_equal(x, again)


def test_cells_hold_out_a_quarter_of_every_photo():
    cs = cc.cells()
    for k in range(cc.CLASSES):
        mine = cs.photo == k
        assert 0 < cs.held[mine].sum() < mine.sum()
    assert abs(cs.held.mean() - cc.HELD_OUT) < 0.05

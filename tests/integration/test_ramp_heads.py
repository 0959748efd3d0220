"""Ramp heads as numbers and as files (services.runtime.ramp_heads): a refitted head is
served as the prepared head's graph with new weights."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from services.exits.linear_head import LinearHead
from services.runtime.manifest import Manifest
from services.runtime.pooling import pool_np
from services.runtime.ramp_heads import head_file_name, load_head, save_head
from services.runtime.stage import StageRuntime
from services.zoo.registry import sample_inputs


@pytest.mark.parametrize("model", ["efficientnet-lite0", "minilm-topics"])
def test_numpy_heads_give_onnx_runtimes_logits(zoo_dir, model):
    d = zoo_dir / model
    m = Manifest.load(d)
    rt = StageRuntime(d, m, 0, m.num_blocks, device="cpu")
    x = sample_inputs(model, 3, seed=1)
    act = x
    for i in range(m.num_blocks):
        act = rt.run_block(i, act, x)
        for r in (r for r in m.ramps if r.after_block == i):
            head = load_head(d, r)
            feats = pool_np(act, head.pool, x[r.inputs[0]] if r.inputs else None)
            assert np.abs(head.logits(feats) - rt.run_ramp(r.index, act, x)).max() < 1e-3


def test_a_saved_head_is_the_prepared_graph_with_new_weights(tmp_path, tiny_dir):
    m = Manifest.load(tiny_dir)
    ramp = m.ramps[0]
    old = load_head(tiny_dir, ramp)
    rng = np.random.default_rng(0)
    new = LinearHead(rng.normal(size=old.weight.shape).astype(np.float32),
                     rng.normal(size=old.bias.shape).astype(np.float32), old.pool)
    name, digest = save_head(tiny_dir, ramp, 1, new)
    assert name.startswith(f"ramp_{ramp.index}.v1.") and name.endswith(".onnx")
    assert save_head(tiny_dir, ramp, 1, new) == (name, digest)        # same content, same file
    back = load_head(tiny_dir, ramp, name)
    assert np.array_equal(back.weight, new.weight) and np.array_equal(back.bias, new.bias)
    sess = ort.InferenceSession(str(tiny_dir / name), providers=["CPUExecutionProvider"])
    feats = rng.normal(size=(4, old.weight.shape[1])).astype(np.float32)
    got = sess.run(None, {sess.get_inputs()[0].name: feats})[0]
    assert np.allclose(got, new.logits(feats), atol=1e-5)
    assert head_file_name(ramp, 2, b"x") != head_file_name(ramp, 2, b"y")
    with pytest.raises(ValueError, match="must be"):
        save_head(tiny_dir, ramp, 3, LinearHead(new.weight[:, :2], new.bias, old.pool))


def test_head_versions_coexist_wherever_a_stage_runs_them(tmp_path_factory):
    from schemas.messages import ExitConfig
    from services.prepare.pipeline import prepare
    from services.runtime import taps
    from services.runtime.stage import as_numpy
    from services.worker.stage_exec import execute

    d = prepare("tiny", tmp_path_factory.mktemp("models"), log=lambda s: None,
                progress=lambda s: None)
    m = Manifest.load(d)
    rt = StageRuntime(d, m, 0, m.num_blocks, device="cpu")
    r = m.ramps[0]
    x = sample_inputs("tiny", 8, seed=2)
    act = as_numpy(rt.run_range(0, r.after_block + 1, x)[0])
    old = load_head(d, r)
    new = LinearHead(-2.0 * old.weight, old.bias[::-1].copy(), old.pool)
    name, _ = save_head(d, r, 1, new)
    v1 = {r.index: name}
    want_old, want_new = (h.logits(pool_np(act, h.pool)) for h in (old, new))
    assert want_old.argmax(1).tolist() != want_new.argmax(1).tolist()
    plan = taps.tap_plan(((r.index, 0.0),), "max_softmax")
    for heads, want in ((v1, want_new), (None, want_old), ({}, want_old), (v1, want_new)):
        assert np.allclose(rt.run_ramp(r.index, act, None, heads), want, atol=1e-4)  # alone
        _, fused = rt.run_range(0, r.after_block + 1, x, None, r.index, heads)  # in a range
        assert np.allclose(fused, want, atol=1e-4)
        sess = rt.tapped((r.index,), heads)                                       # tapped
        assert sess is not None, rt.tap_notes
        _, outcomes = rt.run_tapped(sess, x, None, plan, np.full(8, -1, np.int32))
        assert outcomes[0][:, 0].astype(int).tolist() == want.argmax(1).tolist()
        for use_taps in (True, False):                         # the config names the heads
            cfg = ExitConfig("tiny", 1, active=[r.index], heads=dict(heads or {}))
            out = execute(StageRuntime(d, m, 0, m.num_blocks, device="cpu", use_taps=use_taps),
                          m.ramps, 0, m.num_blocks, x, np.full(8, -1, np.int32), cfg)
            assert out.ramp_pred[0].tolist() == want.argmax(1).tolist()
    prepared, refit = rt.tapped((r.index,)), rt.tapped((r.index,), v1)
    assert prepared is not refit


def test_forget_heads_drops_the_sessions_of_other_versions(tiny_dir):
    m = Manifest.load(tiny_dir)
    rt = StageRuntime(tiny_dir, m, 0, m.num_blocks, device="cpu")
    r, other = m.ramps[0], m.ramps[1]
    old = load_head(tiny_dir, r)
    name, _ = save_head(tiny_dir, r, 7, LinearHead(old.weight * 0.5, old.bias, old.pool))
    v7 = {r.index: name}
    for heads in (None, v7):
        rt.warm([r.index, other.index], heads)
        rt.warm([r.index], heads, features=True)
        rt.merged(0, r.after_block + 1, r.index, heads)
        rt.run_ramp(r.index, np.zeros((1, old.weight.shape[1]), np.float32), None, heads)
    kept_other = rt.tapped((other.index,))
    refit = rt.tapped((r.index, other.index), v7)
    rt.forget_heads(v7)
    assert rt.tapped((r.index, other.index), v7) is refit     # the kept version stays
    assert rt.tapped((other.index,)) is kept_other            # other ramps' sessions too
    assert all(f == name for ramps, files, _ in rt._tapped for q, f in zip(ramps, files)
               if q == r.index)
    assert {k[3] for k in rt._merged if k[2] == r.index} == {name}
    assert [f for q, f in rt._heads if q == r.index] == [name]
    assert rt.tapped((r.index,)) is not None                  # the prepared one: built again
    rt.forget_heads({})                                       # back to the prepared heads
    assert all(f == r.file for q, f in rt._heads if q == r.index)


def test_bad_head_file_names_are_refused_clearly(tiny_dir):
    m = Manifest.load(tiny_dir)
    rt = StageRuntime(tiny_dir, m, 0, m.num_blocks, device="cpu")
    r = m.ramps[0]
    (tiny_dir / "junk.onnx").write_bytes(b"not a model")
    act = np.zeros((1, load_head(tiny_dir, r).weight.shape[1]), np.float32)
    x = sample_inputs("tiny", 1, seed=0)
    for bad, why in (("../" + r.file, "plain .onnx file name"), (f"sub/{r.file}", "plain .onnx file name"),
                     ("..", "plain .onnx file name"), ("", "plain .onnx file name"),
                     (str(tiny_dir / r.file), "plain .onnx file name"),
                     ("missing.onnx", "is not in"), ("junk.onnx", "cannot be loaded")):
        heads = {r.index: bad}
        with pytest.raises(ValueError, match=why):
            rt.warm([r.index], heads)
        with pytest.raises(ValueError, match=why):
            rt.run_ramp(r.index, act, None, heads)
        with pytest.raises(ValueError, match=why):
            rt.tapped((r.index,), heads)
        with pytest.raises(ValueError, match=why):
            rt.run_range(0, r.after_block + 1, x, None, r.index, heads)
    (tiny_dir / "junk.onnx").unlink()
    with pytest.raises(ValueError, match="not in this stage"):
        rt.head_file(99)
    rt.warm([r.index], {99: "whatever.onnx"})   # another stage's ramps are not this one's

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


def test_a_stage_serves_a_new_head_everywhere_it_runs(tmp_path_factory):
    from services.prepare.pipeline import prepare
    from services.runtime import taps

    d = prepare("tiny", tmp_path_factory.mktemp("models"), log=lambda s: None,
                progress=lambda s: None)
    m = Manifest.load(d)
    rt = StageRuntime(d, m, 0, m.num_blocks, device="cpu")
    r = m.ramps[0]
    x = sample_inputs("tiny", 8, seed=2)
    site, _ = rt.run_range(0, r.after_block + 1, x)
    act = np.asarray(site.numpy() if hasattr(site, "numpy") else site)
    before_tapped = rt.tapped((r.index,))
    rt.merged(0, r.after_block + 1, r.index)
    old = load_head(d, r)
    new = LinearHead(-2.0 * old.weight, old.bias[::-1].copy(), old.pool)
    name, _ = save_head(d, r, 1, new)
    rt.set_head(r.index, name)
    want = new.logits(pool_np(act, new.pool))
    assert np.allclose(rt.run_ramp(r.index, act), want, atol=1e-4)            # its own session
    _, fused = rt.run_range(0, r.after_block + 1, x, None, r.index)            # fused in a range
    assert np.allclose(fused, want, atol=1e-4)
    sess = rt.tapped((r.index,))                                              # tapped stage
    assert sess is not None and sess is not before_tapped
    _, outcomes = rt.run_tapped(sess, x, None, taps.tap_plan(((r.index, 0.0),), "max_softmax"),
                                np.full(8, -1, np.int32))
    assert outcomes[0][:, 0].astype(int).tolist() == want.argmax(1).tolist()
    with pytest.raises(ValueError, match="not in this stage"):
        rt.set_head(99, name)

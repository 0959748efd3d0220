"""Ramp heads as numbers and as files (services.runtime.ramp_heads): a refitted head is
served as the prepared head's graph with new weights."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from services.runtime.manifest import Manifest
from services.runtime.pooling import pool_np
from services.runtime.ramp_heads import LinearHead, head_file_name, load_head, save_head
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

"""Tapped stages (services/models/taps.py): one runtime call, each ramp's logits from
inside it, identical to the split stage; checked order; a clear fallback."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from services.models import taps
from services.models.manifest import Manifest
from services.models.onnx_blocks import assemble
from services.models.prepare import prepare, sample_inputs
from services.models.runtime import StageRuntime, as_numpy, session_options


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return prepare("tiny", tmp_path_factory.mktemp("models"), log=lambda s: None,
                   progress=lambda s: None)


def _split(rt: StageRuntime, m: Manifest, ramps, x, model_inputs=None):
    """Reference: the stage split at each ramp, every head run on its own."""
    logits, a, start = {}, x, rt.first_block
    for r in ramps:
        end = m.ramp(r).after_block + 1
        a, _ = rt.run_range(start, end, a, model_inputs)
        logits[r] = rt.run_ramp(r, as_numpy(a))
        start = end
    a, _ = rt.run_range(start, rt.last_block, a, model_inputs)
    return as_numpy(a), logits


@pytest.mark.parametrize("ramps", [(0,), (0, 2), (1, 2)])
def test_tapped_stage_equals_the_split_stage(tiny_dir, ramps):
    m = Manifest.load(tiny_dir)
    rt = StageRuntime(tiny_dir, m, 0, m.num_blocks, device="cpu", threads=1)
    sess = rt.tapped(ramps)
    assert sess is not None, rt.tap_notes
    x = sample_inputs("tiny", 16, seed=3)
    seen: dict[int, np.ndarray] = {}
    out = as_numpy(rt.run_tapped(sess, x, None, lambda r, lg: seen.__setitem__(r, lg.copy())))
    ref_out, ref_logits = _split(rt, m, ramps, x)
    assert list(seen) == list(ramps)                   # reported in site order
    np.testing.assert_allclose(out, ref_out, atol=1e-5)
    for r in ramps:
        np.testing.assert_allclose(seen[r], ref_logits[r], atol=1e-5)


def test_a_later_stage_taps_from_its_activation_input(tiny_dir):
    m = Manifest.load(tiny_dir)
    s0 = StageRuntime(tiny_dir, m, 0, 2, device="cpu")
    s1 = StageRuntime(tiny_dir, m, 2, m.num_blocks, device="cpu")
    x = sample_inputs("tiny", 4, seed=1)
    mid, _ = s0.run_range(0, 2, x)
    sess = s1.tapped((2,))
    assert sess is not None, s1.tap_notes
    got = []
    out = as_numpy(s1.run_tapped(sess, mid, None, lambda r, lg: got.append(r)))
    ref, _ = _split(s1, m, (2,), as_numpy(mid))
    assert got == [2]
    np.testing.assert_allclose(out, ref, atol=1e-5)


def test_without_the_extension_library_the_stage_splits_and_says_why(tiny_dir, monkeypatch):
    m = Manifest.load(tiny_dir)
    monkeypatch.setattr(taps, "library_path", lambda: None)
    rt = StageRuntime(tiny_dir, m, 0, m.num_blocks, device="cpu")
    assert rt.tapped((0,)) is None
    assert any("onnxruntime-extensions" in n for n in rt.tap_notes)
    rt.warm([0])                                       # builds the split ranges instead
    assert rt._merged


def test_verify_order_rejects_taps_that_run_late(tiny_dir, tmp_path):
    """Put the taps first in the node list: the runtime then runs them after the blocks
    that follow their sites, and the check must say so."""
    m = Manifest.load(tiny_dir)
    blocks = [onnx.load(str(tiny_dir / b.file)) for b in m.blocks]
    ramps = (0, 1)
    heads = [(r, m.blocks[m.ramp(r).after_block].output_name,
              onnx.load(str(tiny_dir / m.ramp(r).file))) for r in ramps]
    model = taps.tapped(assemble(blocks, 0, len(blocks)), heads)
    tap_nodes = [n for n in model.graph.node if n.op_type == taps.TAP_OP]
    rest = [n for n in model.graph.node if n.op_type != taps.TAP_OP]
    del model.graph.node[:]
    model.graph.node.extend(tap_nodes + rest)
    lib = taps.library_path()

    def check(model, tmp):
        so = session_options(1)
        so.register_custom_ops_library(lib)
        tmp.mkdir()
        taps.profile_into(so, str(tmp))
        sess = ort.InferenceSession(model.SerializeToString(), so,
                                    providers=["CPUExecutionProvider"])
        return taps.verify_order(sess, {"x": np.ones((1, 16), np.float32)}, ramps, later)

    later = {r: {n.name for b in blocks[m.ramp(r).after_block + 1:] for n in b.graph.node}
             for r in ramps}
    bad = check(model, tmp_path / "bad")
    assert not bad.ok and ("ran" in bad.reason or "before its tap" in bad.reason)
    # the order the builder makes passes the same check
    assert check(taps.tapped(assemble(blocks, 0, len(blocks)), heads), tmp_path / "good").ok


def test_spatial_mean_heads_pool_in_the_runtime_layout():
    """ReduceMean over H, W becomes GlobalAveragePool + Flatten with equal results."""
    from onnx import TensorProto, helper

    w = np.random.default_rng(0).normal(size=(5, 3)).astype(np.float32)
    head = helper.make_model(helper.make_graph(
        [helper.make_node("ReduceMean", ["x"], ["p"], axes=[2, 3], keepdims=0),
         helper.make_node("Gemm", ["p", "w"], ["logits"], transB=1)], "head",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 3, 4, 4])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [None, 5])],
        initializer=[onnx.numpy_helper.from_array(w, "w")]),
        opset_imports=[helper.make_opsetid("", 17)])
    head.ir_version = 8
    pooled = taps._pool_in_layout(head)
    assert [n.op_type for n in pooled.graph.node] == ["GlobalAveragePool", "Flatten", "Gemm"]
    x = np.random.default_rng(1).normal(size=(2, 3, 4, 4)).astype(np.float32)
    run = lambda mdl: ort.InferenceSession(mdl.SerializeToString(),
                                           providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(run(pooled), run(head), atol=1e-5)


def test_a_failing_order_check_falls_back_to_splitting(tiny_dir, monkeypatch):
    m = Manifest.load(tiny_dir)
    rt = StageRuntime(tiny_dir, m, 0, m.num_blocks, device="cpu")

    def broken(*_args, **_kw):
        raise OSError("no room for the profile")

    monkeypatch.setattr(taps, "verify_order", broken)
    assert rt.tapped((0,)) is None
    assert any("could not be checked" in n for n in rt.tap_notes)

"""Tapped stages (services/runtime/taps.py, ramp_tap.c): one runtime call whose native taps
decide exits inside it, identical to the split stage; checked order; clear fallbacks."""

import gc
import weakref

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from services.common import native
from services.exits.scores import SCORE_KINDS, exit_score
from services.prepare.pipeline import sample_inputs
from services.runtime import tap_library, taps
from services.runtime.manifest import Manifest
from services.runtime.onnx_blocks import assemble
from services.runtime.stage import StageRuntime, as_numpy, session_options


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


def _tap_only(tmp_path):
    """A session that is one RampTap on its input logits (ramp 0)."""
    g = helper.make_graph(
        [helper.make_node(taps.TAP_OP, ["logits"], ["out"], domain=taps.TAP_DOMAIN,
                          name=taps.tap_node(0), ramp=0)], "tap",
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [None, None])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17),
                                                helper.make_opsetid(taps.TAP_DOMAIN, 1)])
    model.ir_version = 8
    so = session_options(1)
    so.register_custom_ops_library(tap_library.load().path)
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("kind", SCORE_KINDS)
def test_native_scores_match_the_numpy_definition(tmp_path, kind):
    rng = np.random.default_rng(7)
    logits = np.concatenate([rng.normal(0, 4, (50, 10)), np.zeros((1, 10)),      # a tie
                             np.full((1, 10), 80.0), rng.normal(0, 30, (3, 10))]
                            ).astype(np.float32)
    sess = _tap_only(tmp_path)
    (out,), _ = taps.run_with_taps(lambda: sess.run(None, {"logits": logits}),
                                   taps.tap_plan((), kind), np.full(len(logits), -1, np.int32))
    assert out[:, 0].astype(int).tolist() == logits.argmax(1).tolist()
    np.testing.assert_allclose(out[:, 1], exit_score(logits, kind), atol=2e-6)
    one = sess.run(None, {"logits": logits[:, :1]})[0]     # one class: fully confident
    assert one[:, 1].tolist() == [0.0] * len(logits)


def test_native_exits_skip_rows_already_out_and_report_their_rows(tmp_path):
    logits = np.array([[9, 0, 0], [0, 9, 0], [0, 0, 0], [9, 0, 0]], np.float32)
    sess = _tap_only(tmp_path)
    exit_at = np.array([-1, -1, -1, 2], np.int32)          # row 3 exited at an earlier stage
    seen = []
    taps.run_with_taps(lambda: sess.run(None, {"logits": logits}),
                       taps.tap_plan(((0, 0.1),), "max_softmax"), exit_at,
                       lambda r, idx, lab, sc, lg: seen.append(
                           (r, idx.tolist(), lab.tolist(), lg.tolist())))
    assert exit_at.tolist() == [0, 0, -1, 2]
    assert seen == [(0, [0, 1], [0, 1], logits[:2].tolist())]
    for plan in (taps.tap_plan(((0, 0.0),), "max_softmax"),   # threshold 0: never exits
                 taps.tap_plan(((5, 0.9),), "max_softmax")):  # other ramps' thresholds
        fresh = np.full(4, -1, np.int32)
        taps.run_with_taps(lambda: sess.run(None, {"logits": logits}), plan, fresh,
                           lambda *a: pytest.fail("nothing may exit"))
        assert fresh.tolist() == [-1] * 4


def test_a_failing_exit_handler_fails_the_call_after_it(tmp_path):
    sess = _tap_only(tmp_path)

    def boom(*_a):
        raise KeyError("handler bug")

    with pytest.raises(KeyError, match="handler bug"):
        taps.run_with_taps(lambda: sess.run(None, {"logits": np.eye(2, dtype=np.float32) * 9}),
                           taps.tap_plan(((0, 0.5),), "max_softmax"), np.full(2, -1, np.int32),
                           boom)
    with pytest.raises(ValueError, match="int32"):
        taps.run_with_taps(lambda: None, taps.tap_plan((), "max_softmax"), np.full(2, -1))
    with pytest.raises(ValueError, match="unknown score kind"):
        taps.tap_plan((), "vibes")


@pytest.mark.parametrize("ramps", [(0,), (0, 2), (1, 2)])
def test_tapped_stage_equals_the_split_stage(tiny_dir, ramps):
    m = Manifest.load(tiny_dir)
    rt = StageRuntime(tiny_dir, m, 0, m.num_blocks, device="cpu", threads=1)
    sess = rt.tapped(ramps)
    assert sess is not None, rt.tap_notes
    x = sample_inputs("tiny", 16, seed=3)
    ref_out, ref_logits = _split(rt, m, ramps, x)
    plan = taps.tap_plan(tuple((r, 2.0) for r in ramps), "max_softmax")  # all exit at the first
    exit_at, early = np.full(16, -1, np.int32), []
    out, outcomes = rt.run_tapped(sess, x, None, plan, exit_at,
                                  lambda r, idx, lab, sc, lg: early.append((r, idx, lab, lg)))
    np.testing.assert_allclose(as_numpy(out), ref_out, atol=1e-5)
    assert len(outcomes) == len(ramps)
    for r, got in zip(ramps, outcomes):                    # every row's label and score
        assert got[:, 0].astype(int).tolist() == ref_logits[r].argmax(1).tolist()
        np.testing.assert_allclose(got[:, 1], exit_score(ref_logits[r]), atol=2e-6)
    assert exit_at.tolist() == [ramps[0]] * 16
    (r, idx, lab, lg), = early                             # one call, at the first ramp
    assert r == ramps[0] and idx.tolist() == list(range(16))
    assert lab.tolist() == ref_logits[r].argmax(1).tolist()
    np.testing.assert_allclose(lg, ref_logits[r], atol=1e-5)


def test_a_later_stage_taps_from_its_activation_input(tiny_dir):
    m = Manifest.load(tiny_dir)
    s0 = StageRuntime(tiny_dir, m, 0, 2, device="cpu")
    s1 = StageRuntime(tiny_dir, m, 2, m.num_blocks, device="cpu")
    x = sample_inputs("tiny", 4, seed=1)
    mid, _ = s0.run_range(0, 2, x)
    sess = s1.tapped((2,))
    assert sess is not None, s1.tap_notes
    out, outcomes = s1.run_tapped(sess, mid, None, taps.tap_plan(((2, 0.0),), "max_softmax"),
                                  np.full(4, -1, np.int32))
    ref, ref_logits = _split(s1, m, (2,), as_numpy(mid))
    np.testing.assert_allclose(as_numpy(out), ref, atol=1e-5)
    assert outcomes[0][:, 0].astype(int).tolist() == ref_logits[2].argmax(1).tolist()


def test_without_the_tap_library_the_stage_splits_and_says_why(tiny_dir, monkeypatch):
    m = Manifest.load(tiny_dir)
    monkeypatch.setattr(tap_library, "load", lambda folder=None: None)
    monkeypatch.setattr(tap_library, "failure", lambda: "no C compiler found (tried cc)")
    rt = StageRuntime(tiny_dir, m, 0, m.num_blocks, device="cpu")
    assert rt.tapped((0,)) is None
    assert any("no C compiler" in n for n in rt.tap_notes)
    rt.warm([0])                                       # builds the split ranges instead
    assert rt._merged


def test_the_library_builds_once_per_source_and_fails_clearly(tmp_path, monkeypatch):
    built = tap_library.build(tmp_path / "a")
    assert built == tap_library.library_file(tmp_path / "a") and built.exists()
    stamp = built.stat().st_mtime_ns
    assert tap_library.build(tmp_path / "a").stat().st_mtime_ns == stamp   # cached
    monkeypatch.setattr(native, "COMPILERS", ("no-such-cc",))
    monkeypatch.setattr(tap_library, "_loaded", None)
    monkeypatch.setattr(tap_library, "_failure", None)
    assert tap_library.load(tmp_path / "b") is None
    assert "no C compiler" in tap_library.failure()


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
    lib = tap_library.load().path

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
    pooled = taps.pool_in_layout(head)
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


def test_the_stage_bytes_plus_the_extension_parse_as_the_tapped_stage(tiny_dir):
    """Workers append the heads' and taps' bytes to the stage's cached serialization."""
    m = Manifest.load(tiny_dir)
    stage = assemble([onnx.load(str(tiny_dir / b.file)) for b in m.blocks], 0, m.num_blocks)
    heads = [(r, m.blocks[m.ramp(r).after_block].output_name,
              onnx.load(str(tiny_dir / m.ramp(r).file))) for r in (0, 2)]
    ext = taps.tap_extension(taps.StageFacts.of(stage), heads)
    joined = onnx.ModelProto.FromString(stage.SerializeToString() + ext.SerializeToString())
    assert joined == taps.tapped(stage, heads)
    assert [o.name for o in joined.graph.output][-2:] == [taps.tap_output(0), taps.tap_output(2)]
    assert len(joined.graph.node) == len(stage.graph.node) + len(ext.graph.node)
    assert ext.ByteSize() < stage.ByteSize()


def test_the_extension_rejects_a_site_outside_the_stage(tiny_dir):
    m = Manifest.load(tiny_dir)
    stage = assemble([onnx.load(str(tiny_dir / m.blocks[0].file))], 0, 1)
    head = onnx.load(str(tiny_dir / m.ramp(0).file))
    with pytest.raises(ValueError, match="not in the stage"):
        taps.tap_extension(taps.StageFacts.of(stage), [(0, "no/such/tensor", head)])


def test_tapped_sessions_kept_are_bounded_least_recently_used_out(tiny_dir, monkeypatch):
    from services.runtime import stage as runtime

    monkeypatch.setattr(runtime, "TAPPED_SESSIONS_KEPT", 2)
    m = Manifest.load(tiny_dir)
    rt = StageRuntime(tiny_dir, m, 0, m.num_blocks, device="cpu", threads=1)
    a, b = rt.tapped((0,)), rt.tapped((1,))
    assert rt.tapped((0,)) is a                  # cached, and now the most recently used
    x = sample_inputs("tiny", 2, seed=3)
    rt.run_tapped(b, x, None, taps.tap_plan(((1, 0.0),), "max_softmax"), np.full(2, -1, np.int32))
    c = rt.tapped((2,))                          # a third set evicts the least recent: (1,)
    assert c is not None and rt.tapped((0,)) is a and rt.tapped((2,)) is c
    assert {key[0] for key in rt._tapped} == {(0,), (2,)}
    gone = weakref.ref(b)
    del b
    gc.collect()
    assert gone() is None                        # nothing else keeps the evicted one alive
    assert rt.tapped((1,)) is not None           # built again when asked for

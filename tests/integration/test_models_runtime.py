"""Providers and stage execution against the unsplit torch model (tiny)."""

import numpy as np
import pytest
import torch

from services.prepare.pipeline import sample_inputs
from services.runtime import devices
from services.runtime import stage as runtime
from services.runtime.devices import pick_providers
from services.runtime.manifest import Manifest
from services.runtime.stage import StageRuntime, as_numpy


def test_pick_providers_cpu_and_cuda():
    assert pick_providers("cpu") == ["CPUExecutionProvider"]
    assert pick_providers("cuda") == ["CUDAExecutionProvider", "CPUExecutionProvider"]
    with pytest.raises(ValueError):
        pick_providers("tpu")


def test_pick_providers_auto(monkeypatch):
    monkeypatch.setattr(devices, "gpu_present", lambda: False)
    assert pick_providers("auto") == ["CPUExecutionProvider"]
    monkeypatch.setattr(devices, "gpu_present", lambda: True)
    monkeypatch.setattr(
        devices.ort,
        "get_available_providers",
        lambda: ["CUDAExecutionProvider", "CPUExecutionProvider"],
    )
    assert pick_providers("auto") == ["CUDAExecutionProvider", "CPUExecutionProvider"]




def test_stages_match_unsplit_torch(tiny_dir):
    from services.zoo import tiny

    m = Manifest.load(tiny_dir)
    model = tiny.build_model()
    x = sample_inputs("tiny", 64, seed=5)
    with torch.no_grad():
        ref = model(torch.from_numpy(x["x"])).numpy()
    whole = StageRuntime(tiny_dir, m, 0, m.num_blocks, device="cpu", threads=1)
    assert whole.providers == ["CPUExecutionProvider"]
    y, ramp_logits = whole.run_all(x)
    np.testing.assert_allclose(y, ref, atol=1e-4)
    assert sorted(ramp_logits) == [0, 1, 2]
    assert all(v.shape == (64, m.classes) for v in ramp_logits.values())

    # Two stages chained give the same answer and split the ramps between them.
    s0 = StageRuntime(tiny_dir, m, 0, 2, device="cpu")
    s1 = StageRuntime(tiny_dir, m, 2, m.num_blocks, device="cpu")
    assert [r.index for r in s0.ramps] == [0, 1] and [r.index for r in s1.ramps] == [2]
    mid, r0 = s0.run_all(x["x"])  # a bare array is fine for a single-input model
    out, _ = s1.run_all(mid)
    np.testing.assert_allclose(out, ref, atol=1e-4)
    np.testing.assert_allclose(r0[1], ramp_logits[1], atol=1e-5)
    np.testing.assert_allclose(s1.run_ramp(2, s1.run_block(2, mid)), ramp_logits[2], atol=1e-5)


def test_ramps_agree_with_final_mostly(tiny_dir):
    m = Manifest.load(tiny_dir)
    rt = StageRuntime(tiny_dir, m, 0, m.num_blocks, device="cpu")
    y, ramp_logits = rt.run_all(sample_inputs("tiny", 500, seed=11))
    final = y.argmax(1)
    assert len(np.unique(final)) >= 5  # the model is not trivial
    for r in m.ramps:
        agree = (ramp_logits[r.index].argmax(1) == final).mean()
        assert agree > 0.6, (r.index, agree)
        assert abs(agree - r.agreement) < 0.15


def test_bad_block_range(tiny_dir):
    m = Manifest.load(tiny_dir)
    with pytest.raises(ValueError):
        StageRuntime(tiny_dir, m, 2, 2)
    with pytest.raises(ValueError):
        StageRuntime(tiny_dir, m, 0, m.num_blocks + 1)


def test_fused_ranges_match_block_by_block(tiny_dir):
    """A range of blocks run as one session, with a ramp head fused in, gives the same
    activation and ramp logits as one call per block and a separate ramp call."""
    m = Manifest.load(tiny_dir)
    rt = StageRuntime(tiny_dir, m, 0, m.num_blocks, device="cpu")
    x = sample_inputs("tiny", 7, seed=3)
    a1 = rt.run_block(1, rt.run_block(0, x))
    act, logits = rt.run_range(0, 2, x, None, ramp=1)
    act = as_numpy(act)  # activations stay in ONNX Runtime between ranges
    np.testing.assert_allclose(act, a1, atol=1e-5)
    np.testing.assert_allclose(logits, rt.run_ramp(1, a1), atol=1e-5)
    act2, none = rt.run_range(2, m.num_blocks, rt.run_range(0, 2, x)[0])  # OrtValue in
    assert none is None
    np.testing.assert_allclose(as_numpy(act2), rt.run_all(x)[0], atol=1e-5)
    assert len(rt.merged(0, 2, 1).get_outputs()) == 2  # really one fused graph


def test_spin_for_auto_spins_only_a_lone_worker():
    assert runtime.spin_for("auto", 1) is True
    assert runtime.spin_for("auto", 2) is False
    assert runtime.spin_for("auto", None) is False  # started on its own: cores may be shared
    assert runtime.spin_for("on", 3) is True
    assert runtime.spin_for("off", 1) is False
    with pytest.raises(ValueError, match="auto, on, off"):
        runtime.spin_for("sometimes", 1)


def test_session_options_carry_the_spin_setting():
    entry = "session.intra_op.allow_spinning"
    assert runtime.session_options(0).get_session_config_entry(entry) == "0"
    assert runtime.session_options(0, spin=True).get_session_config_entry(entry) == "1"
    # spinning never outlives a run: no cores burnt between requests
    assert runtime.session_options(0, spin=True).get_session_config_entry(
        "session.force_spinning_stop") == "1"


def test_only_the_stage_without_ramps_spins(tiny_dir):
    """A run with active ramps answers mid-way; a spinning pool would take the cores its
    early answers need to leave (runtime.StageRuntime), so only the plain stage spins."""
    m = Manifest.load(tiny_dir)
    rt = StageRuntime(tiny_dir, m, 0, m.num_blocks, device="cpu", spin=True)
    entry = "session.intra_op.allow_spinning"

    def spins(sess) -> str:
        return sess.get_session_options().get_session_config_entry(entry)

    assert spins(rt.merged(0, m.num_blocks)) == "1"
    assert spins(rt.merged(0, 2, 1)) == "0"
    assert spins(rt.merged(2, m.num_blocks)) == "0"
    assert spins(rt._blocks[0]) == "0" and spins(rt._head(1, None)) == "0"
    tapped = rt.tapped((1,))
    assert tapped is not None  # the tap library builds on this machine (gcc in the setup)
    assert spins(tapped) == "0"
    off = StageRuntime(tiny_dir, m, 0, m.num_blocks, device="cpu", spin=False)
    assert spins(off.merged(0, m.num_blocks)) == "0"

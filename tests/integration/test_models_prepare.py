"""prepare(): layout, idempotence, recovery and errors (tiny)."""

import os
from dataclasses import replace

import numpy as np
import pytest

from services.prepare.pipeline import prepare, sample_inputs
from services.runtime.manifest import Manifest
from services.zoo.registry import ZOO


def quiet(_msg: str) -> None:
    pass


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory):
    d = tmp_path_factory.mktemp("models")
    prepare("tiny", d, log=quiet, progress=quiet)
    return d


def test_layout_follows_manifest(tiny_models):
    d = tiny_models / "tiny"
    m = Manifest.load(d)
    assert m.name == "tiny" and m.kind == "classifier" and m.classes == 10
    assert m.inputs[0].name == "x" and m.inputs[0].shape == [16]
    assert m.num_blocks == 4 and [r.after_block for r in m.ramps] == [0, 1, 2]
    assert m.blocks[0].input_names == ["x"]
    # Block k > 0 reads the tensor block k-1 produces (a ramp site, named as in the graph).
    for prev, b in zip(m.blocks, m.blocks[1:]):
        assert b.input_names == [prev.output_name] and "Relu" in prev.output_name
    assert [r.site for r in m.ramps] == [b.output_name for b in m.blocks[:-1]]
    assert m.blocks[-1].output_shape == [10]
    assert all(set(b.cost_by_batch) == {"1", "4", "16"} for b in m.blocks)
    for b in m.blocks:
        assert b.file == f"block_{b.index}.{b.sha256[:12]}.onnx"
    for r in m.ramps:
        assert r.file == f"ramp_{r.index}.{r.sha256[:12]}.onnx"
        assert r.params == 32 * 10 + 10 and 0.5 < r.agreement <= 1.0 and r.cost_ms > 0
    assert m.full_ms > 0 and m.base_params > 0
    # What a worker pays: prefixes grow along the model, and activating a ramp costs at
    # least its head (the split there comes on top).
    assert m.meta["range_ms"] > 0
    assert all(r.prefix_ms > 0 and r.serve_ms >= r.cost_ms for r in m.ramps)
    from services.runtime import tap_library

    if tap_library.load() is not None:  # tapped: one measured extra, shared by head cost
        big = max(m.ramps, key=lambda r: r.cost_ms)
        scale = big.serve_ms / big.cost_ms
        assert all(abs(r.serve_ms - r.cost_ms * scale) <= 1.01e-4 for r in m.ramps)
    assert m.verify(d) == []
    assert not list(tiny_models.glob(".tiny.tmp-*"))  # temp folder is gone


def test_second_call_reuses(tiny_models, monkeypatch):
    d = tiny_models / "tiny"
    before = Manifest.load(d).version
    mtimes = {p.name: p.stat().st_mtime_ns for p in d.iterdir()}
    logs: list[str] = []
    # reusing never builds the model (MiniLM's build trains its topic head on a new home)
    monkeypatch.setitem(ZOO._built, "tiny", replace(
        ZOO["tiny"], build=lambda: pytest.fail("a reusable copy was built again")))
    assert prepare("tiny", tiny_models, log=logs.append, progress=quiet) == d
    assert any(line.startswith("reusing tiny") and before in line for line in logs)
    assert Manifest.load(d).version == before
    assert {p.name: p.stat().st_mtime_ns for p in d.iterdir()} == mtimes


def test_damaged_copy_and_leftovers_are_rebuilt(tmp_path):
    d = prepare("tiny", tmp_path, log=quiet, progress=quiet)
    m = Manifest.load(d)
    (d / m.ramps[0].file).write_bytes(b"broken")
    stale = tmp_path / ".tiny.tmp-interrupted"
    stale.mkdir()
    logs: list[str] = []
    prepare("tiny", tmp_path, log=logs.append, progress=quiet)
    assert not any(line.startswith("reusing") for line in logs)
    again = Manifest.load(d)
    assert again.verify(d) == []
    assert not stale.exists()
    # Only files the manifest names remain (plus the unsplit model and the site report).
    on_disk = {p.name for p in d.iterdir()} - {"manifest.json", "sites.txt",
                                                again.meta["full_model_file"]}
    assert on_disk == {f for f, _ in again.artifacts()}


def test_force_rebuilds(tmp_path):
    prepare("tiny", tmp_path, log=quiet, progress=quiet)
    logs: list[str] = []
    prepare("tiny", tmp_path, force=True, log=logs.append, progress=quiet)
    assert any(line.startswith("prepared tiny") for line in logs)


def test_unknown_model(tmp_path):
    with pytest.raises(ValueError, match="known models: chain-cnn, efficientnet-lite0, minilm-topics, tiny") as exc:
        prepare("resnet-9000", tmp_path, log=quiet)
    assert "supernet-cnn" in str(exc.value) and "smollm2-135m" in str(exc.value)
    with pytest.raises(ValueError):
        sample_inputs("resnet-9000", 1)
    assert not os.listdir(tmp_path)


def test_sample_inputs():
    x = sample_inputs("tiny", 5, seed=2)
    assert x["x"].shape == (5, 16) and x["x"].dtype == np.float32
    assert np.array_equal(x["x"], sample_inputs("tiny", 5, seed=2)["x"])
    img = sample_inputs("efficientnet-lite0", 2, seed=0)["image"]
    assert img.shape == (2, 3, 224, 224) and img.dtype == np.uint8  # 8-bit pixels


def test_serving_profile_from_manifest(tiny_models):
    from dataclasses import replace

    from services.exits.latency_profile import LatencyProfile

    m = Manifest.load(tiny_models / "tiny")
    prof = LatencyProfile.from_manifest(m)
    assert prof.full_ms == m.meta["range_ms"]
    assert list(prof.ramp_cost_ms) == [r.serve_ms for r in m.ramps]
    assert np.all(np.diff(prof.prefix_ms) >= 0)  # noise in separate medians cannot reorder
    # A manifest prepared before serving costs were measured: summed blocks, head costs.
    old = replace(m, ramps=[replace(r, prefix_ms=0.0, serve_ms=0.0) for r in m.ramps])
    prof = LatencyProfile.from_manifest(old)
    assert list(prof.ramp_cost_ms) == [r.cost_ms for r in m.ramps]
    assert prof.full_ms == pytest.approx(sum(b.cost_ms for b in m.blocks))


def test_profile_orders_prefixes_by_pooling_an_outlier_not_by_running_max(tiny_models):
    from dataclasses import replace

    from services.exits.latency_profile import LatencyProfile, isotonic

    np.testing.assert_allclose(isotonic([3.78, 7.83, 5.34, 6.57, 6.93]),
                               [3.78, 6.58, 6.58, 6.58, 6.93], atol=1e-9)
    np.testing.assert_allclose(isotonic([1.0, 2.0, 0.5, 3.0]), [1.0, 1.25, 1.25, 3.0])
    np.testing.assert_array_equal(isotonic([0.1, 0.2, 0.2, 0.9]), [0.1, 0.2, 0.2, 0.9])
    assert isotonic([]).size == 0
    m = Manifest.load(tiny_models / "tiny")
    full = m.meta["range_ms"]
    slow = replace(m, ramps=[replace(r, prefix_ms=v) for r, v in
                             zip(m.ramps, [full * 0.2, full * 0.9, full * 0.4], strict=True)])
    prof = LatencyProfile.from_manifest(slow)
    np.testing.assert_allclose(prof.prefix_ms, [full * 0.2, full * 0.65, full * 0.65, full])
    capped = replace(m, ramps=[replace(r, prefix_ms=full * 2) for r in m.ramps])
    assert list(LatencyProfile.from_manifest(capped).prefix_ms) == [full] * 4  # never past full


def test_initial_ramps_follow_the_serving_budget(tiny_models):
    from services.exits.initial import initial_ramps

    m = Manifest.load(tiny_models / "tiny")
    assert initial_ramps(m, budget=100.0) == [0, 1, 2]  # every ramp fits a huge budget
    assert initial_ramps(m, budget=0.0) == []

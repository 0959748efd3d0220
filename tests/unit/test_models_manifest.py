"""Manifest round trip, ramp selection per stage and integrity checks."""

from pathlib import Path

import pytest

from services.runtime.llm_manifest import LlmManifest
from services.runtime.manifest import (
    BlockSpec,
    Manifest,
    ModelNotPrepared,
    RampSpec,
    TensorSpec,
    sha256_bytes,
)


def make(tmp_path: Path) -> Manifest:
    blocks, ramps = [], []
    for i in range(4):
        data = f"block {i}".encode()
        file = f"block_{i}.{sha256_bytes(data)[:12]}.onnx"
        (tmp_path / file).write_bytes(data)
        blocks.append(BlockSpec(i, file, sha256_bytes(data), ["x"], [8]))
    for k, after in enumerate([0, 1, 2]):
        data = f"ramp {k}".encode()
        file = f"ramp_{k}.{sha256_bytes(data)[:12]}.onnx"
        (tmp_path / file).write_bytes(data)
        ramps.append(RampSpec(k, after, file, sha256_bytes(data), "gap_fc", 90, 0.8, 0.01))
    m = Manifest(
        "m",
        "",
        "classifier",
        [TensorSpec("x", "<f4", [16])],
        [TensorSpec("logits", "<f4", [10])],
        10,
        blocks,
        ramps,
        1000,
        1.5,
    )
    m.version = m.compute_version()
    return m


def test_round_trip(tmp_path):
    m = make(tmp_path)
    m.save(tmp_path)
    back = Manifest.load(tmp_path)
    assert back == m
    assert back.verify(tmp_path) == []


def test_unknown_keys_are_ignored(tmp_path):
    m = make(tmp_path)
    d = m.to_dict()
    d["blocks"][0]["future_field"] = 1
    assert Manifest.from_dict(d).blocks[0] == m.blocks[0]


def test_ramps_in_stage():
    ramps = [RampSpec(k, a, "", "", "gap_fc", 0, 0.0, 0.0) for k, a in enumerate([0, 1, 2])]
    m = Manifest(
        "m",
        "v",
        "classifier",
        [],
        [],
        10,
        [BlockSpec(i, "", "", ["x"], [1]) for i in range(4)],
        ramps,
        0,
        0.0,
    )
    assert [r.index for r in m.ramps_in(0, 4)] == [0, 1, 2]
    assert [r.index for r in m.ramps_in(0, 2)] == [0, 1]
    assert [r.index for r in m.ramps_in(2, 4)] == [2]
    assert m.ramps_in(3, 4) == []
    assert m.ramp(1).after_block == 1
    with pytest.raises(KeyError):
        m.ramp(7)


def test_verify_reports_damage(tmp_path):
    m = make(tmp_path)
    (tmp_path / m.blocks[1].file).write_bytes(b"tampered")
    (tmp_path / m.ramps[2].file).unlink()
    problems = m.verify(tmp_path)
    assert any("hash mismatch block_1" in p for p in problems)
    assert any("missing ramp_2" in p for p in problems)
    m.version = "other"
    assert any("version" in p for p in m.verify(tmp_path))


def test_a_model_not_prepared_names_the_fix(tmp_path):
    with pytest.raises(ModelNotPrepared, match=r"nosuch is not prepared under .*"
                                               r"\(run `offramp prepare nosuch`\)"):
        Manifest.load(tmp_path / "nosuch")
    with pytest.raises(FileNotFoundError):  # what callers catching OSError already expect
        LlmManifest.load(tmp_path / "nosuch")

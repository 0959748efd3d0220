"""Latency profiles measured through StageRuntime on the prepared `tiny` model.

Only the shape of the result is checked: tests never assert on wall-clock speed."""

from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path

import numpy as np
import pytest

from services.models.manifest import Manifest
from services.models.runtime import CPU, CUDA, gpu_present
from services.profiler.latency import Cancelled, device_class, measure, synthetic_inputs
from services.profiler.service import expected_keys, needs_profile
from services.store.db import utcnow


@pytest.fixture(scope="module")
def tiny(models_dir: Path) -> tuple[Path, Manifest]:
    path = models_dir / "tiny"
    return path, Manifest.load(path)


def test_measure_covers_every_block_ramp_and_full(tiny: tuple[Path, Manifest]) -> None:
    path, manifest = tiny
    rows = measure(path, manifest, batch_sizes=(1, 2), device="cpu", runs=3, warmup=1)
    keys = [(r["kind"], r["idx"], r["batch_size"]) for r in rows]
    assert len(keys) == len(set(keys))
    assert set(keys) == expected_keys(manifest.to_dict(), (1, 2))
    assert {k for k, _, _ in keys} == {"block", "ramp", "full"}
    assert sum(k == "block" for k, _, _ in keys) == 2 * manifest.num_blocks
    assert sum(k == "ramp" for k, _, _ in keys) == 2 * len(manifest.ramps)
    assert [(i, b) for k, i, b in keys if k == "full"] == [(-1, 1), (-1, 2)]
    for r in rows:
        assert set(r) == {"kind", "idx", "batch_size", "ms", "runs"}
        assert isinstance(r["ms"], float) and r["ms"] > 0 and r["runs"] == 3


def test_measure_stops_when_asked(tiny: tuple[Path, Manifest]) -> None:
    path, manifest = tiny
    with pytest.raises(Cancelled):
        measure(path, manifest, (1,), device="cpu", runs=1, warmup=0, should_stop=lambda: True)
    with pytest.raises(ValueError):
        measure(path, manifest, (0,), device="cpu")


def test_synthetic_inputs_follow_the_manifest(tiny: tuple[Path, Manifest]) -> None:
    _, manifest = tiny
    feed = synthetic_inputs(manifest, 4)
    assert set(feed) == {t.name for t in manifest.inputs}
    for t in manifest.inputs:
        assert feed[t.name].shape == (4, *t.shape) and feed[t.name].dtype == np.dtype(t.dtype)


def test_device_class_format() -> None:
    assert re.fullmatch(r"cpu-[1-9][0-9]*c", device_class("cpu"))
    assert device_class("auto", providers=[CPU]) == device_class("cpu")
    if not gpu_present():  # CUDA listed by onnxruntime-gpu but no driver: still a CPU
        assert device_class("auto") == device_class("cuda", [CUDA, CPU]) == device_class("cpu")
    else:
        assert device_class("cuda", [CUDA, CPU]) != device_class("cpu")


def test_needs_profile() -> None:
    manifest = {"blocks": [{"index": 0}, {"index": 1}], "ramps": [{"index": 0}]}
    now = utcnow()
    model = {"manifest": manifest, "updated_at": now - timedelta(minutes=1)}
    profile = [
        {"kind": k, "idx": i, "batch_size": b, "measured_at": now}
        for k, i, b in expected_keys(manifest, (1, 4))
    ]
    assert len(profile) == 8
    assert not needs_profile(model, profile, (1, 4))
    assert needs_profile(model, profile[1:], (1, 4))  # a part is missing
    assert needs_profile(model, profile, (1, 4, 16))  # a batch size is missing
    assert needs_profile({**model, "updated_at": now + timedelta(seconds=1)}, profile, (1, 4))

"""Latency profiles measured through the runtime workers use (tiny)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from services.profiler.latency import measure, synthetic_inputs
from services.profiler.service import expected_keys
from services.runtime.manifest import Manifest
from services.runtime.timing import Cancelled


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

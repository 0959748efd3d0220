"""The demo's input streams, from prepared models."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from services.loadgen.demo import demo_inputs
from services.workloads.frames import video_frames


def test_default_stream_is_the_models_sample_inputs(models_dir):
    cfg = SimpleNamespace(models_dir=models_dir)
    got = demo_inputs(cfg, "efficientnet-lite0", 5)
    assert len(got) == 5 and set(got[0]) == {"image"}
    assert np.array_equal(np.stack([g["image"] for g in got]), video_frames(5, seed=1, dtype="uint8"))


def test_scene_frames_shape_the_video_stream(models_dir):
    cfg = SimpleNamespace(models_dir=models_dir)
    same = demo_inputs(cfg, "efficientnet-lite0", 6, (16, 120))  # the default scene lengths
    assert np.array_equal(np.stack([g["image"] for g in same]), video_frames(6, seed=1, dtype="uint8"))
    x = np.stack([g["image"] for g in demo_inputs(cfg, "efficientnet-lite0", 12, (4, 4))])
    assert x.shape == (12, 3, 224, 224) and x.dtype == np.uint8
    x = x.astype(np.float32)  # differences of pixels, not modulo 256
    step = np.abs(np.diff(x, axis=0)).mean(axis=(1, 2, 3))
    cuts = np.zeros(11, bool)
    cuts[[3, 7]] = True                          # frames 4 and 8 start new scenes
    assert step[cuts].min() > 2 * step[~cuts].max()


def test_seed_picks_the_bench_stream(models_dir):
    from services.runtime.manifest import Manifest
    from services.sim.workload_inputs import workload_chunks

    cfg = SimpleNamespace(models_dir=models_dir)
    got = np.stack([g["image"] for g in demo_inputs(cfg, "efficientnet-lite0", 40, (16, 30), 2)])
    chunks, _ = workload_chunks(Manifest.load(models_dir / "efficientnet-lite0"), "video", 40, 2,
                                "16:30")
    assert np.array_equal(got, np.concatenate([c["image"] for c in chunks]))
    other = np.stack([g["image"] for g in demo_inputs(cfg, "efficientnet-lite0", 40, (16, 30))])
    assert not np.array_equal(got, other)


def test_scene_frames_need_an_image_model(models_dir):
    cfg = SimpleNamespace(models_dir=models_dir)
    with pytest.raises(ValueError, match="3 x S x S"):
        demo_inputs(cfg, "tiny", 4, (10, 20))


def test_long_scenes_are_the_default_only_for_image_models(models_dir):
    from services.loadgen.demo import takes_images
    from services.runtime.manifest import Manifest

    assert takes_images(Manifest.load(models_dir / "efficientnet-lite0"))
    assert not takes_images(Manifest.load(models_dir / "tiny"))

"""`offramp demo`'s input stream: the model's sample inputs, or video with chosen scene lengths."""

from __future__ import annotations

import argparse
from types import SimpleNamespace

import numpy as np
import pytest

from services.demo import demo_inputs, demo_load, run_demo
from services.models.workloads import video_frames


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
    from services.models.manifest import Manifest
    from services.sim.trace_cli import workload_chunks

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


def test_bad_scene_frames_fail_before_anything_starts(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("OFFRAMP_HOME", str(tmp_path))
    monkeypatch.setenv("OFFRAMP_MODELS", "tiny")
    args = argparse.Namespace(model="efficientnet-lite0", requests=4, concurrency=None,
                              scene_frames="9:3", arrivals=None, json=None)
    assert run_demo(args) == 2
    assert "scene frames must be MIN:MAX" in capsys.readouterr().err
    assert not (tmp_path / "offramp.db").exists()  # no store, no stack


def test_bad_arrivals_fail_before_anything_starts(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("OFFRAMP_HOME", str(tmp_path))
    monkeypatch.setenv("OFFRAMP_MODELS", "tiny")
    args = argparse.Namespace(model="efficientnet-lite0", requests=4, concurrency=None,
                              scene_frames=None, arrivals="sometimes:3", json=None)
    assert run_demo(args) == 2
    assert "unknown arrival kind" in capsys.readouterr().err
    assert not (tmp_path / "offramp.db").exists()


def test_bad_seed_fails_before_anything_starts(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("OFFRAMP_HOME", str(tmp_path))
    monkeypatch.setenv("OFFRAMP_MODELS", "tiny")
    args = argparse.Namespace(model="efficientnet-lite0", requests=4, concurrency=None,
                              scene_frames=None, arrivals=None, json=None, seed=-1)
    assert run_demo(args) == 2
    assert "--seed must be >= 0" in capsys.readouterr().err
    assert not (tmp_path / "offramp.db").exists()


def test_the_default_load_is_open_loop_light_load():
    from services.bench.apparate import LIGHT_LOAD

    spec, inflight = demo_load(None, None, full_ms=5.0)
    assert inflight == 1 and spec == f"poisson:{LIGHT_LOAD * 1000 / 5.0:.4g}"
    assert demo_load(None, "poisson:7", 5.0) == ("poisson:7", 1)
    assert demo_load(4, None, 5.0) == (None, 4)  # closed loop only when asked


def test_concurrency_and_arrivals_exclude_each_other(monkeypatch, tmp_path, capsys):
    with pytest.raises(ValueError, match="not both"):
        demo_load(1, "poisson:7", 5.0)
    with pytest.raises(ValueError, match=">= 1"):
        demo_load(0, None, 5.0)
    monkeypatch.setenv("OFFRAMP_HOME", str(tmp_path))
    args = argparse.Namespace(model="efficientnet-lite0", requests=4, concurrency=2,
                              scene_frames=None, arrivals="poisson:7", json=None)
    assert run_demo(args) == 2
    assert "not both" in capsys.readouterr().err
    assert not (tmp_path / "offramp.db").exists()  # no store, no stack


def test_long_scenes_are_the_default_only_for_image_models(models_dir):
    from services.demo import _takes_images
    from services.models.manifest import Manifest

    assert _takes_images(Manifest.load(models_dir / "efficientnet-lite0"))
    assert not _takes_images(Manifest.load(models_dir / "tiny"))

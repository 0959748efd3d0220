"""`offramp demo`'s input stream: the model's sample inputs, or video with chosen scene lengths."""

from __future__ import annotations

import argparse

import pytest

from services.cli.demo import run_demo
from services.loadgen.demo import demo_load


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
    from services.workloads.arrivals import LIGHT_LOAD

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



"""Video-like frame streams: deterministic, chunk-independent, scene structured."""

import numpy as np
import pytest

from services.workloads.frames import (
    iter_video_frames,
    parse_scene_frames,
    photos,
    plan,
    video_frames,
)


def test_deterministic_from_seed():
    a, sa = video_frames(40, seed=3, size=64, return_scenes=True)
    b, sb = video_frames(40, seed=3, size=64, return_scenes=True)
    assert a.shape == (40, 3, 64, 64) and a.dtype == np.float32
    assert np.array_equal(a, b) and np.array_equal(sa, sb)
    c = video_frames(40, seed=4, size=64)
    assert not np.array_equal(a, c)


def test_chunking_does_not_change_frames():
    whole = video_frames(30, seed=1, size=32)
    parts = np.concatenate([f for f, _ in iter_video_frames(30, seed=1, size=32, chunk=7)])
    assert np.array_equal(whole, parts)
    # A prefix of a longer stream is the shorter stream.
    assert np.array_equal(video_frames(10, seed=1, size=32), whole[:10])


def test_range_and_scene_structure():
    x, scenes = video_frames(300, seed=0, size=48, return_scenes=True)
    assert x.min() >= -1.0 and x.max() <= 1.0  # (p - 0.5) / 0.5 for p in [0, 1]
    assert (np.diff(scenes) >= 0).all() and scenes[0] == 0
    assert len(np.unique(scenes)) >= 3  # scenes last 16..120 frames
    # Inside a scene consecutive frames are close; a cut is a big jump.
    step = np.abs(np.diff(x, axis=0)).mean(axis=(1, 2, 3))
    same = scenes[1:] == scenes[:-1]
    assert np.median(step[same]) < 0.5 * np.median(step[~same])


def test_uint8_frames_are_the_float_frames_as_pixels():
    f = video_frames(12, seed=2, size=40)
    u = video_frames(12, seed=2, size=40, dtype="uint8")
    assert u.dtype == np.uint8 and u.shape == f.shape
    # Same frames: the pixels are the normalised floats mapped back to [0, 255] and rounded.
    assert np.abs(u.astype(np.float32) - (f * 0.5 + 0.5) * 255).max() <= 0.5 + 1e-3
    assert u.min() < 64 and u.max() > 192  # the whole 8-bit range is used
    with pytest.raises(ValueError, match="float32 or uint8"):
        next(iter_video_frames(2, size=8, dtype="float16"))


def test_image_input_names_size_and_dtype():
    from services.runtime.manifest import TensorSpec
    from services.workloads.frames import image_input

    assert image_input([TensorSpec("image", "|u1", [3, 224, 224])]) == ("image", 224, "uint8")
    assert image_input([TensorSpec("img", "<f4", [3, 32, 32])]) == ("img", 32, "float32")
    for bad in ([TensorSpec("x", "<f4", [16])], [TensorSpec("image", "<i8", [3, 8, 8])],
                [TensorSpec("a", "<f4", [3, 8, 8]), TensorSpec("b", "<f4", [3, 8, 8])]):
        with pytest.raises(ValueError, match="3 x S x S"):
            image_input(bad)


def test_plan_uses_several_photos():
    p = plan(2000, seed=0)
    assert len(photos()) >= 10
    assert len(np.unique(p.photo)) >= 8
    assert ((p.zoom > 0.5) & (p.zoom <= 1.0)).all()


def test_scene_frames_parse_and_bound_scene_lengths():
    assert parse_scene_frames("600:1800") == (600, 1800)
    assert parse_scene_frames("50") == (50, 50)
    for bad in ("0:5", "9:3", "a:b", "1:2:3", ""):
        with pytest.raises(ValueError, match="MIN:MAX"):
            parse_scene_frames(bad)
    p = plan(200, seed=3, min_scene=50, max_scene=50)
    assert np.array_equal(np.bincount(p.scene), [50, 50, 50, 50])
    with pytest.raises(ValueError, match="min_scene"):
        plan(10, min_scene=8, max_scene=4)




def test_unseen_scenes_share_no_photo_with_the_bootstrap_set():
    unseen = dict(photos("unseen"))
    assert len(unseen) >= 10 and not set(unseen) & set(dict(photos()))
    boot = dict(photos())
    # a variant of a bootstrap photo is not that photo: negative, rotated, channels swapped
    assert not np.allclose(unseen["astronaut:negative"], boot["astronaut"])
    assert unseen["coffee:rot90"].shape[:2] == boot["coffee"].shape[1::-1]
    with pytest.raises(ValueError, match="unknown photo set"):
        photos("holiday")


def test_the_unseen_stream_is_another_stream_of_the_same_shape():
    a = next(iter_video_frames(8, seed=1, size=32, chunk=8))[0]
    b, scenes = next(iter_video_frames(8, seed=1, size=32, chunk=8, photo_set="unseen"))
    assert a.shape == b.shape and not np.allclose(a, b) and scenes.shape == (8,)

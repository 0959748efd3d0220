"""Deterministic video-like frame streams made from scikit-image's bundled photos.

A stream is a sequence of scenes: each scene picks a photo and slowly pans and zooms
over it with a brightness drift, then cuts to the next scene. Consecutive frames are
similar (what early exits and windowed threshold tuning exploit) and scene cuts shift
the distribution. Frames are rendered chunk by chunk from a per-frame plan, so a
stream of any length costs little memory and any prefix is identical for a seed.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

# Photos that load offline (no pooch download); the ones that fail are skipped.
PHOTOS = (
    "astronaut",
    "camera",
    "coins",
    "chelsea",
    "coffee",
    "rocket",
    "horse",
    "hubble_deep_field",
    "retina",
    "immunohistochemistry",
    "colorwheel",
    "brick",
    "grass",
    "gravel",
    "moon",
    "page",
    "text",
    "clock",
    "logo",
)
# Scenes the zoo's ramps never trained on (their bootstrap frames come from PHOTOS): other
# photos, and bootstrap photos seen as no bootstrap frame shows them (negative, rotated,
# channels swapped, a mosaic of faces).
UNSEEN = (
    "cat", "cell", "binary_blobs", "checkerboard", "shepp_logan_phantom", "microaneurysms",
    "lfw_subset:mosaic", "astronaut:negative", "coffee:rot90", "rocket:bgr", "horse:negative",
    "chelsea:rot90", "immunohistochemistry:bgr", "retina:negative",
)
PHOTO_SETS = {"bootstrap": PHOTOS, "unseen": UNSEEN}
# EfficientNet-Lite was trained on (x - 127) / 128: mean 0.5, std 0.5 on [0, 1] pixels.
MEAN = 0.5
STD = 0.5
PHOTO_SHORT_SIDE = 288  # photos are pre-scaled so their short side is this many pixels


def to_rgb01(img: np.ndarray) -> np.ndarray:
    img = np.asarray(img)
    if img.dtype == bool:
        img = img.astype(np.float32)
    elif img.dtype == np.uint8:
        img = img.astype(np.float32) / 255.0
    else:
        img = img.astype(np.float32)
        img = (img - img.min()) / max(float(img.max() - img.min()), 1e-6)
    if img.ndim == 2:
        img = np.repeat(img[..., None], 3, axis=-1)
    if img.shape[-1] == 4:  # RGBA: composite over white
        a = img[..., 3:4]
        img = img[..., :3] * a + (1.0 - a)
    return np.ascontiguousarray(img[..., :3])


def _variant(img: np.ndarray, how: str) -> np.ndarray:
    """A photo as no bootstrap frame shows it."""
    if how == "mosaic":  # a stack of small images (lfw faces) tiled into one
        k = int(np.sqrt(len(img)))
        rows = [np.concatenate(list(img[r * k:(r + 1) * k]), axis=1) for r in range(k)]
        return to_rgb01(np.concatenate(rows, axis=0))
    img = to_rgb01(img)
    if how == "negative":
        return 1.0 - img
    if how == "rot90":
        return np.ascontiguousarray(np.rot90(img))
    if how == "bgr":
        return np.ascontiguousarray(img[..., ::-1])
    return img


@lru_cache(maxsize=2)
def photos(photo_set: str = "bootstrap") -> tuple[tuple[str, np.ndarray], ...]:
    """(name, float32 H×W×3 in [0, 1] with short side PHOTO_SHORT_SIDE) for every loadable
    photo of ``photo_set`` (``PHOTO_SETS``)."""
    from skimage import data, transform

    if photo_set not in PHOTO_SETS:
        raise ValueError(f"unknown photo set {photo_set!r}; known: {', '.join(PHOTO_SETS)}")
    out, skipped = [], []
    for name in PHOTO_SETS[photo_set]:
        base, _, how = name.partition(":")
        try:
            img = _variant(getattr(data, base)(), how)
        except Exception as exc:  # noqa: BLE001 - a photo needing a download is skipped
            skipped.append(f"{name}: {type(exc).__name__}")
            continue
        h, w = img.shape[:2]
        k = PHOTO_SHORT_SIDE / min(h, w)
        size = (max(PHOTO_SHORT_SIDE, round(h * k)), max(PHOTO_SHORT_SIDE, round(w * k)))
        img = transform.resize(img, size, anti_aliasing=k < 1, preserve_range=True)
        out.append((name, img.astype(np.float32)))
    if not out:
        raise RuntimeError(f"no scikit-image photo could be loaded ({'; '.join(skipped)})")
    return tuple(out)


@dataclass(frozen=True)
class FramePlan:
    """Per-frame rendering parameters of a whole stream (all arrays of length n)."""

    scene: np.ndarray  # int64 scene id
    photo: np.ndarray  # int64 index into photos()
    cy: np.ndarray  # crop centre, in [0, 1] of the free range
    cx: np.ndarray
    zoom: np.ndarray  # crop side as a fraction of the photo's short side
    gain: np.ndarray  # brightness multiplier
    flip: np.ndarray  # bool, mirror horizontally


SCENE_FRAMES = (16, 120)  # default scene lengths: far more cuts than a fixed camera sees


def parse_scene_frames(text: str) -> tuple[int, int]:
    """``"MIN:MAX"`` (or one number) -> scene lengths in frames, 1 <= MIN <= MAX."""
    parts = text.split(":")
    try:
        lo, hi = (int(parts[0]), int(parts[-1])) if len(parts) <= 2 else (0, -1)
    except ValueError:
        lo, hi = 0, -1
    if not 1 <= lo <= hi:
        raise ValueError(f"scene frames must be MIN:MAX with 1 <= MIN <= MAX, got {text!r}")
    return lo, hi


PIXEL_DTYPES = ("float32", "uint8")  # normalised floats, or the 8-bit pixels cameras give


def image_input(inputs: list) -> tuple[str, int, str]:
    """(name, S, dtype) of a model's only input when it is one 3 x S x S image of float32
    or uint8 (manifest tensor specs), the kind these video streams feed; ValueError
    otherwise."""
    shape = list(inputs[0].shape) if len(inputs) == 1 else []
    dtype = np.dtype(inputs[0].dtype).name if len(inputs) == 1 else ""
    if len(shape) != 3 or shape[0] != 3 or shape[1] != shape[2] or shape[1] <= 0 \
            or dtype not in PIXEL_DTYPES:
        raise ValueError(f"video frames feed one 3 x S x S image input of "
                         f"{' or '.join(PIXEL_DTYPES)}; the model takes "
                         f"{[(t.name, t.dtype, t.shape) for t in inputs]}")
    return inputs[0].name, shape[1], dtype


def plan(n: int, seed: int = 0, min_scene: int = SCENE_FRAMES[0],
         max_scene: int = SCENE_FRAMES[1], photo_set: str = "bootstrap") -> FramePlan:
    if not 1 <= min_scene <= max_scene:
        raise ValueError(f"scene lengths need 1 <= min_scene <= max_scene, got "
                         f"{min_scene}..{max_scene}")
    rng = np.random.default_rng(seed)
    n_photos = len(photos(photo_set))
    cols: dict[str, list[np.ndarray]] = {k: [] for k in FramePlan.__dataclass_fields__}
    done, scene, last_photo = 0, 0, -1
    while done < n:
        # Draw whole scenes and cut the stream afterwards, so any prefix of a longer
        # stream equals the shorter stream.
        length = int(rng.integers(min_scene, max_scene + 1))
        photo = int(rng.integers(n_photos))
        if photo == last_photo:  # a cut should change what is seen
            photo = (photo + 1) % n_photos
        last_photo = photo
        t = np.linspace(0.0, 1.0, length, dtype=np.float64)

        def drift(lo: float, hi: float, step: float, t: np.ndarray = t) -> np.ndarray:
            a = rng.uniform(lo, hi)
            b = np.clip(a + rng.uniform(-step, step), lo, hi)
            return a + (b - a) * t

        cols["scene"].append(np.full(length, scene, np.int64))
        cols["photo"].append(np.full(length, photo, np.int64))
        cols["cy"].append(drift(0.0, 1.0, 0.5))
        cols["cx"].append(drift(0.0, 1.0, 0.5))
        cols["zoom"].append(drift(0.55, 1.0, 0.3))
        cols["gain"].append(drift(0.7, 1.25, 0.3))
        cols["flip"].append(np.full(length, rng.random() < 0.5))
        done += length
        scene += 1
    return FramePlan(**{k: np.concatenate(v)[:n] for k, v in cols.items()})


def _render(img: np.ndarray, cy: float, cx: float, zoom: float, size: int) -> np.ndarray:
    """Bilinear crop-and-resize of a square window (separable: no rotation)."""
    h, w = img.shape[:2]
    side = zoom * min(h, w)
    y0 = cy * (h - side)
    x0 = cx * (w - side)
    grid = (np.arange(size) + 0.5) * (side / size) - 0.5
    ys = np.clip(y0 + grid, 0, h - 1.001)
    xs = np.clip(x0 + grid, 0, w - 1.001)
    yi = ys.astype(np.int64)
    xi = xs.astype(np.int64)
    wy = (ys - yi).astype(np.float32)[:, None, None]
    wx = (xs - xi).astype(np.float32)[None, :, None]
    rows = img[yi] * (1 - wy) + img[yi + 1] * wy
    return rows[:, xi] * (1 - wx) + rows[:, xi + 1] * wx


def _encode(frame: np.ndarray, dtype: str) -> np.ndarray:
    """An H x W x 3 frame in [0, 1] as the model's 3 x H x W input: 8-bit pixels, or
    normalised floats ((x - MEAN) / STD)."""
    if dtype == "uint8":
        return np.rint(frame * 255.0).astype(np.uint8).transpose(2, 0, 1)
    if dtype == "float32":
        return ((frame - MEAN) / STD).astype(np.float32).transpose(2, 0, 1)
    raise ValueError(f"frames come as {' or '.join(PIXEL_DTYPES)}, not {dtype!r}")


def iter_video_frames(
    n: int, seed: int = 0, size: int = 224, chunk: int = 64, min_scene: int = SCENE_FRAMES[0],
    max_scene: int = SCENE_FRAMES[1], dtype: str = "float32", photo_set: str = "bootstrap",
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Yield (frames (k,3,size,size), scene_ids int64 (k,)) chunks. Frames are float32
    normalised, or with ``dtype="uint8"`` 8-bit pixels. Scenes last ``min_scene``..
    ``max_scene`` frames (a fixed camera lasts much longer) and show the photos of
    ``photo_set`` (``"unseen"``: scenes no zoo ramp trained on)."""
    _encode(np.zeros((1, 1, 3), np.float32), dtype)  # a bad dtype fails before any work
    p = plan(n, seed, min_scene, max_scene, photo_set)
    imgs = photos(photo_set)
    # Sensor noise from a small bank indexed by frame number: cheap, and chunking
    # cannot change which noise a frame gets.
    bank = np.random.default_rng((seed, 1)).standard_normal((5, size, size, 3), np.float32)
    bank *= 0.01
    for start in range(0, n, chunk):
        stop = min(start + chunk, n)
        out = np.empty((stop - start, 3, size, size), dtype)
        for j, i in enumerate(range(start, stop)):
            frame = _render(imgs[p.photo[i]][1], p.cy[i], p.cx[i], p.zoom[i], size)
            if p.flip[i]:
                frame = frame[:, ::-1]
            frame = np.clip(frame * np.float32(p.gain[i]) + bank[i % len(bank)], 0.0, 1.0)
            out[j] = _encode(frame, dtype)
        yield out, p.scene[start:stop].copy()


def video_frames(
    n: int, seed: int = 0, size: int = 224, return_scenes: bool = False, dtype: str = "float32"
) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
    """n frames ((n,3,size,size): float32 normalised, or uint8 pixels).

    With ``return_scenes`` also the int64 scene id of every frame. Keep n modest:
    4000 float frames at 224 px are 2.4 GB; use :func:`iter_video_frames` for long streams.
    """
    frames, scenes = [], []
    for f, s in iter_video_frames(n, seed, size, dtype=dtype):
        frames.append(f)
        scenes.append(s)
    x = np.concatenate(frames) if frames else np.zeros((0, 3, size, size), dtype)
    sid = np.concatenate(scenes) if scenes else np.zeros(0, np.int64)
    return (x, sid) if return_scenes else x


def photo_frame(name: str, size: int = 224, dtype: str = "float32") -> np.ndarray:
    """One centred, unzoomed frame (3,size,size) of a named photo, e.g. for sanity checks."""
    for pname, img in photos():
        if pname == name:
            return _encode(np.clip(_render(img, 0.5, 0.5, 1.0, size), 0.0, 1.0), dtype)
    raise KeyError(f"photo {name!r} is not available")

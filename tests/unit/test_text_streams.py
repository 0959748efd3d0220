"""Text corpus parsing/caching/fallback and text streams (no apt or network needed,
except the one optional test of the real download)."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from services.workloads import text_corpus as tc
from services.workloads.streams import make_stream
from services.workloads.text_streams import category_mix, stream_labels, text_stream

TOPICS = ("apples", "boats", "clouds", "drums")


def _write_fortunes(root: Path, per_topic: int = 40) -> Path:
    """A fortune-format folder like the package's usr/share/games/fortunes."""
    d = root / "usr" / "share" / "games" / "fortunes"
    d.mkdir(parents=True)
    for t in TOPICS:
        entries = [f"{t} saying number {i}:\n\tsomething about {t}.\n\t\t-- Author {i}"
                   for i in range(per_topic)]
        (d / t).write_text("\n%\n".join(entries) + "\n%\n", encoding="utf-8")
        (d / f"{t}.dat").write_bytes(b"\x00\x01binary index")
        (d / f"{t}.u8").symlink_to(t)
    return root


def test_parse_fortune_text_cleans_entries() -> None:
    text = ("First  line\n\tsecond line\n%\n\n%\nB_\bo_\bl_\bd and X\bX\n% \nlast\r\n")
    assert tc.parse_fortune_text(text) == ["First line second line", "Bold and X", "last"]


def test_parse_fortune_dir_finds_topics_and_skips_index_files(tmp_path: Path) -> None:
    entries = tc.parse_fortune_dir(_write_fortunes(tmp_path))
    assert sorted(entries) == list(TOPICS)
    assert len(entries["boats"]) == 40
    assert entries["boats"][3] == "boats saying number 3: something about boats. -- Author 3"
    # the folder itself works too
    assert tc.parse_fortune_dir(tmp_path / "usr/share/games/fortunes") == entries
    with pytest.raises(tc.CorpusUnavailable):
        tc.parse_fortune_dir(tmp_path / "nothing")


def test_build_corpus_filters_dedupes_and_drops_ambiguous() -> None:
    entries = {
        "a": ["short a", "short a", "x" * 500, "shared", *[f"a{i}" for i in range(30)]],
        "b": ["short b", "shared", *[f"b{i}" for i in range(30)]],
        "tiny": ["t1", "t2"],
    }
    c = tc.build_corpus(entries, ["a", "b", "tiny"], max_chars=400, min_entries=20)
    assert c.categories == ("a", "b")  # tiny dropped: too few entries
    assert c.counts() == {"a": 31, "b": 31}  # duplicate, long and shared texts removed
    assert "shared" not in c.texts and "x" * 500 not in c.texts
    assert [c.categories[k] for k in c.labels[:2]] == ["a", "a"]
    with pytest.raises(ValueError, match="unknown categories"):
        tc.build_corpus(entries, ["a", "zzz"])


def test_split_is_stratified_and_deterministic(tmp_path: Path) -> None:
    entries = tc.parse_fortune_dir(_write_fortunes(tmp_path))
    c = tc.build_corpus(entries, TOPICS)
    tr, te = c.split(0.25, seed=3)
    assert len(tr) + len(te) == len(c) == 160
    assert te.counts() == {t: 10 for t in TOPICS}
    assert not set(tr.texts) & set(te.texts)
    tr2, te2 = c.split(0.25, seed=3)
    assert tr2.texts == tr.texts and te2.texts == te.texts
    assert c.split(0.25, seed=4)[1].texts != te.texts


def test_load_corpus_caches_parsed_entries(tmp_path: Path) -> None:
    src = _write_fortunes(tmp_path / "src")
    cache = tmp_path / "cache"
    c = tc.load_corpus(cache, categories=TOPICS, fortunes_dir=src)
    assert not c.is_fallback and c.counts() == {t: 40 for t in TOPICS}
    path = cache / tc.CACHE_NAME
    with gzip.open(path, "rt", encoding="utf-8") as f:
        assert sorted(json.load(f)["topics"]) == list(TOPICS)
    shutil.rmtree(src)  # the cache alone now serves the corpus
    again = tc.load_corpus(cache, categories=TOPICS[:2])
    assert again.categories == TOPICS[:2] and again.texts == c.texts[:80]


def test_fallback_when_apt_is_missing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tc, "SYSTEM_FORTUNES", tmp_path / "not-installed")
    monkeypatch.setattr(tc.shutil, "which", lambda name: None)
    with pytest.raises(tc.CorpusUnavailable, match="apt-get is not on PATH"):
        tc.load_corpus(tmp_path / "cache", source="fortunes")
    said: list[str] = []
    c = tc.load_corpus(tmp_path / "cache", warn=said.append)
    assert c.is_fallback and "stdlib" in c.source
    assert said and "FALLING BACK" in said[0] and "apt-get" in said[0]
    assert len(c.categories) >= 6 and min(c.counts().values()) >= 20
    assert not (tmp_path / "cache" / tc.CACHE_NAME).exists()  # fallback is never cached


def _corpus(n_cat: int = 6, per: int = 50) -> tc.TextCorpus:
    entries = {f"cat{c}": [f"text {c}-{i}" for i in range(per)] for c in range(n_cat)}
    return tc.build_corpus(entries, list(entries))


def test_text_stream_is_deterministic_and_prefix_stable() -> None:
    c = _corpus()
    a = text_stream(c, 3000, seed=5)
    assert a == text_stream(c, 3000, seed=5)
    assert a[:1234] == text_stream(c, 1234, seed=5)
    assert [s.text for s in a] != [s.text for s in text_stream(c, 3000, seed=6)]
    assert [s.index for s in a] == list(range(3000))
    for s in a[:50]:
        assert c.texts[s.corpus_index] == s.text and c.labels[s.corpus_index] == s.label
        assert c.categories[s.label] == s.category


def test_text_stream_has_runs() -> None:
    c = _corpus()
    y = stream_labels(text_stream(c, 20_000, seed=1, mean_run=8.0))
    same = float(np.mean(y[1:] == y[:-1]))
    assert same == pytest.approx(1 - 1 / 8, abs=0.02)  # runs end with a topic change
    y1 = stream_labels(text_stream(c, 2000, seed=1, mean_run=1.0))
    assert np.mean(y1[1:] == y1[:-1]) == 0.0


def test_text_stream_covers_category_before_repeating() -> None:
    c = _corpus(n_cat=2, per=30)
    s = [x for x in text_stream(c, 400, seed=2, drift=0.0) if x.label == 0]
    first = [x.corpus_index for x in s[:30]]
    assert len(set(first)) == 30


def _window_shares(y: np.ndarray, n_cat: int, w: int) -> np.ndarray:
    return np.array([np.bincount(y[i:i + w], minlength=n_cat) / w for i in range(0, len(y), w)])


def test_text_stream_mix_drifts() -> None:
    c, n, w = _corpus(), 40_000, 1000
    y = stream_labels(text_stream(c, n, seed=3, drift=1.0, period=8000))
    obs = _window_shares(y, 6, w)
    want = category_mix(6, np.arange(w / 2, n, w), seed=3, drift=1.0, period=8000)
    # The observed mix follows the planned drift...
    assert np.corrcoef(obs.ravel(), want.ravel())[0, 1] > 0.8
    # ...and windows half a period apart differ far more than without drift.
    y0 = stream_labels(text_stream(c, n, seed=3, drift=0.0, period=8000))
    obs0 = _window_shares(y0, 6, w)

    def tv(s: np.ndarray) -> float:
        return float(0.5 * np.abs(s[4:] - s[:-4]).sum(axis=1).mean())

    assert tv(obs) > 0.4 and tv(obs) > 2 * tv(obs0)
    flat = category_mix(6, np.arange(0, 1000, 100), seed=0, drift=0.0)
    assert np.allclose(flat, 1 / 6)


def test_text_stream_argument_errors() -> None:
    with pytest.raises(ValueError, match="mean_run"):
        text_stream(_corpus(), 10, mean_run=0.5)
    with pytest.raises(ValueError, match="drift"):
        text_stream(_corpus(), 10, drift=2.0)


def test_make_stream_text_pairs_items_with_arrivals() -> None:
    c = _corpus()
    s = make_stream("text", 500, seed=4, arrivals_spec="gamma:100:cv2=4", corpus=c)
    pairs = list(s)
    assert len(s) == len(pairs) == 500
    assert np.all(np.diff([t for t, _ in pairs]) >= 0)
    assert [x for _, x in pairs] == text_stream(c, 500, seed=4)
    other = make_stream("text", 500, seed=4, arrivals_spec="poisson:10", corpus=c)
    assert list(other.items()) == list(s.items())  # arrivals do not change the inputs
    assert not np.array_equal(other.arrival_s, s.arrival_s)
    with pytest.raises(ValueError, match="unknown stream kind"):
        make_stream("audio", 5)


def test_make_stream_video_is_lazy_and_repeatable() -> None:
    s = make_stream("video", 6, seed=1, arrivals_spec="poisson:30", size=32, chunk=4)
    first = [(t, f.index, f.scene, f.frame.copy()) for t, f in s]
    assert [i for _, i, _, _ in first] == list(range(6))
    assert first[0][3].shape == (3, 32, 32) and first[0][3].dtype == np.float32
    again = list(s)
    assert all(np.array_equal(a[3], b.frame) for a, (_, b) in zip(first, again))
    from services.workloads.frames import video_frames

    assert np.allclose(np.stack([f for *_, f in first]), video_frames(6, seed=1, size=32))
    pixels = make_stream("video", 6, seed=1, size=32, chunk=4, dtype="uint8")
    assert pixels.meta["dtype"] == "uint8"
    assert np.array_equal(np.stack([f.frame for f in pixels.items()]),
                          video_frames(6, seed=1, size=32, dtype="uint8"))



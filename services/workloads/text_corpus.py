"""A real labelled English text corpus that is available offline: Debian's ``fortunes``.

The text zoo model (``minilm-topics``) needs labelled sentences whose topic a small
classifier can learn and whose topic mix can drift over a stream. The quotes in
Debian's ``fortunes`` package are filed by topic (art, computers, food, law, ...) and
reach us through the one channel this project may use, Debian's package archive:

    apt-get download fortunes          # no root needed, ~0.85 MB .deb, ~2 s here
    dpkg-deb -x fortunes_*.deb DIR     # no root needed; DIR/usr/share/games/fortunes/<topic>

Each topic file holds entries separated by lines containing only ``%``. The parsed
entries of every topic are cached once as gzip JSON (``fortunes-v1.json.gz``, ~1 MB)
under the caller's cache folder (default ``$OFFRAMP_HOME/data``), and :func:`load_corpus`
selects, cleans and dedupes from that cache.

If Debian's archive cannot be reached, :func:`load_corpus` says what failed and how to
fix it, then (unless told not to) falls back loudly to a small labelled corpus built
from the docstrings of Python standard-library modules grouped by area (files, math,
net, text, ...). No better secondary source exists offline: scikit-learn's 20
newsgroups, nltk's corpora and Hugging Face datasets all download at run time, and
nothing this project installs bundles labelled text. The fallback is never cached, so a
later run retries the real corpus.
"""

from __future__ import annotations

import gzip
import importlib
import inspect
import json
import logging
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from services.common import config

log = logging.getLogger("offramp.models.text_corpus")

# Topics with >= ~115 entries of <= 400 characters each that a reader (and hopefully a
# small classifier) can tell apart. Counts after cleaning, fortunes 1:1.99.1-7.3:
# art 421, computers 869, education 181, food 175, law 166, love 139, politics 657,
# science 536, sports 115, work 571 (3,830 in all). medicine has only 56 short entries.
DEFAULT_CATEGORIES = (
    "art", "computers", "education", "food", "law",
    "love", "politics", "science", "sports", "work",
)
MAX_CHARS = 400
SYSTEM_FORTUNES = Path("/usr/share/games/fortunes")
CACHE_NAME = "fortunes-v1.json.gz"
_FORMAT = 1


class CorpusUnavailable(RuntimeError):
    """The real corpus could not be obtained; the message says which step failed and why."""


@dataclass(frozen=True, eq=False)
class TextCorpus:
    """Labelled texts: ``labels[i]`` indexes ``categories``; ``source`` says where they came from."""

    texts: tuple[str, ...]
    labels: np.ndarray  # int64, one per text
    categories: tuple[str, ...]
    source: str

    def __post_init__(self) -> None:
        if len(self.texts) != len(self.labels):
            raise ValueError(f"{len(self.texts)} texts but {len(self.labels)} labels")

    def __len__(self) -> int:
        return len(self.texts)

    @property
    def is_fallback(self) -> bool:
        return not self.source.startswith("debian-fortunes")

    def counts(self) -> dict[str, int]:
        c = np.bincount(self.labels, minlength=len(self.categories))
        return {name: int(k) for name, k in zip(self.categories, c)}

    def subset(self, idx: Sequence[int] | np.ndarray) -> TextCorpus:
        idx = np.asarray(idx, np.int64)
        return TextCorpus(tuple(self.texts[i] for i in idx), self.labels[idx].copy(),
                          self.categories, self.source)

    def split(self, held_out: float = 0.2, seed: int = 0) -> tuple[TextCorpus, TextCorpus]:
        """(train, held-out), stratified per category and deterministic for a seed."""
        if not 0.0 < held_out < 1.0:
            raise ValueError(f"held_out must be in (0, 1), got {held_out}")
        rng = np.random.default_rng(seed)
        train, test = [], []
        for c in range(len(self.categories)):
            idx = np.flatnonzero(self.labels == c)
            idx = idx[rng.permutation(len(idx))]
            k = round(len(idx) * held_out)
            if len(idx) >= 2:
                k = min(max(k, 1), len(idx) - 1)
            test.append(idx[:k])
            train.append(idx[k:])
        tr, te = np.sort(np.concatenate(train)), np.sort(np.concatenate(test))
        return self.subset(tr), self.subset(te)


# ------------------------------------------------------------------------ parsing


_OVERSTRIKE = re.compile(r".\x08")  # nroff bold/underline: "_\bX" or "X\bX"
_SEPARATOR = re.compile(r"(?m)^%[ \t]*$")


def parse_fortune_text(text: str) -> list[str]:
    """Entries of one fortune file: split on ``%`` lines, overstrikes removed, whitespace
    collapsed (the layout carries no topic), empty entries dropped."""
    text = _OVERSTRIKE.sub("", text.replace("\r\n", "\n"))
    out = []
    for raw in _SEPARATOR.split(text):
        entry = " ".join(raw.split())
        if entry:
            out.append(entry)
    return out


def _fortune_files(root: Path) -> dict[str, Path]:
    """Topic name -> file for every fortune data file under ``root`` (a fortunes folder or
    an extracted package tree)."""
    root = Path(root)
    for cand in (root, root / "usr/share/games/fortunes", root / "usr/share/fortune"):
        if cand.is_dir():
            files = {
                p.name: p for p in sorted(cand.iterdir())
                if p.is_file() and not p.is_symlink() and "." not in p.name
            }
            if files:
                return files
    raise CorpusUnavailable(f"no fortune files (topic files without extension) under {root}")


def parse_fortune_dir(root: Path) -> dict[str, list[str]]:
    """Every topic's entries under ``root`` (undecodable bytes are replaced, not fatal)."""
    return {
        name: parse_fortune_text(path.read_bytes().decode("utf-8", errors="replace"))
        for name, path in _fortune_files(root).items()
    }


def build_corpus(
    entries: dict[str, list[str]],
    categories: Sequence[str] | None = DEFAULT_CATEGORIES,
    max_chars: int = MAX_CHARS,
    min_entries: int = 20,
    source: str = "debian-fortunes",
) -> TextCorpus:
    """Select topics, drop entries longer than ``max_chars`` (long ones are mostly poems
    and dialogues, and would be truncated by the tokenizer anyway), dedupe within a topic
    and drop texts filed under two selected topics (their label is ambiguous)."""
    names = sorted(entries) if categories is None else list(categories)
    missing = [c for c in names if c not in entries]
    if missing:
        raise ValueError(f"unknown categories {missing}; available: {sorted(entries)}")
    kept: dict[str, list[str]] = {}
    for c in names:
        seen: dict[str, None] = {}
        for e in entries[c]:
            if len(e) <= max_chars:
                seen.setdefault(e, None)
        kept[c] = list(seen)
    owners: dict[str, int] = {}
    for c in names:
        for e in kept[c]:
            owners[e] = owners.get(e, 0) + 1
    cats, texts, labels = [], [], []
    for c in names:
        items = [e for e in kept[c] if owners[e] == 1]
        if len(items) < min_entries:
            if categories is not None:
                log.warning("category=%s has only %d entries (< %d): dropped", c, len(items),
                            min_entries)
            continue
        texts.extend(items)
        labels.extend([len(cats)] * len(items))
        cats.append(c)
    if len(cats) < 2:
        raise ValueError(f"fewer than 2 categories with >= {min_entries} entries")
    return TextCorpus(tuple(texts), np.asarray(labels, np.int64), tuple(cats), source)


# ------------------------------------------------------------------------ fetching


def _run(cmd: list[str], cwd: Path, timeout_s: float) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive", "LC_ALL": "C"}
    try:
        return subprocess.run(cmd, cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                              capture_output=True, text=True, timeout=timeout_s, check=False)
    except OSError as exc:  # not executable, cwd gone, ...
        raise CorpusUnavailable(f"`{' '.join(cmd)}` could not run: {exc}") from None


def _apt_download(workdir: Path, timeout_s: float, update_if_root: bool) -> Path:
    apt = shutil.which("apt-get")
    if apt is None:
        raise CorpusUnavailable(
            "apt-get is not on PATH (not a Debian/Ubuntu machine?): cannot download the "
            "'fortunes' package. Copy a fortunes_*.deb here and pass deb_path=..., or point "
            "fortunes_dir=... at an extracted usr/share/games/fortunes folder."
        )
    cmd = [apt, "download", "-q", "fortunes"]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        # As root apt drops to the '_apt' user, who cannot write our private temp dir;
        # it would warn and download unsandboxed anyway, so say so up front.
        cmd[2:2] = ["-o", "APT::Sandbox::User=root"]
    for attempt in (1, 2):
        try:
            res = _run(cmd, workdir, timeout_s)
        except subprocess.TimeoutExpired:
            raise CorpusUnavailable(
                f"`apt-get download fortunes` timed out after {timeout_s:.0f} s (is Debian's "
                "package archive reachable?)"
            ) from None
        debs = sorted(workdir.glob("fortunes_*.deb"))
        if res.returncode == 0 and debs:
            return debs[0]
        err = (res.stderr or res.stdout).strip().splitlines()
        detail = err[-1] if err else f"exit code {res.returncode}"
        unknown = "unable to locate" in detail.lower() or "candidate" in detail.lower()
        if attempt == 1 and unknown and update_if_root and os.geteuid() == 0:
            log.warning("apt does not know 'fortunes' (%s): running `apt-get update` once", detail)
            try:
                _run([apt, "update", "-q"], workdir, max(timeout_s, 120.0))
            except subprocess.TimeoutExpired:
                pass
            continue
        hint = ("run `apt-get update` (as root) first" if unknown
                else "check that Debian's package archive is reachable")
        raise CorpusUnavailable(f"`apt-get download fortunes` failed: {detail}; {hint}")
    raise AssertionError("unreachable")


def _extract_deb(deb: Path, dest: Path, timeout_s: float) -> Path:
    dpkg = shutil.which("dpkg-deb")
    if dpkg is None:
        raise CorpusUnavailable(f"dpkg-deb is not on PATH: cannot unpack {deb.name}")
    try:
        res = _run([dpkg, "-x", str(deb), str(dest)], deb.parent, timeout_s)
    except subprocess.TimeoutExpired:
        raise CorpusUnavailable(f"`dpkg-deb -x {deb.name}` timed out") from None
    if res.returncode != 0:
        raise CorpusUnavailable(f"`dpkg-deb -x {deb.name}` failed: {res.stderr.strip()}")
    return dest


def _deb_version(deb: Path) -> str:
    m = re.match(r"fortunes_(.+)_all\.deb$", deb.name)
    return m.group(1).replace("%3a", ":") if m else "unknown"


def fetch_fortunes(
    timeout_s: float = 120.0, deb_path: Path | None = None, update_if_root: bool = True
) -> tuple[dict[str, list[str]], str]:
    """Download (no root needed) and parse Debian's ``fortunes``: (topic -> entries, source).

    Works in a private temporary folder that is removed afterwards; raises
    :class:`CorpusUnavailable` naming the failed step.
    """
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="offramp-fortunes-") as tmp:
        work = Path(tmp)
        deb = Path(deb_path) if deb_path else _apt_download(work, timeout_s, update_if_root)
        if not deb.is_file():
            raise CorpusUnavailable(f"{deb} does not exist")
        t1 = time.perf_counter()
        entries = parse_fortune_dir(_extract_deb(deb, work / "x", timeout_s))
        source = f"debian-fortunes {_deb_version(deb)}"
    log.info("fetched %s: download %.1f s, unpack+parse %.1f s, %d topics", source,
             t1 - t0, time.perf_counter() - t1, len(entries))
    return entries, source


def _default_cache_dir() -> Path:
    return config.load().home / "data"


def _read_cache(path: Path) -> tuple[dict[str, list[str]], str] | None:
    try:
        with gzip.open(path, "rt", encoding="utf-8") as f:
            doc = json.load(f)
        if doc.get("format") != _FORMAT:
            return None
        return {k: list(v) for k, v in doc["topics"].items()}, str(doc["source"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        log.warning("ignoring unreadable corpus cache %s: %s", path, exc)
        return None


def _write_cache(path: Path, entries: dict[str, list[str]], source: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    with gzip.open(tmp, "wt", encoding="utf-8") as f:
        json.dump({"format": _FORMAT, "source": source, "topics": entries}, f,
                  ensure_ascii=False, separators=(",", ":"))
    os.replace(tmp, path)  # atomic: concurrent loaders never see half a file


def fortune_entries(
    cache_dir: Path | None = None,
    fortunes_dir: Path | None = None,
    deb_path: Path | None = None,
    timeout_s: float = 120.0,
    refresh: bool = False,
) -> tuple[dict[str, list[str]], str]:
    """All topics' entries: from the cache, else an installed or given fortunes folder,
    else ``apt-get download``; the result is cached. Raises :class:`CorpusUnavailable`."""
    path = Path(cache_dir if cache_dir is not None else _default_cache_dir()) / CACHE_NAME
    if not refresh and path.is_file():
        cached = _read_cache(path)
        if cached is not None:
            return cached
    local = fortunes_dir
    if local is None and deb_path is None and all(
        (SYSTEM_FORTUNES / c).is_file() for c in DEFAULT_CATEGORIES
    ):
        local = SYSTEM_FORTUNES  # the package is installed: no download needed
    if local is not None:
        entries, source = parse_fortune_dir(Path(local)), f"debian-fortunes dir {local}"
    else:
        entries, source = fetch_fortunes(timeout_s, deb_path)
    _write_cache(path, entries, source)
    log.info("cached %d topics of %s at %s", len(entries), source, path)
    return entries, source


# ------------------------------------------------------------------------ fallback

# Standard-library modules by area: their docstrings are real English text with a
# topic, which is all the fallback needs to keep the pipeline (and its tests) running.
STDLIB_GROUPS: dict[str, tuple[str, ...]] = {
    "files": ("os", "os.path", "shutil", "pathlib", "io", "tempfile", "glob", "fnmatch",
              "filecmp", "stat"),
    "math": ("math", "cmath", "statistics", "fractions", "decimal", "random", "numbers"),
    "net": ("socket", "ssl", "http.client", "http.server", "http.cookiejar", "urllib.request",
            "urllib.parse", "smtplib", "ftplib", "ipaddress", "email.message", "xmlrpc.client"),
    "text": ("string", "re", "textwrap", "difflib", "unicodedata", "codecs", "html",
             "locale", "gettext"),
    "concurrency": ("threading", "multiprocessing", "asyncio", "concurrent.futures", "queue",
                    "sched", "subprocess", "signal", "selectors"),
    "data": ("json", "csv", "pickle", "sqlite3", "zipfile", "tarfile", "gzip", "bz2", "lzma",
             "configparser", "plistlib", "base64", "struct", "shelve"),
    "time": ("datetime", "time", "calendar", "zoneinfo", "timeit"),
    "dev": ("unittest", "doctest", "pdb", "logging", "inspect", "traceback", "warnings",
            "argparse", "trace", "dis", "ast"),
}


def _docstrings(module_name: str, max_chars: int) -> list[str]:
    try:
        mod = importlib.import_module(module_name)
    except Exception:  # noqa: BLE001 - a module missing on this platform is skipped
        return []
    objs: list[object] = [mod]
    for _, obj in sorted(vars(mod).items()):
        if getattr(obj, "__module__", None) == mod.__name__ and (
            inspect.isclass(obj) or inspect.isfunction(obj) or inspect.isbuiltin(obj)
        ):
            objs.append(obj)
            if inspect.isclass(obj):
                objs.extend(m for _, m in sorted(vars(obj).items()) if inspect.isfunction(m))
    out = []
    for obj in objs:
        doc = inspect.getdoc(obj) or ""
        para = " ".join(doc.split("\n\n")[0].split())
        if 30 <= len(para) <= max_chars:
            out.append(para)
    return out


def stdlib_corpus(max_chars: int = MAX_CHARS, min_entries: int = 20) -> TextCorpus:
    """Fallback corpus: first paragraphs of standard-library docstrings, labelled by area."""
    entries = {g: [d for m in mods for d in _docstrings(m, max_chars)]
               for g, mods in STDLIB_GROUPS.items()}
    return build_corpus(entries, tuple(STDLIB_GROUPS), max_chars, min_entries,
                        source="python-stdlib-docstrings (fallback)")


# ------------------------------------------------------------------------ entry point


def load_corpus(
    cache_dir: Path | None = None,
    categories: Sequence[str] | None = DEFAULT_CATEGORIES,
    max_chars: int = MAX_CHARS,
    min_entries: int = 20,
    source: str = "auto",
    fortunes_dir: Path | None = None,
    timeout_s: float = 120.0,
    warn: Callable[[str], None] | None = None,
) -> TextCorpus:
    """The labelled text corpus for text workloads and the ``minilm-topics`` model.

    ``source``: ``"fortunes"`` (the real corpus or :class:`CorpusUnavailable`),
    ``"stdlib"`` (the fallback), or ``"auto"`` (fortunes, falling back with a loud
    warning through ``warn``, default the module logger). Check ``corpus.is_fallback``
    before reporting accuracy numbers.
    """
    if source not in ("auto", "fortunes", "stdlib"):
        raise ValueError(f"source must be auto, fortunes or stdlib, got {source!r}")
    if source != "stdlib":
        try:
            entries, src = fortune_entries(cache_dir, fortunes_dir, timeout_s=timeout_s)
            return build_corpus(entries, categories, max_chars, min_entries, source=src)
        except CorpusUnavailable as exc:
            if source == "fortunes":
                raise
            say = warn or log.warning
            say(f"REAL TEXT CORPUS UNAVAILABLE: {exc}. FALLING BACK to a small corpus of "
                "Python standard-library docstrings labelled by area (files, math, net, "
                "text, ...): results on it are NOT comparable with the fortunes corpus.")
    return stdlib_corpus(max_chars, min_entries)


__all__ = [
    "DEFAULT_CATEGORIES", "CorpusUnavailable", "TextCorpus", "build_corpus", "fetch_fortunes",
    "fortune_entries", "load_corpus", "parse_fortune_dir", "parse_fortune_text",
    "stdlib_corpus",
]

"""Local text for a generative model's exit heads: distillation data and bench streams.

Two kinds of text, kept apart because a later benchmark drifts between them and exit
heads may do well on one and badly on the other:

- ``prose``: English quotes from Debian's ``fortunes`` (the project's parsed cache
  ``$OFFRAMP_HOME/data/fortunes-v1.json.gz``, or an installed ``/usr/share/games/fortunes``).
  Only a preparation (``fetch``) downloads them when neither is there, as preparing
  ``minilm-topics`` does, so heads are distilled from the same text whichever model was
  prepared first; readers such as the benches never download. Without them, the paragraphs
  of the licence texts under ``/usr/share/common-licenses`` and the descriptions of installed
  Python distributions stand in (``Corpus.sources`` says which and why).
- ``code``: Python functions and classes with docstrings from the standard library and
  a few installed packages, read with ``ast`` (never imported): the header and docstring,
  and the body too when the function is short.

Every list comes out in a deterministic order (sorted files, sorted topics); the split
into training and held-out text is by document and seeded, so the held-out text shares no
document with the training text. The model's own generations can join as a third kind
(:func:`with_kind`). Imports no torch.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.metadata
import importlib.util
import sysconfig
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

from services.common import config
from services.workloads import text_corpus

KINDS = ("prose", "code")
LICENSES = Path("/usr/share/common-licenses")
# Installed packages whose sources add docstrings beyond the standard library's (those
# missing are skipped): widely used, well documented, pure-Python sources.
PACKAGES = ("numpy", "sqlalchemy", "alembic", "yaml", "nats", "packaging", "pytest")
# Standard-library folders that are tests, demos or vendored code rather than library text.
_SKIP_DIRS = {"test", "tests", "idlelib", "lib2to3", "tkinter", "turtledemo", "ensurepip",
              "pydoc_data", "site-packages", "dist-packages", "__pycache__", "distutils"}
MIN_CHARS = 40
MAX_DOC_CHARS = 2000   # longer documents are cut: one window of tokens sees ~500 characters
SHORT_BODY_LINES = 25  # a function this short is kept whole (code), else header + docstring


@dataclass(frozen=True)
class Corpus:
    """Documents per kind, split by document into ``train`` and ``held``."""

    train: dict[str, list[str]]
    held: dict[str, list[str]]
    sources: dict[str, str] = field(default_factory=dict)

    @property
    def kinds(self) -> list[str]:
        return sorted(self.train, key=lambda k: (KINDS.index(k) if k in KINDS else len(KINDS), k))

    def key(self) -> str:
        """Content digest: what a distillation made from this corpus depends on."""
        h = hashlib.sha256()
        for kind in self.kinds:
            for part in ("train", "held"):
                h.update(f"\0{kind}\0{part}\0".encode())
                for doc in getattr(self, part)[kind]:
                    h.update(doc.encode() + b"\0")
        return h.hexdigest()[:16]


# ------------------------------------------------------------------------ prose


def fortunes_present(cache_dir: Path | None = None) -> bool:
    """Whether Debian's fortunes are on this machine without downloading anything."""
    cache = Path(cache_dir or config.load().home / "data") / text_corpus.CACHE_NAME
    system = text_corpus.SYSTEM_FORTUNES
    # what fortune_entries reads without downloading: its cache, or every default topic
    return cache.is_file() or all((system / c).is_file() for c in text_corpus.DEFAULT_CATEGORIES)


def _fortunes(cache_dir: Path | None) -> list[str]:
    entries, _ = text_corpus.fortune_entries(cache_dir=cache_dir)
    seen: dict[str, None] = {}
    for topic in sorted(entries):
        for entry in entries[topic]:
            if len(entry) >= MIN_CHARS:
                seen.setdefault(entry[:MAX_DOC_CHARS], None)
    return list(seen)


def _paragraphs(text: str) -> list[str]:
    paras = (" ".join(p.split()) for p in text.replace("\r\n", "\n").split("\n\n"))
    return [p[:MAX_DOC_CHARS] for p in paras if len(p) >= MIN_CHARS and not p.startswith("#")]


def _fallback_prose() -> list[str]:
    seen: dict[str, None] = {}
    if LICENSES.is_dir():
        for path in sorted(p for p in LICENSES.iterdir() if p.is_file() and not p.is_symlink()):
            for p in _paragraphs(path.read_text(errors="replace")):
                seen.setdefault(p, None)
    dists = sorted(importlib.metadata.distributions(), key=lambda d: d.metadata["Name"] or "")
    for dist in dists:
        for p in _paragraphs(dist.metadata.get_payload() or ""):  # the long description
            seen.setdefault(p, None)
    return list(seen)


def prose_documents(cache_dir: Path | None = None,
                    fetch: bool = False) -> tuple[list[str], str]:
    """(documents, source) of the prose kind: fortunes if present (with ``fetch``, downloaded
    and cached when absent), else the fallback."""
    why = "fortunes absent"
    if fetch or fortunes_present(cache_dir):
        try:
            return _fortunes(cache_dir), "debian-fortunes"
        except text_corpus.CorpusUnavailable as exc:
            why = f"fortunes unavailable: {exc}"
    return _fallback_prose(), f"licences+package-descriptions ({why})"


# ------------------------------------------------------------------------ code


def _code_roots() -> list[Path]:
    roots = [Path(sysconfig.get_paths()["stdlib"])]
    for name in PACKAGES:
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.submodule_search_locations:
            roots.append(Path(next(iter(spec.submodule_search_locations))))
    return roots


def _python_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*.py")
                  if not _SKIP_DIRS.intersection(p.relative_to(root).parts[:-1]))


def _render(node: ast.AST, lines: list[str], doc: str) -> str:
    if isinstance(node, ast.Module):
        return f'"""{doc}"""'
    if isinstance(node, ast.ClassDef):
        return f'class {node.name}:\n    """{doc}"""'
    assert isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
    end = node.end_lineno or node.lineno
    if end - node.lineno < SHORT_BODY_LINES:  # decorators left out: the def line on
        return textwrap.dedent("".join(lines[node.lineno - 1:end])).rstrip()
    prefix = "async def" if isinstance(node, ast.AsyncFunctionDef) else "def"
    return f'{prefix} {node.name}({ast.unparse(node.args)}):\n    """{doc}"""'


def file_documents(source: str) -> list[str]:
    """The module, classes and functions with docstrings in one Python source, in order."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    lines = source.splitlines(keepends=True)
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            doc = ast.get_docstring(node)
            if doc and len(doc) >= MIN_CHARS:
                out.append(_render(node, lines, doc)[:MAX_DOC_CHARS])
    return out


def code_documents(max_docs: int = 20000) -> tuple[list[str], str]:
    """(documents, source) of the code kind: every ``stride``-th source file of the
    standard library and ``PACKAGES`` (a fixed stride keeps the parse to a few seconds and
    spreads the text over every module), deduplicated, at most ``max_docs``."""
    files = [f for root in _code_roots() for f in _python_files(root)]
    stride = 3
    seen: dict[str, None] = {}
    for path in files[::stride]:
        for doc in file_documents(path.read_text(encoding="utf-8", errors="replace")):
            seen.setdefault(doc, None)
        if len(seen) >= max_docs:
            break
    return list(seen)[:max_docs], f"python docstrings ({len(files) // stride} files)"


# ------------------------------------------------------------------------ splits


def _rank(doc: str, seed: int) -> str:
    return hashlib.sha256(f"{seed}\0{doc}".encode()).hexdigest()


def split_documents(docs: list[str], held_out: float = 0.2,
                    seed: int = 0) -> tuple[list[str], list[str]]:
    """(train, held) by document, both in a seeded order that does not depend on the order
    ``docs`` came in (a document's place follows from its text and the seed)."""
    if not 0.0 < held_out < 1.0:
        raise ValueError(f"held_out must be in (0, 1), got {held_out}")
    ordered = sorted(set(docs), key=lambda d: _rank(d, seed))
    k = max(1, round(len(ordered) * held_out)) if len(ordered) > 1 else 0
    return ordered[k:], ordered[:k]


def build_corpus(kinds: dict[str, list[str]], held_out: float = 0.2, seed: int = 0,
                 sources: dict[str, str] | None = None) -> Corpus:
    train, held = {}, {}
    for kind, docs in kinds.items():
        train[kind], held[kind] = split_documents(docs, held_out, seed)
    return Corpus(train, held, dict(sources or {}))


def load_corpus(seed: int = 0, held_out: float = 0.2, cache_dir: Path | None = None,
                fetch: bool = False) -> Corpus:
    """Prose and code, split by document (deterministic for a seed and a machine's files);
    ``fetch``: download the fortunes when absent (preparations)."""
    prose, prose_src = prose_documents(cache_dir, fetch)
    code, code_src = code_documents()
    return build_corpus({"prose": prose, "code": code}, held_out, seed,
                        {"prose": prose_src, "code": code_src})


def with_kind(corpus: Corpus, kind: str, docs: list[str], source: str,
              held_out: float = 0.2, seed: int = 0) -> Corpus:
    """The corpus with one more kind (e.g. the model's own generations)."""
    train, held = split_documents(docs, held_out, seed)
    return Corpus({**corpus.train, kind: train}, {**corpus.held, kind: held},
                  {**corpus.sources, kind: source})

"""The generative model's local corpus: two separable kinds, documents read from Python
sources with ast (never imported), deterministic seeded splits by document, and the
prose fallback when Debian's fortunes are not on the machine (nothing is downloaded)."""

from __future__ import annotations

import pytest

from services.zoo import llm_corpus as lc

SOURCE = '''"""A module docstring that is long enough to be kept as a document."""

def short(x):
    """Return x doubled, which is a short function kept whole."""
    return 2 * x


class Thing:
    """A class whose docstring is long enough to be kept too."""

    def tiny(self):
        """Too short."""


def undocumented():
    return 1
'''


def test_file_documents_keep_documented_code_in_order():
    docs = lc.file_documents(SOURCE)
    assert docs[0] == '"""A module docstring that is long enough to be kept as a document."""'
    assert 'def short(x):\n    """Return x doubled' in docs[1] and "return 2 * x" in docs[1]
    assert docs[2].startswith('class Thing:\n    """A class whose docstring')
    assert len(docs) == 3  # short docstrings and undocumented functions are left out
    assert lc.file_documents("def broken(:\n") == []


def test_long_functions_keep_header_and_docstring_only():
    body = "\n".join(f"    y{i} = {i}" for i in range(lc.SHORT_BODY_LINES + 5))
    src = f'def long(a, b=2):\n    """Docstring of a long function, kept without its body."""\n{body}\n'
    (doc,) = lc.file_documents(src)
    assert doc == 'def long(a, b=2):\n    """Docstring of a long function, kept without its body."""'


def test_split_is_by_document_deterministic_and_order_free():
    docs = [f"document number {i}" for i in range(100)]
    train, held = lc.split_documents(docs, 0.2, seed=3)
    assert len(held) == 20 and len(train) == 80 and not set(train) & set(held)
    assert lc.split_documents(list(reversed(docs)), 0.2, seed=3) == (train, held)
    assert lc.split_documents(docs, 0.2, seed=4) != (train, held)
    with pytest.raises(ValueError):
        lc.split_documents(docs, 1.0)


def test_corpus_kinds_are_separate_and_keyed_by_content():
    kinds = {"code": [f"def f{i}(): pass" for i in range(10)],
             "prose": [f"Quote {i} about art." for i in range(10)]}
    c = lc.build_corpus(kinds, seed=0)
    assert c.kinds == ["prose", "code"]
    assert all(d.startswith("def") for d in c.train["code"] + c.held["code"])
    assert all(d.startswith("Quote") for d in c.train["prose"] + c.held["prose"])
    assert c.key() == lc.build_corpus(kinds, seed=0).key() != lc.build_corpus(kinds, seed=1).key()
    more = lc.with_kind(c, "generated", ["a generated text", "another one"], "the model")
    assert more.kinds == ["prose", "code", "generated"] and c.kinds == ["prose", "code"]
    assert more.key() != c.key()


def test_prose_falls_back_without_fortunes(tmp_path, monkeypatch):
    monkeypatch.setattr(lc.text_corpus, "SYSTEM_FORTUNES", tmp_path / "absent")
    monkeypatch.setattr(lc.text_corpus, "fetch_fortunes", lambda *a, **k: pytest.fail("download"))
    licences = tmp_path / "licences"
    licences.mkdir()
    (licences / "MIT").write_text("Permission is hereby granted, free of charge, to any person.\n"
                                  "\nShort.\n\nTHE SOFTWARE IS PROVIDED AS IS, WITHOUT WARRANTY.")
    monkeypatch.setattr(lc, "LICENSES", licences)
    assert not lc.fortunes_present(tmp_path)
    docs, source = lc.prose_documents(tmp_path)
    assert "fortunes absent" in source
    assert docs[:2] == ["Permission is hereby granted, free of charge, to any person.",
                        "THE SOFTWARE IS PROVIDED AS IS, WITHOUT WARRANTY."]


def test_a_preparation_downloads_absent_fortunes_once_and_says_why_it_could_not(
        tmp_path, monkeypatch):
    monkeypatch.setattr(lc.text_corpus, "SYSTEM_FORTUNES", tmp_path / "absent")
    monkeypatch.setattr(lc, "LICENSES", tmp_path / "no-licences")
    quote = "A quote long enough to be a document of its own, about work."
    fetched = []

    def fetch(*a, **k):
        fetched.append(1)
        return {"work": [quote, "Too short."]}, "debian-fortunes 1.99"

    monkeypatch.setattr(lc.text_corpus, "fetch_fortunes", fetch)
    cache = tmp_path / "cache"
    assert "fortunes absent" in lc.prose_documents(cache)[1] and not fetched  # readers don't
    assert lc.prose_documents(cache, fetch=True) == ([quote], "debian-fortunes")
    assert lc.prose_documents(cache, fetch=True) == ([quote], "debian-fortunes")
    assert fetched == [1] and lc.fortunes_present(cache)  # cached: downloaded once

    def fail(*a, **k):
        raise lc.text_corpus.CorpusUnavailable("apt-get download fortunes-min failed")

    monkeypatch.setattr(lc.text_corpus, "fetch_fortunes", fail)
    _, source = lc.prose_documents(tmp_path / "other", fetch=True)
    assert source == ("licences+package-descriptions (fortunes unavailable: "
                      "apt-get download fortunes-min failed)")


def test_prose_reads_installed_fortunes_and_caches_them(tmp_path, monkeypatch):
    system = tmp_path / "fortunes"
    system.mkdir()
    quote = "A quote long enough to be a document of its own, about work."
    for topic in lc.text_corpus.DEFAULT_CATEGORIES:
        (system / topic).write_text(f"{quote}\n%\nToo short.\n%\n")
    monkeypatch.setattr(lc.text_corpus, "SYSTEM_FORTUNES", system)
    monkeypatch.setattr(lc.text_corpus, "fetch_fortunes", lambda *a, **k: pytest.fail("download"))
    cache = tmp_path / "cache"
    assert lc.fortunes_present(cache)
    assert lc.prose_documents(cache) == ([quote], "debian-fortunes")
    (system / "art").unlink()  # the cache written on the first read is enough now
    assert lc.fortunes_present(cache) and lc.prose_documents(cache)[0] == [quote]
    assert not lc.fortunes_present(tmp_path / "elsewhere")

"""The real fortunes corpus, fetched with apt where apt is there."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from services.workloads import text_corpus as tc


def test_real_fortunes_download(tmp_path: Path) -> None:
    """Optional: the real `apt-get download fortunes` (skipped where apt cannot fetch it)."""
    if shutil.which("apt-get") is None or shutil.which("dpkg-deb") is None:
        pytest.skip("apt-get/dpkg-deb not available")
    try:
        entries, source = tc.fetch_fortunes(timeout_s=60, update_if_root=False)
    except (tc.CorpusUnavailable, subprocess.SubprocessError) as exc:
        pytest.skip(f"apt-get download fortunes failed here: {exc}")
    assert source.startswith("debian-fortunes")
    c = tc.build_corpus(entries)
    assert c.categories == tc.DEFAULT_CATEGORIES
    assert min(c.counts().values()) >= 100 and len(c) > 3000

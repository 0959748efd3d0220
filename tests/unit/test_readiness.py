"""`offramp up` is ready only once every service it started says it serves."""

from __future__ import annotations

import os

from services.common.readiness import READY_FILE_ENV, is_ready, mark_ready, ready_file


def test_mark_ready_writes_the_pid_only_when_asked(tmp_path, monkeypatch):
    monkeypatch.delenv(READY_FILE_ENV, raising=False)
    mark_ready()  # started by hand: nothing to tell, nothing written
    assert list(tmp_path.iterdir()) == []
    monkeypatch.setenv(READY_FILE_ENV, str(tmp_path / "tuner"))
    mark_ready()
    assert is_ready(tmp_path / "tuner", os.getpid())
    assert not is_ready(tmp_path / "tuner", os.getpid() + 1)  # an earlier run's file
    assert not is_ready(tmp_path / "router", os.getpid())


def test_ready_file_starts_clear(tmp_path):
    stale = tmp_path / "ready" / "tuner"
    stale.parent.mkdir()
    stale.write_text(f"{os.getpid()}\n")  # an earlier process whose pid came round again
    path = ready_file(tmp_path, "tuner")
    assert path == stale and not path.exists()
    assert not is_ready(path, os.getpid())

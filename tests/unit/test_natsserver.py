"""The embedded NATS server's scheduler setting (GOMAXPROCS)."""

from __future__ import annotations

from services.launcher import natsserver


def test_small_machine_gets_one_go_scheduler(monkeypatch):
    monkeypatch.delenv("GOMAXPROCS", raising=False)
    monkeypatch.setattr(natsserver.os, "cpu_count", lambda: 2)
    assert natsserver.server_env()["GOMAXPROCS"] == "1"
    monkeypatch.setattr(natsserver.os, "cpu_count", lambda: 16)
    assert "GOMAXPROCS" not in natsserver.server_env()  # Go's default on big machines


def test_explicit_procs_and_a_users_gomaxprocs(monkeypatch):
    monkeypatch.setattr(natsserver.os, "cpu_count", lambda: 2)
    assert natsserver.server_env(procs=3)["GOMAXPROCS"] == "3"
    monkeypatch.setenv("GOMAXPROCS", "2")
    assert natsserver.server_env()["GOMAXPROCS"] == "2"



"""The embedded NATS server's scheduler setting (GOMAXPROCS)."""

from __future__ import annotations

from services.common import natsserver


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


def test_the_server_starts_with_that_environment(tmp_path):
    with natsserver.EmbeddedNats(tmp_path / "nats", procs=1) as srv:
        environ = open(f"/proc/{srv.proc.pid}/environ", "rb").read().split(b"\0")
        assert b"GOMAXPROCS=1" in environ

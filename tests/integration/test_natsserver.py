"""The embedded nats-server starts with the environment it was given."""

from __future__ import annotations

from pathlib import Path

from services.launcher import natsserver


def test_the_server_starts_with_that_environment(tmp_path):
    with natsserver.EmbeddedNats(tmp_path / "nats", procs=1) as srv:
        environ = Path(f"/proc/{srv.proc.pid}/environ").read_bytes().split(b"\0")
        assert b"GOMAXPROCS=1" in environ

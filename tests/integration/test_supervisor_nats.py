"""The supervisor keeps its embedded nats-server: a dead one is restarted on its port, and
one that cannot come back stops `up` with an error instead of leaving services retrying."""

from __future__ import annotations

import socket

import pytest

from services.common import config as config_mod
from services.launcher.natsserver import EmbeddedNats
from services.launcher.supervisor import Deployment, Supervisor


def _supervisor(tmp_path) -> Supervisor:
    sup = Supervisor(config_mod.load(), Deployment(()))
    sup.nats = EmbeddedNats(tmp_path / "nats")
    sup.nats.start()
    return sup


def test_a_dead_embedded_server_is_restarted_on_the_same_port(tmp_path):
    sup = _supervisor(tmp_path)
    try:
        port, old = sup.nats.port, sup.nats.proc
        old.kill()
        old.wait()
        sup.poll()
        assert sup.nats.proc is not old and sup.nats.proc.poll() is None
        assert sup.nats.port == port and sup.nats_restarts == 1
        with socket.create_connection(("127.0.0.1", port), timeout=2):
            pass
        assert sup.pids()["nats"] == sup.nats.proc.pid
    finally:
        sup.nats.stop()


def test_a_server_that_cannot_come_back_is_an_error(tmp_path):
    sup = _supervisor(tmp_path)
    proc = sup.nats.proc
    proc.kill()
    proc.wait()
    with socket.socket() as taken:  # someone else took the port meanwhile
        taken.bind(("127.0.0.1", sup.nats.port))
        taken.listen()
        with pytest.raises(RuntimeError, match="could not be restarted"):
            sup.poll()
    sup.nats.stop()


def test_a_server_left_by_a_killed_launcher_is_stopped_by_the_next(tmp_path):
    left = EmbeddedNats(tmp_path / "nats")
    left.start()  # its launcher "dies": nobody will stop this one
    other = EmbeddedNats(tmp_path / "elsewhere")
    other.start()  # another folder's server is not touched
    try:
        assert not EmbeddedNats(tmp_path / "fresh").stop_stale()
        nxt = EmbeddedNats(tmp_path / "nats")
        nxt.start()
        try:
            assert left.proc.wait(10) is not None  # the stale server stopped
            assert nxt.proc.poll() is None and other.proc.poll() is None
            with socket.create_connection(("127.0.0.1", nxt.port), timeout=2):
                pass
        finally:
            nxt.stop()
    finally:
        left.stop()
        other.stop()

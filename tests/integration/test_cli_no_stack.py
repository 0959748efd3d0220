"""With no stack up, client commands say so in one line (with the fix) and exit 1, instead
of a traceback and a warning per reconnect attempt (runs `offramp` in process)."""

import socket

import pytest

from services.cli.main import main


@pytest.fixture
def dead_url(tmp_path, monkeypatch):
    with socket.socket() as s:  # a port nobody listens on once closed
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"nats://127.0.0.1:{port}"
    monkeypatch.setenv("OFFRAMP_HOME", str(tmp_path))
    monkeypatch.setenv("OFFRAMP_NATS_URL", url)
    return url


def test_a_client_without_a_stack_gets_one_error_line(dead_url, capsys, caplog):
    assert main(["status"]) == 1  # infer and generate take the same path, 10 s later
    err = capsys.readouterr().err
    assert f"error: cannot reach NATS at {dead_url}" in err and "offramp up" in err
    assert "Traceback" not in err
    refused = [r for r in caplog.records if "nats error" in r.getMessage()]
    assert len(refused) <= 2  # the first refusal (and at most one other error), not one each try


def test_status_on_a_server_with_no_stack_says_so_without_bus_errors(tmp_path, monkeypatch,
                                                                     capsys, caplog):
    from services.launcher.natsserver import EmbeddedNats

    nats = EmbeddedNats(tmp_path / "nats")
    url = nats.start()
    try:
        monkeypatch.setenv("OFFRAMP_HOME", str(tmp_path))
        monkeypatch.setenv("OFFRAMP_NATS_URL", url)
        assert main(["status"]) == 0
        out = capsys.readouterr().out
        assert "router: no router answered" in out and "is `offramp up` running?" in out
        # the server's no-responders notice is not an answer that fails to decode
        assert not [r for r in caplog.records if "nats error" in r.getMessage()]
    finally:
        nats.stop()

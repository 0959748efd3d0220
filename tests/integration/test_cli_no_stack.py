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
        assert main(["status"]) == 1  # nothing serves: a script waiting on it keeps waiting
        out = capsys.readouterr().out
        assert "router: no router answered" in out and "is `offramp up` running?" in out
        # the server's no-responders notice is not an answer that fails to decode
        assert not [r for r in caplog.records if "nats error" in r.getMessage()]
    finally:
        nats.stop()


def test_the_client_names_a_missing_router_for_infer_and_generate(tmp_path):
    import asyncio

    import numpy as np

    from services.common import bus
    from services.common.client import InferError, generate, infer
    from services.launcher.natsserver import EmbeddedNats

    nats = EmbeddedNats(tmp_path / "nats")
    url = nats.start()

    async def run() -> tuple[InferError, InferError]:
        nc = await bus.connect(url, "no-router")
        try:
            with pytest.raises(InferError) as inferred:
                # resent until the deadline, as for a restarting router; then the last error
                await infer(nc, "m", {"x": np.zeros(3, np.float32)}, timeout=0.6,
                            resend_after_s=0.2)
            with pytest.raises(InferError) as streamed:
                async for _ in generate(nc, "m", "hi", max_tokens=4, silence_s=5.0):
                    pass
            return inferred.value, streamed.value
        finally:
            await nc.close()

    try:
        inferred, streamed = asyncio.run(run())
    finally:
        nats.stop()
    assert inferred.code == "no_responders" and "offramp.infer.m" in inferred.message
    assert streamed.code == "no_responders" and "offramp.generate.m" in streamed.message

"""End to end on the trivial model split into two stages: bad input gets the right error
code and the services keep serving; model metadata; a monitor restart loses nothing."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import uuid

import msgpack
import numpy as np
import pytest

from schemas import subjects
from schemas.codec import pack, unpack
from services.common.client import models as list_models
from services.loadgen.drive import drive
from services.monitor.service import ACK_WAIT_S
from tests.e2e.conftest import wait_for

pytestmark = pytest.mark.e2e
MODEL = "tiny"


STACK_ARGS = ["--split", "tiny=2"]


def _x(seed: int = 0, shape=(16,), dtype=np.float32) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


async def _raw(nc, subject: str, data: bytes) -> dict:
    return unpack((await nc.request(subject, data, timeout=5)).data)


def test_bad_input_gets_right_error_codes_and_service_keeps_serving(stack):
    good = {"v": 1, "id": "ok-1", "model": MODEL, "inputs": {"x": _x()}, "slo_ms": 2000.0}

    async def run():
        nc = await stack.connect("client", "e2e-bad")
        got = {}
        got["malformed"] = await _raw(nc, "offramp.infer.tiny", b"\xc1\xff\x00garbage")
        got["not_map"] = await _raw(nc, "offramp.infer.tiny", msgpack.packb([1, 2, 3]))
        got["version"] = await _raw(nc, "offramp.infer.tiny", pack({**good, "v": 99, "id": "v99"}))
        got["shape"] = await _raw(nc, "offramp.infer.tiny",
                                  pack({**good, "id": "s", "inputs": {"x": _x(shape=(17,))}}))
        got["dtype"] = await _raw(nc, "offramp.infer.tiny",
                                  pack({**good, "id": "d", "inputs": {"x": _x(dtype=np.float64)}}))
        got["batch_axis"] = await _raw(nc, "offramp.infer.tiny",
                                       pack({**good, "id": "b", "inputs": {"x": _x(shape=(2, 16))}}))
        got["missing_input"] = await _raw(nc, "offramp.infer.tiny",
                                          pack({**good, "id": "m", "inputs": {"y": _x()}}))
        bad_tensor = msgpack.ExtType(1, msgpack.packb(["<f4", [16], b"\x00" * 3]))
        got["bad_tensor"] = await _raw(nc, "offramp.infer.tiny",
                                       msgpack.packb({**{k: v for k, v in good.items() if k != "inputs"},
                                                      "id": "t", "inputs": {"x": bad_tensor}}))
        got["no_id"] = await _raw(nc, "offramp.infer.tiny", pack({k: v for k, v in good.items() if k != "id"}))
        got["slo"] = await _raw(nc, "offramp.infer.tiny", pack({**good, "id": "slo", "slo_ms": -5}))
        got["unknown"] = await _raw(nc, "offramp.infer.nosuchmodel", pack({**good, "id": "u"}))
        got["good"] = await _raw(nc, "offramp.infer.tiny", pack(good))
        await nc.close()
        return got

    got = asyncio.run(run())
    for case in ("malformed", "not_map", "version", "shape", "dtype", "batch_axis",
                 "missing_input", "bad_tensor", "no_id", "slo"):
        assert got[case]["error"]["code"] == "bad_request", (case, got[case])
        assert got[case]["error"]["message"]
    assert got["version"]["id"] == "v99"
    assert got["unknown"]["error"]["code"] == "unknown_model"
    assert "error" not in got["good"] and got["good"]["id"] == "ok-1"
    assert set(got["good"]) >= {"v", "id", "model", "outputs", "label", "score", "exit", "early",
                                "latency_ms", "config_version"}
    assert got["good"]["outputs"]["logits"].shape == (10,)


def test_models_metadata(stack):
    async def run():
        nc = await stack.connect("client", "e2e-models")
        ms = await list_models(nc)
        await nc.close()
        return ms

    (m,) = asyncio.run(run())
    assert m == {"name": "tiny", "ready": True, "inputs": [{"name": "x", "dtype": "<f4", "shape": [16]}],
                 "outputs": [{"name": "logits", "dtype": "<f4", "shape": [10]}], "classes": 10}


def test_two_stage_split_early_exits_in_both_stages(stack):
    bad = stack.cli("exit-config", MODEL, "--threshold", "1.5")  # scores lie in [0, 1]
    assert bad.returncode == 2 and "must be in [0, 1]" in bad.stdout, (bad.stdout, bad.stderr)
    bad = stack.cli("exit-config", MODEL, "--set", "99=0.1")
    assert bad.returncode == 2 and "unknown ramp(s) [99]" in bad.stdout, bad.stdout
    out = stack.cli("exit-config", MODEL, "--threshold", "0.5", "--active", "all")
    assert out.returncode == 0, out.stderr
    inputs = [{"x": _x(i)} for i in range(300)]

    async def run():
        nc = await stack.connect("client", "e2e-split")
        await asyncio.sleep(0.3)
        outs = await drive(nc, MODEL, inputs, concurrency=16, slo_ms=5000)
        await nc.close()
        return outs

    outs = asyncio.run(run())
    assert all(o.ok for o in outs), {o.code for o in outs}
    exits = {o.exit for o in outs}
    # tiny has ramps after blocks 0, 1 (stage 0) and 2 (stage 1), and a final layer.
    assert -1 in exits and len(exits) >= 3, exits
    stack.cli("exit-config", MODEL, "--threshold", "0")


async def _send_tagged(stack, prefix: str, n: int):
    nc = await stack.connect("client", "e2e-monitor")
    from services.common.client import infer

    sem = asyncio.Semaphore(16)

    async def one(i):
        async with sem:
            return await infer(nc, MODEL, {"x": _x(i)}, 5000, request_id=f"{prefix}-{i}")

    replies = await asyncio.gather(*(one(i) for i in range(n)))
    await nc.close()
    return replies


def test_a_lost_telemetry_stream_is_recreated_and_history_goes_on(stack):
    """The server loses its JetStream store (killed, its store directory gone: no role may
    delete the stream); `up` restarts it and the services re-create stream and consumer."""
    tag = uuid.uuid4().hex[:6]

    def stored(prefix: str) -> int:
        return stack.sql("select count(*) from requests where request_id like ?", f"{prefix}-%")[0][0]

    asyncio.run(_send_tagged(stack, f"c{tag}", 100))
    assert wait_for(lambda: stored(f"c{tag}") == 100)
    shutil.rmtree(stack.home / "nats" / "jetstream")
    os.kill(stack.pids["nats"], signal.SIGKILL)
    # the monitor re-creates stream and consumer; its sequence numbers start again at 1,
    # which must not make the monitor take new telemetry for what it stored before
    assert wait_for(lambda: _stream_exists(stack), timeout=15)
    asyncio.run(_send_tagged(stack, f"d{tag}", 100))
    assert wait_for(lambda: stored(f"d{tag}") == 100, timeout=30)
    assert stored(f"c{tag}") == 100


def _stream_exists(stack) -> bool:
    async def check():
        try:
            nc = await stack.connect("monitor", "e2e-check")
        except Exception:  # noqa: BLE001 - the server is not back yet
            return False
        try:
            await nc.jetstream().stream_info(subjects.TELEMETRY_STREAM)
            return True
        except Exception:  # noqa: BLE001 - not (yet) there
            return False
        finally:
            await nc.close()

    return asyncio.run(check())


def test_monitor_restart_loses_no_committed_telemetry(stack):
    tag = uuid.uuid4().hex[:6]

    def send(prefix: str, n: int):
        return _send_tagged(stack, prefix, n)

    def stored(prefix: str) -> int:
        return stack.sql("select count(*) from requests where request_id like ?", f"{prefix}-%")[0][0]

    asyncio.run(send(f"a{tag}", 200))
    assert wait_for(lambda: stored(f"a{tag}") == 200)
    os.kill(stack.pids["monitor"], signal.SIGKILL)
    asyncio.run(send(f"b{tag}", 200))   # telemetry piles up in JetStream meanwhile
    # The supervisor restarts the monitor; it resumes from its durable consumer. Messages
    # the killed monitor had fetched but not acknowledged come again after the ack wait.
    assert wait_for(lambda: stored(f"b{tag}") == 200, timeout=ACK_WAIT_S + 30)
    assert stored(f"a{tag}") == 200     # nothing counted twice
    dup = stack.sql("select count(*) - count(distinct request_id) from requests "
                    "where request_id like ? or request_id like ?", f"a{tag}-%", f"b{tag}-%")[0][0]
    assert dup == 0

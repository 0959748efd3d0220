"""Open-loop load (services.loadgen.drive.drive_open): sends on schedule, however many pend."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

from services.common.client import InferError
from services.loadgen import drive as load


def test_sends_on_schedule_without_waiting_for_answers(monkeypatch):
    sent: list[tuple[int, float]] = []
    events: list[str] = []

    async def fake_infer(nc, model, inputs, slo_ms, timeout, request_id=None):
        loop = asyncio.get_running_loop()
        sent.append((inputs["i"], loop.time()))
        events.append("send")
        await asyncio.sleep(0.05)               # every answer outlives the next arrival
        events.append("answer")
        if inputs["i"] == 2:
            raise InferError("overloaded", "full")
        return {"early": inputs["i"] == 1, "exit": 3, "label": 7, "config_version": 4}

    monkeypatch.setattr(load, "infer", fake_infer)
    arrivals = np.array([0.0, 0.01, 0.02, 0.03])
    t0 = time.monotonic()  # the event loop's clock: the run starts no earlier
    outs = asyncio.run(load.drive_open(None, "m", [{"i": i} for i in range(4)], arrivals))
    assert [o.index for o in outs] == [0, 1, 2, 3]
    assert [i for i, _ in sent] == [0, 1, 2, 3]
    assert events[:4] == ["send"] * 4            # all four were sent before the first answer
    # never before its time (a pacing thread sleeps until each send is due)
    assert all(t - t0 >= a for (_, t), a in zip(sent, arrivals, strict=True))
    assert [o.ok for o in outs] == [True, True, False, True] and outs[2].code == "overloaded"
    assert outs[1].early and not outs[0].early and outs[0].config_version == 4
    assert all(o.latency_ms >= 50.0 for o in outs)  # from the scheduled arrival


def test_needs_one_arrival_per_input():
    with pytest.raises(ValueError, match="arrival times"):
        asyncio.run(load.drive_open(None, "m", [{}, {}], np.array([0.0])))


def test_await_config_probes_until_an_answer_carries_the_version(monkeypatch):
    versions = iter([3, 3, 4, 5])
    calls = []

    async def fake_infer(nc, model, inputs, slo_ms, timeout, request_id=None):
        calls.append(inputs)
        v = next(versions)
        if len(calls) == 2:
            raise InferError("no_workers", "restarting")   # an error is retried, not fatal
        return {"config_version": v}

    monkeypatch.setattr(load, "infer", fake_infer)
    assert asyncio.run(load.await_config(None, "m", 4, {"x": 1})) == 3
    assert all(c == {"x": 1} for c in calls)


def test_await_config_gives_up_with_a_clear_error(monkeypatch):
    async def fake_infer(nc, model, inputs, slo_ms, timeout, request_id=None):
        return {"config_version": 1}

    monkeypatch.setattr(load, "infer", fake_infer)
    with pytest.raises(RuntimeError, match="exit config v2"):
        asyncio.run(load.await_config(None, "m", 2, {}, timeout_s=0.05))

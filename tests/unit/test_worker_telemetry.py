"""Telemetry coalescing: same-config batches merge into one message; a config change,
the sample cap or the age limit flushes; nothing is lost or reordered."""

import numpy as np

from schemas.messages import decode_map
from schemas.telemetry import SampleTelemetry
from services.worker.telemetry import TelemetryBuffer


def part(batch: str, ids: list[str], version: int = 1, ramps=(0, 2)) -> SampleTelemetry:
    n, r = len(ids), len(ramps)
    return SampleTelemetry(
        model="m", worker="w", batch_id=batch, batch_ids=[batch], batch_sizes=[n],
        config_version=version, mode="latency", score="max_softmax",
        thresholds={0: 0.1, 2: 0.2}, active=list(ramps), ids=ids, ramp_ids=list(ramps),
        ramp_pred=np.arange(r * n, dtype=np.int32).reshape(r, n),
        ramp_score=np.full((r, n), 0.5, np.float32), exit_at=np.full(n, -1, np.int32),
        final_pred=np.arange(n, dtype=np.int32), final_score=np.zeros(n, np.float32),
        batch_size=n, stage_ms=[[0.1]], t=100.0 + n)


def test_same_config_batches_merge_in_order():
    buf = TelemetryBuffer(max_samples=64, max_age_s=0.05)
    assert buf.add(part("a", ["1", "2"]), 0.0) == []
    assert buf.add(part("b", ["3"]), 0.01) == []
    assert buf.due(0.02) is None
    msg = buf.due(0.06)
    assert msg.ids == ["1", "2", "3"] and msg.batch_ids == ["a", "b"] and msg.batch_id == "b"
    assert msg.batch_sizes == [2, 1] and msg.batch_size == 3
    assert msg.stage_ms == [[0.1], [0.1]] and msg.t == 101.0
    assert msg.ramp_pred.shape == (2, 3)
    np.testing.assert_array_equal(msg.ramp_pred[:, 2], [0, 1])  # b's column
    np.testing.assert_array_equal(msg.final_pred, [0, 1, 0])
    assert buf.due(1.0) is None and not buf.parts
    # the merged message is a valid message: it decodes to what was merged
    back = SampleTelemetry.decode(decode_map(msg.encode()))
    assert back.ids == msg.ids and back.batch_ids == msg.batch_ids
    np.testing.assert_array_equal(back.ramp_pred, msg.ramp_pred)


def test_config_change_and_cap_flush():
    buf = TelemetryBuffer(max_samples=4, max_age_s=10)
    buf.add(part("a", ["1"]), 0)
    out = buf.add(part("b", ["2"], version=2), 0)  # another config: the old one goes first
    assert [m.batch_ids for m in out] == [["a"]]
    out = buf.add(part("c", ["3", "4", "5"], version=2), 0)  # reaches the cap
    assert [m.ids for m in out] == [["2", "3", "4", "5"]]
    single = TelemetryBuffer(max_samples=1)
    (one,) = single.add(part("d", ["6"], ramps=(1,)), 0)
    assert one.batch_ids == ["d"] and one.stage_ms == [[0.1]] and one.ramp_ids == [1]

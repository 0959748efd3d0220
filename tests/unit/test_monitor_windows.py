"""Monitor windows: agreement of the deployed config, exit rates, window boundaries."""

from __future__ import annotations

import numpy as np

from schemas.messages import decode_map
from schemas.telemetry import SampleTelemetry
from services.monitor.profile_windows import SampleBatch, WindowTracker


def _batch(key: str, exit_at, ramp_pred, final, version: int = 1, t: float = 100.0) -> SampleBatch:
    return SampleBatch(key=key, model="m", config_version=version, t=t, ramp_ids=[0, 1],
                       ramp_pred=np.array(ramp_pred), exit_at=np.array(exit_at),
                       final_pred=np.array(final))


def test_answers_use_the_exit_ramp_prediction():
    b = _batch("1", [0, -1, 1], [[5, 5, 5], [7, 7, 8]], [5, 6, 7])
    assert b.answers().tolist() == [5, 6, 8]


def test_a_sample_telemetry_message_is_one_sample_batch():
    tel = SampleTelemetry(
        model="m", worker="w", batch_id="b", batch_ids=["b"], batch_sizes=[3], config_version=2,
        mode="latency", score="max_softmax", thresholds={0: 0.1, 1: 0.1}, active=[0, 1],
        ids=["a", "b", "c"], ramp_ids=[0, 1], ramp_pred=np.array([[5, 5, 5], [7, 7, 8]], np.int32),
        ramp_score=np.zeros((2, 3), np.float32), exit_at=np.array([0, -1, 1], np.int32),
        final_pred=np.array([5, 6, 7], np.int32), final_score=np.zeros(3, np.float32),
        batch_size=3, stage_ms=[[0.5]], t=100.0)
    b = SampleBatch.of("9", SampleTelemetry.decode(decode_map(tel.encode())))
    assert (b.key, b.model, b.config_version, b.t, b.ramp_ids) == ("9", "m", 2, 100.0, [0, 1])
    assert b.answers().tolist() == [5, 6, 8]


def test_window_closes_at_message_boundary_with_hand_computed_stats():
    tracker = WindowTracker(size=4)
    # 3 samples: s0 exits at ramp 0 agreeing, s1 exits at ramp 1 disagreeing, s2 runs to the end.
    assert tracker.add(_batch("1", [0, 1, -1], [[1, 9, 9], [1, 3, 2]], [1, 2, 2])) == []
    (win,) = tracker.add(_batch("2", [-1, -1], [[0, 0], [0, 0]], [4, 4], t=101.0))
    assert win.samples == 5 and win.first_key == "1" and win.keys == ["1", "2"]
    assert win.agreement == 4 / 5
    rows = {r["ramp"]: r for r in win.rows()}
    assert rows[-1]["exit_rate"] == 2 / 5 and rows[-1]["samples"] == 5
    assert rows[0]["exit_rate"] == 1 / 5 and rows[0]["agreement"] == 1 / 5   # ramp 0 right on s0 only
    assert rows[1]["agreement"] == 2 / 5                                     # ramp 1 right on s0 and s2 of msg 1
    assert rows[-1]["window_end"] > rows[-1]["window_start"]


def test_new_config_version_closes_the_window():
    tracker = WindowTracker(size=100)
    tracker.add(_batch("1", [-1], [[1], [1]], [1], version=1))
    closed = tracker.add(_batch("2", [-1], [[1], [1]], [1], version=2))
    assert [w.config_version for w in closed] == [1]
    assert [w.config_version for w in tracker.flush()] == [2]
    assert tracker.flush() == []


def test_windows_measure_the_agreement_of_a_depth_cap_at_each_ramp():
    tracker = WindowTracker(size=3)
    # s0 exits at ramp 0 (agrees); s1 and s2 run on and the final layer answers both right.
    # A cap at ramp 0 answers them with ramp 0's 9 and 2 (s1 wrong); a cap at ramp 1 keeps
    # s0's exit and answers s1, s2 with ramp 1's 2 and 2 (all right).
    (win,) = tracker.add(_batch("1", [0, -1, -1], [[1, 9, 2], [1, 2, 2]], [1, 2, 2]))
    rows = {r["ramp"]: r for r in win.rows()}
    assert rows[0]["cap_agreement"] == 2 / 3 and rows[1]["cap_agreement"] == 1.0
    assert rows[-1]["cap_agreement"] == rows[-1]["agreement"] == 1.0
    (win,) = tracker.add(_batch("2", [-1, -1, -1], [[4, 6, 0], [0, 6, 0]], [4, 6, 0]))
    rows = {r["ramp"]: r for r in win.rows()}
    assert rows[0]["cap_agreement"] == 1.0 and rows[1]["cap_agreement"] == 2 / 3

"""Recording a replay trace from a prepared model (services.sim.trace.record_trace)."""

from __future__ import annotations

import numpy as np

from services.sim.trace import Trace


def test_round_trip_keeps_float64_scores(tmp_path) -> None:
    score = np.array([[0.1, 0.123456789012345]])
    tr = Trace(np.zeros((1, 2), int), score, np.zeros(2, int), np.array([1.0, 2.0]),
               np.array([0.1]), None, {"k": 1})
    back = Trace.load(tr.save(tmp_path / "t.npz"))
    assert np.array_equal(back.ramp_score, score) and back.arrival_s is None
    assert back.meta == {"k": 1}



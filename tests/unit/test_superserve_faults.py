"""The live SuperServe bench's faults trace: which worker dies when, and the per-second
timeline of attainment, accuracy and variants."""

from __future__ import annotations

import numpy as np

from services.bench.superserve_faults import kill_plan, over_time
from services.loadgen.drive import Outcome


def test_each_worker_is_killed_in_turn() -> None:
    assert kill_plan("m", 2, 40.0) == [(10.0, "worker-m-s0-r0"), (20.0, "worker-m-s0-r1")]
    assert kill_plan("m", 1, 8.0) == [(2.0, "worker-m-s0-r0"), (4.0, "worker-m-s0-r0")]


def test_the_timeline_buckets_by_arrival_and_scores_attained_answers_only() -> None:
    times = np.array([0.1, 0.5, 0.9, 1.2, 1.8, 3.5])
    outs = [Outcome(0, True, 10.0, variant="a"), Outcome(1, True, 90.0, variant="b"),
            Outcome(2, False, 5.0, "no_workers"), Outcome(3, True, 20.0, variant="b"),
            Outcome(4, True, 30.0, variant="b"), Outcome(5, True, 40.0, variant="a")]
    score = {0: 1.0, 1: 0.0, 3: 0.5, 4: 0.7, 5: 0.2}
    tl = over_time(outs, times, lambda o: score[o.index], slo_ms=50.0)
    assert tl["t"] == [0.0, 1.0, 3.0]  # no arrivals in [2, 3): no point
    assert tl["requests"] == [3, 2, 1]
    assert tl["attainment"] == [1 / 3, 1.0, 1.0]
    assert tl["accuracy"] == [1.0, 0.6, 0.2]
    assert tl["top_variant"] == ["a", "b", "a"]

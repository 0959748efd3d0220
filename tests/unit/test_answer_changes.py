"""How often the full model's answer changes along a stream: counted, described, printed
beside the demo's and the benches' savings."""

from __future__ import annotations

import numpy as np
import pytest

from services.loadgen.demo import print_summary
from services.workloads.answer_changes import AnswerChanges, answer_changes


def test_counts_consecutive_pairs_that_differ():
    ch = answer_changes([3, 3, 5, 5, 5, 3, 3, 3, 7])
    assert (ch.changes, ch.pairs) == (3, 8)
    assert ch.share == pytest.approx(3 / 8)
    assert ch.to_dict() == {"changes": 3, "pairs": 8, "share": 3 / 8}
    assert AnswerChanges.from_dict(ch.to_dict()) == ch  # as a JSON document holds it
    assert "3 times in 8 (37.5%, once every 2.7)" in ch.describe()


def test_flicker_on_a_period_counts_every_flip():
    # a full model that flips on one noise phase of five: two changes per period
    answers = np.tile([971, 971, 971, 971, 111], 40)
    assert answer_changes(answers).changes == 2 * 40 - 1


@pytest.mark.parametrize("answers", [[], [4], np.zeros(0, np.int64)])
def test_short_streams_have_no_change(answers):
    ch = answer_changes(answers)
    assert (ch.changes, ch.share) == (0, 0.0)
    assert "0 times in 0 (0.0%)" in ch.describe()


def test_a_steady_stream_says_so():
    assert "0 times in 99 (0.0%)" in answer_changes([2] * 100).describe()


def test_answers_must_be_one_label_per_sample():
    with pytest.raises(ValueError, match="one label per sample"):
        answer_changes(np.zeros((4, 10)))


def test_the_demo_prints_the_streams_answer_changes(capsys):
    run = {"ok": 10, "errors": 0, "p25_ms": 1.0, "p50_ms": 2.0, "p95_ms": 3.0,
           "early_share": 0.0, "agreement": 1.0, "config_versions": 1, "throughput_rps": 5.0}
    print_summary({"model": "m", "requests": 10, "concurrency": 1, "arrivals": None,
                    "vanilla": run, "offramp": {**run, "early_share": 0.5},
                    "answer_changes": AnswerChanges(4, 9).to_dict(), "deployment": {}})
    out = capsys.readouterr().out
    assert "stream: the full model's answer changes between consecutive samples 4 times in 9" \
        in out and "vanilla's answers" in out

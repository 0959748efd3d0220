"""Feedback runs giving way to waiting requests (services/worker/feedback_backlog.py), as a
policy and in a worker running the prepared EfficientNet-Lite0 stage."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from services.common import config as config_mod
from services.worker.feedback_backlog import FeedbackBacklog, SetAside


def _item(name: str) -> SetAside:
    return SetAside(SimpleNamespace(batch_id=name), None, 0.0, np.zeros(1, np.int32))


def test_only_a_feedback_only_run_is_stopped_and_only_with_room() -> None:
    b = FeedbackBacklog(cap=1)
    assert not b.preempt()                       # nothing running
    ro = SimpleNamespace(terminate=False)
    b.only_feedback_left(ro, rerun=False)
    assert b.preempt() and ro.terminate
    b.set_aside(_item("a"), rerun=False)
    b.run_over()
    ro2 = SimpleNamespace(terminate=False)
    b.only_feedback_left(ro2, rerun=False)
    assert not b.preempt() and not ro2.terminate  # full: this run goes to the end
    ro3 = SimpleNamespace(terminate=False)
    b.only_feedback_left(ro3, rerun=True)         # a re-run holds its place: always gives way
    assert b.preempt() and ro3.terminate
    assert b.cut == 1 and len(b) == 1


def test_reruns_go_back_to_the_front() -> None:
    b = FeedbackBacklog(cap=4)
    for name in "abc":
        b.set_aside(_item(name), rerun=False)
    first = b.take()
    b.set_aside(first, rerun=True)
    assert [i.batch.batch_id for i in b.items] == ["a", "b", "c"] and b.cut == 3
    with pytest.raises(ValueError, match=">= 0"):
        FeedbackBacklog(-1)
    assert not FeedbackBacklog(0).enabled


def test_config_rejects_a_negative_backlog(monkeypatch) -> None:
    monkeypatch.setenv("OFFRAMP_FEEDBACK_BACKLOG", "-2")
    with pytest.raises(config_mod.ConfigError, match="OFFRAMP_FEEDBACK_BACKLOG"):
        config_mod.load()



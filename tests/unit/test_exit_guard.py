"""The worker's exit guard (services/exits/exit_guard.py) and its replay twin."""

from __future__ import annotations

import numpy as np
import pytest

from services.exits.exit_guard import ALERT_BACKOFF, ExitGuard
from services.sim.replay import make_controller, run_offramp
from services.sim.trace import Trace
from services.tuner.controller import DEFAULT_BACKOFF


def test_a_wrong_early_answer_caps_its_ramp_until_the_next_config() -> None:
    g = ExitGuard(0.25)
    ramp_ids = [2, 5]
    pred = np.array([[1, 7, 3, 4], [1, 2, 3, 9]])
    score = np.array([[0.1, 0.2, 0.3, 0.4], [0.05, 0.06, 0.07, 0.08]])
    final = np.array([1, 2, 3, 4])
    exit_at = np.array([2, 2, 5, -1])  # sample 1 answered wrongly at ramp 2; 3 by the model
    assert g.observe(ramp_ids, pred, score, exit_at, final) == {2: pytest.approx(0.05)}
    assert g.thresholds({2: 0.3, 5: 0.2}) == {2: pytest.approx(0.05), 5: 0.2}
    # a wrong answer only ever lowers a cap; right answers and final ones change nothing
    assert g.observe(ramp_ids, pred, score * 2, exit_at, final) == {}
    assert g.observe(ramp_ids, pred, score / 2, exit_at, final) == {2: pytest.approx(0.025)}
    assert g.thresholds({2: 0.01}) == {2: 0.01} and g.engaged == 2
    # a ramp the run did not record (another stage's) cannot be judged
    assert g.observe([5], pred[1:], score[1:], np.array([2, 2, 2, 2]), final) == {}
    g.clear()
    assert g.caps == {} and g.thresholds({2: 0.3}) == {2: 0.3}


def test_the_guard_backs_off_as_the_controllers_alert_does() -> None:
    assert DEFAULT_BACKOFF == ALERT_BACKOFF
    with pytest.raises(ValueError, match="backoff"):
        ExitGuard(1.5)


def _turning(n: int = 600) -> Trace:
    """Ramp 0 is right and confident for the first half, then confidently wrong; ramp 1
    is always right and a little less confident."""
    rng = np.random.default_rng(3)
    final = rng.integers(0, 10, n)
    turn = np.arange(n) >= n // 2
    pred = np.stack([np.where(turn, (final + 1) % 10, final), final])
    score = np.stack([np.full(n, 0.04), np.full(n, 0.08)])
    return Trace(pred, score, final, np.array([2.0, 5.0, 10.0]), np.array([0.1, 0.1]),
                 np.arange(n) * 0.05)


def test_in_replay_the_guard_holds_agreement_while_decisions_are_late() -> None:
    tr = _turning()
    late = {g: run_offramp(tr, tr.arrival_s, make_controller(tr), delay_s=3.0, exit_guard=g)
            for g in (False, True)}
    wrong = {g: int((r.answer != tr.final_pred).sum()) for g, r in late.items()}
    # without the guard ramp 0 keeps answering wrongly until the alert's config arrives
    # (3 s = 60 samples later); with it, one wrong answer and ramp 0 is capped
    assert wrong[False] >= 20
    assert wrong[True] <= 3
    assert (late[True].exit_site[tr.n_samples // 2 + 5:] != 0).all()
    assert late[True].extra["counts"]["guard_caps"] >= 1  # what the bench reports
    assert late[False].extra["counts"]["guard_caps"] == 0
    # with decisions at once the guard has nothing to add
    now = {g: run_offramp(tr, tr.arrival_s, make_controller(tr), delay_s=0.0, exit_guard=g)
           for g in (False, True)}
    assert (now[False].answer == now[True].answer).all()

"""Worker policy code: exit decisions, stage planning, stage execution with a fake runtime."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from schemas.messages import ExitConfig
from services.exits.decide import exits_at, ramp_outcome
from services.exits.initial import initial_config
from services.worker.service import plan_stages
from services.worker.stage_exec import execute


def test_ramp_outcome_labels_and_scores():
    logits = np.array([[0.0, 10.0, 0.0], [1.0, 1.0, 1.0]], np.float32)
    labels, scores = ramp_outcome(logits, "max_softmax")
    assert labels.tolist()[0] == 1
    assert scores[0] < 0.01 and abs(scores[1] - 2 / 3) < 1e-5   # 1 - max softmax


def test_exits_only_below_threshold_for_active_unexited_samples():
    cfg = ExitConfig("m", 3, thresholds={0: 0.3, 1: 0.0}, active=[0, 1])
    scores = np.array([0.1, 0.3, 0.5, 0.05], np.float32)
    exit_at = np.array([-1, -1, -1, 1], np.int32)
    assert exits_at(0, scores, exit_at, cfg).tolist() == [True, False, False, False]
    assert not exits_at(1, scores, exit_at, cfg).any()        # threshold 0 never exits
    inactive = ExitConfig("m", 3, thresholds={0: 0.9}, active=[])
    assert not exits_at(0, scores, exit_at, inactive).any()


def test_initial_config_exits_nothing():
    cfg = initial_config("m", [0, 1, 2])
    assert cfg.version == 0 and cfg.active == [0, 1, 2] and set(cfg.thresholds.values()) == {0.0}


def test_plan_stages():
    assert plan_stages(12, []) == [(0, 12)]
    assert plan_stages(12, [4, 9]) == [(0, 4), (4, 9), (9, 12)]
    assert plan_stages(12, [9, 4, 4, 0, 12]) == [(0, 4), (4, 9), (9, 12)]


class FakeRuntime:
    """Block b adds 1; ramp r answers class r with a confidence that grows with the input."""

    def run_block(self, b, x, model_inputs=None):
        x = x["x"] if isinstance(x, dict) else x
        return x + 1.0

    def run_range(self, start, end, x, model_inputs=None, ramp=None):
        for b in range(start, end):
            x = self.run_block(b, x, model_inputs)
        return x, None if ramp is None else self.run_ramp(ramp, x)

    def run_ramp(self, r, x):
        logits = np.zeros((x.shape[0], 4), np.float32)
        logits[:, r] = x[:, 0] * 5
        return logits


def test_execute_records_every_active_ramp_and_exits_early_once():
    ramps = [SimpleNamespace(index=0, after_block=0), SimpleNamespace(index=1, after_block=1)]
    cfg = ExitConfig("m", 7, thresholds={0: 0.1, 1: 0.5}, active=[0, 1])
    x = {"x": np.array([[-1.0], [2.0]], np.float32)}  # sample 1 is confident at ramp 0
    early = []
    out = execute(FakeRuntime(), ramps, 0, 3, x, np.full(2, -1, np.int32), cfg,
                  lambda r, idx, lab, sc, lg: early.append((r, idx.tolist(), lab.tolist())))
    assert out.ramp_ids == [0, 1] and len(out.ramp_pred) == 2
    assert out.exit_at.tolist() == [1, 0]             # sample 0 exits later, at ramp 1
    assert early == [(0, [1], [0]), (1, [0], [1])]
    assert out.output.shape == (2, 1) and float(out.output[0, 0]) == 2.0


def test_execute_skips_inactive_ramps():
    ramps = [SimpleNamespace(index=0, after_block=0)]
    cfg = ExitConfig("m", 1, thresholds={0: 0.9}, active=[])
    out = execute(FakeRuntime(), ramps, 0, 1, {"x": np.zeros((1, 1), np.float32)},
                  np.full(1, -1, np.int32), cfg)
    assert out.ramp_ids == [] and out.exit_at.tolist() == [-1]


class FakeTappedRuntime(FakeRuntime):
    """The same arithmetic as one tapped call: each ramp's tap decides in site order from
    inside ``run_tapped`` as ``ramp_tap.c`` does; ``report`` lets a test break that contract."""

    first_block, last_block = 0, 3

    def __init__(self, report=None):
        self.calls, self.report = [], report

    def tapped(self, ramps):
        return ("session", ramps)

    def run_tapped(self, sess, x, model_inputs, plan, exit_at, on_exit=None):
        _, ramps = sess
        self.calls.append(ramps)
        site = {0: 0, 1: 1}
        x = x["x"] if isinstance(x, dict) else x
        outcomes = []
        for b in range(self.first_block, self.last_block):
            x = x + 1.0
            for r in ramps if self.report is None else self.report:
                if site[r] == b:
                    logits = self.run_ramp(r, x)
                    labels, score = ramp_outcome(logits, "max_softmax")
                    th = plan.thresholds[r] if r < plan.thresholds.size else 0.0
                    rows = np.flatnonzero((exit_at < 0) & (score < th)) if th > 0 else []
                    exit_at[rows] = r
                    if len(rows) and on_exit is not None:
                        on_exit(r, rows, labels[rows], score[rows], logits[rows])
                    outcomes.append(np.stack([labels, score], axis=1).astype(np.float32))
        return x, outcomes


def test_execute_tapped_makes_the_same_decisions_in_one_call():
    ramps = [SimpleNamespace(index=0, after_block=0), SimpleNamespace(index=1, after_block=1)]
    cfg = ExitConfig("m", 7, thresholds={0: 0.1, 1: 0.5}, active=[1, 0])
    x = {"x": np.array([[-1.0], [2.0]], np.float32)}
    rt, early = FakeTappedRuntime(), []
    out = execute(rt, ramps, 0, 3, x, np.full(2, -1, np.int32), cfg,
                  lambda r, idx, lab, sc, lg: early.append((r, idx.tolist(), lab.tolist())))
    assert rt.calls == [(0, 1)]                        # one call, ramps in site order
    assert out.ramp_ids == [0, 1] and out.exit_at.tolist() == [1, 0]
    assert early == [(0, [1], [0]), (1, [0], [1])]
    assert float(out.output[0, 0]) == 2.0


def test_execute_tapped_fails_the_batch_when_a_tap_does_not_report():
    ramps = [SimpleNamespace(index=0, after_block=0), SimpleNamespace(index=1, after_block=1)]
    cfg = ExitConfig("m", 7, thresholds={0: 0.1, 1: 0.5}, active=[0, 1])
    x = {"x": np.array([[-1.0], [2.0]], np.float32)}
    with pytest.raises(RuntimeError, match="reported"):
        execute(FakeTappedRuntime(report=[0]), ramps, 0, 3, x, np.full(2, -1, np.int32), cfg)


def test_execute_splits_a_partial_range_even_when_taps_exist():
    ramps = [SimpleNamespace(index=0, after_block=0)]
    cfg = ExitConfig("m", 7, thresholds={0: 0.1}, active=[0])
    rt = FakeTappedRuntime()
    out = execute(rt, ramps, 0, 2, {"x": np.zeros((1, 1), np.float32)},
                  np.full(1, -1, np.int32), cfg)
    assert rt.calls == [] and out.ramp_ids == [0]

"""Per-head thresholds from token-level feedback (services.tuner.generation_thresholds):
raised to the smallest threshold whose tokens meet the agreement target, probed down when
comfortably above it, left alone with too little feedback."""

from __future__ import annotations

import pytest

from services.tuner.generation_thresholds import NEVER, GenerationThresholds, raise_to


def test_raise_to_finds_the_smallest_threshold_meeting_the_target():
    tokens = [(0.99, 1), (0.95, 1), (0.9, 1), (0.85, 0), (0.8, 1), (0.7, 0), (0.6, 0)]
    assert raise_to(tokens, 0.75) == 0.8   # 4 of the 5 at >= 0.8 agree
    assert raise_to(tokens, 1.0) == 0.9    # every token at >= 0.9 agrees
    assert raise_to([(0.9, 0), (0.8, 0)], 0.5) == NEVER
    # ties: a threshold lets out every token at its confidence, not some of them
    assert raise_to([(0.9, 1), (0.8, 1), (0.8, 0)], 0.9) == 0.9


def test_a_head_below_target_is_raised_and_its_window_restarts():
    g = GenerationThresholds(target=0.9, min_tokens=10, window=50)
    g.observe([(24, 0.95, 1)] * 8 + [(24, 0.91, 0)] * 2 + [(27, 0.99, 1)] * 5)
    (move,) = g.decide({24: 0.9}, 0.9)
    assert (move.layer, move.before, move.after, move.agreement, move.tokens) == \
        (24, 0.9, 0.95, 0.8, 10)
    assert len(g.seen[24]) == 0 and len(g.seen[27]) == 5  # 27: too few tokens to judge
    assert "head 24: 0.900 -> 0.950" in move.text()


def test_a_head_well_above_target_is_probed_down_but_not_below_the_floor():
    g = GenerationThresholds(target=0.9, min_tokens=10, window=50, step=0.05, floor=0.8)
    g.observe([(21, 0.97, 1)] * 20)
    (move,) = g.decide({}, 0.9)  # no tuned threshold yet: the configured one
    assert (move.before, move.after) == (0.9, 0.85)
    g.observe([(21, 0.97, 1)] * 20)
    assert g.decide({21: 0.85}, 0.9)[0].after == 0.8
    g.observe([(21, 0.97, 1)] * 20)
    assert g.decide({21: 0.8}, 0.9) == []  # at the floor
    g = GenerationThresholds(target=0.9, min_tokens=10, window=50)
    g.observe([(21, 0.97, 1)] * 19 + [(21, 0.97, 0)] * 2)  # 0.905: within the 0.05 margin
    assert g.decide({21: 0.85}, 0.9) == []


def test_bad_parameters_are_refused():
    with pytest.raises(ValueError):
        GenerationThresholds(target=0.0)
    with pytest.raises(ValueError):
        GenerationThresholds(target=0.9, min_tokens=10, window=5)

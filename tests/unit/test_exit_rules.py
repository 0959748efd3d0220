"""Exit rules replayed on a hand-made trace: the layers each token needs, its agreement with
the full model, the heads it is scored by, and the bound."""

from __future__ import annotations

import pytest

from services.sim.exit_rules import Rule, replay, standard_rules
from services.sim.helios_trace import CandidateTrace, HeadTrace, PromptTrace, Timing

# 4 tokens; heads after layers 2 and 4 of 6. Full tokens 7, 5, 6, 4.
HEADS = {
    2: HeadTrace((0.95, 0.6, 0.2, 0.6), (7, 9, 1, 4), (0.0,) * 4),
    4: HeadTrace((0.99, 0.9, 0.3, 0.95), (7, 5, 2, 3), (0.0,) * 4),
}
PROMPT = PromptTrace("x", "prose", 2, (7, 5, 6, 4), (0.0,) * 4, HEADS)
TRACE = CandidateTrace("c", "fam", "c", 6, 10, 20, 1, 4, 2,
                       Timing((1,), (5.0,), (1.0,), 3.0, 6), (PROMPT,))


def test_confidence_rule_is_the_decoders():
    o = replay(TRACE, Rule("confidence", 0.8))
    # token 0 leaves at 2 (right), 1 at 4 (right), 2 runs all 6, 3 at 4 (wrong: 3 != 4)
    assert o.mean_layers == pytest.approx((2 + 4 + 6 + 4) / 4)
    assert o.agreement == 0.75 and o.heads_scored == pytest.approx((1 + 2 + 2 + 2) / 4)
    assert o.bound == pytest.approx(6 / 4)


def test_patience_waits_for_agreeing_heads():
    o = replay(TRACE, Rule("patience", 0.5, patience=2))
    # only token 0's heads agree (7, 7): it leaves at 4; the rest run all 6 layers
    assert o.mean_layers == pytest.approx((4 + 6 + 6 + 6) / 4) and o.agreement == 1.0


def test_oracle_and_first_head():
    o = replay(TRACE, Rule("oracle"))
    # token 0 at 2, 1 at 4 (head 2 says 9), 2 never, 3 at 2
    assert o.mean_layers == pytest.approx((2 + 4 + 6 + 2) / 4) and o.agreement == 1.0
    upper = replay(TRACE, Rule("oracle", first_head=3))
    assert upper.mean_layers == pytest.approx((4 + 4 + 6 + 6) / 4)
    assert upper.heads_scored == 1.0


def test_bad_rules_and_the_standard_set():
    with pytest.raises(ValueError):
        replay(TRACE, Rule("guess"))
    with pytest.raises(ValueError):
        replay(TRACE, Rule("patience", 0.5, patience=0))
    rules = standard_rules([3, 6, 9, 12])
    assert {r.kind for r in rules} == {"oracle", "confidence", "patience"}
    assert {r.first_head for r in rules} == {1, 9}

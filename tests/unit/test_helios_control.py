"""HELIOS's live loop (services.optimizer.helios_control): evaluation in turn, the choice once
the PHT covers the evaluation, a new assessment every RI requests, breaches answered only
for the decision in force."""

from __future__ import annotations

from services.optimizer.helios import Candidate, PhtRow, SwitchCosts
from services.optimizer.helios_control import Served, Settings, next_step, on_breach

A = Candidate("a", "tok", 24, (6, 12, 24), layer_bytes=100, fixed_bytes=200,
              kv_bytes_per_token_layer=1, tokens_per_s=1.0, perplexity=1.0)
B = Candidate("b", "tok", 32, (8, 16, 32), layer_bytes=400, fixed_bytes=800,
              kv_bytes_per_token_layer=2, tokens_per_s=1.0, perplexity=1.0)
S = Settings(ri=20, eval_prompts=3, memory_budget=100_000, tokens_per_request=10)


def _current(kind: str, candidate: str, depth: int, assessment: int, id_: int = 1) -> dict:
    return {"id": id_, "kind": kind, "candidate": candidate, "depth": depth,
            "assessment": assessment}


def _pht(candidate: str, depth: int, tps: float, dist: dict, tokens: int, a: int = 1) -> PhtRow:
    return PhtRow(candidate, a, depth, tps, 10.0, 1000.0 / tps, 2.0, dist, 1000, tokens)


def test_the_first_assessment_starts_by_evaluating_the_best_candidate_fully_loaded():
    step = next_step(None, [A, B], [], [], S)
    assert (step.kind, step.candidate, step.depth, step.assessment) == ("evaluate", "a", 24, 1)
    assert step.batch == (100_000 - 200 - 2400) // (24 * 10)
    assert next_step(None, [], [], [], S) is None  # nothing to serve with


def test_evaluation_runs_each_candidate_its_share_then_waits_for_the_pht():
    ev_a = _current("evaluate", "a", 24, 1)
    assert next_step(ev_a, [A, B], [Served("a", 24, 2, 40)], [], S) is None
    step = next_step(ev_a, [A, B], [Served("a", 24, 3, 60)], [], S)
    assert (step.kind, step.candidate, step.depth, step.assessment) == ("evaluate", "b", 32, 1)
    ev_b = _current("evaluate", "b", 32, 1, 2)
    served = [Served("a", 24, 3, 60, 60), Served("b", 32, 3, 50, 30)]  # b's row lags
    assert next_step(ev_b, [A, B], served, [], S) is None


def test_after_the_evaluation_the_fastest_candidate_serves_at_its_greedy_depth():
    ev_b = _current("evaluate", "b", 32, 1, 2)
    served = [Served("a", 24, 3, 60, 60), Served("b", 32, 3, 50, 50)]
    pht = [_pht("a", 24, 40.0, {6: 0.6, 12: 0.1, 24: 0.3}, 60),
           _pht("b", 32, 25.0, {8: 0.75, 32: 0.25}, 50)]
    step = next_step(ev_b, [A, B], served, pht, S)
    # a at 6: 40 * 12 / 6 = 80 tok/s; b at 8: 25 * 14 / 8 = 43.75 tok/s
    assert (step.kind, step.candidate, step.depth, step.assessment) == ("switch", "a", 6, 1)
    assert "a@6: 80.00 tok/s" in step.reason and step.batch == (100_000 - 800) // 60


def test_a_new_assessment_every_ri_requests_and_none_in_between():
    serving = _current("switch", "a", 6, 1, 3)
    assert next_step(serving, [A, B], [Served("a", 6, 13, 260), Served("b", 32, 6, 60)],
                     [], S) is None
    step = next_step(serving, [A, B], [Served("a", 6, 14, 280), Served("b", 32, 6, 60)], [], S)
    assert (step.kind, step.candidate, step.depth, step.assessment) == ("evaluate", "a", 24, 2)


def test_a_breach_of_the_decision_in_force_loads_or_switches_and_an_old_one_is_ignored():
    serving = _current("switch", "a", 6, 1, 3)
    pht = [_pht("a", 24, 40.0, {6: 0.6, 12: 0.1, 24: 0.3}, 60),
           _pht("b", 32, 25.0, {8: 0.75, 32: 0.25}, 50)]
    costs = SwitchCosts(load_ms_per_byte=0.01, horizon_tokens=1000)
    step = on_breach(serving, 3, [A, B], pht, costs, S)
    # load a's 18 missing layers (1800 B, 18 ms) + 1000 tokens at 40 tok/s: 25018 ms;
    # switch to b@8: 4000 B (40 ms) + 1000 / 43.75 s = 22897 ms
    assert (step.kind, step.candidate, step.depth, step.assessment) == ("switch", "b", 8, 1)
    assert step.load_bytes == 4000 and round(step.cost_ms) == 22897
    assert on_breach(serving, 2, [A, B], pht, costs, S) is None  # not the one in force
    assert on_breach(_current("evaluate", "a", 24, 1, 3), 3, [A, B], pht, costs, S) is None
    assert on_breach(_current("stay", "a", 24, 1, 3), 3, [A, B], pht, costs, S) is None

"""HELIOS policy (services.optimizer.helios): greedy depth, memory and batch, top-k, the
confidence breach counter, load-or-switch, the assessment choice and the RI schedule, each
against hand-computed figures."""

from __future__ import annotations

import math

import pytest

from services.optimizer.helios import (
    Candidate,
    PhtRow,
    Slo,
    SwitchCosts,
    choose_after_assessment,
    coverage,
    exit_distribution,
    expected_tokens_per_s,
    greedy_depth,
    kv_bytes,
    load_or_switch,
    max_batch,
    mean_layers,
    perplexity,
    select_top_k,
    weight_bytes,
)
from services.optimizer.helios_schedule import ReassessSchedule
from services.tuner.breach_counter import BreachCounter, breaches

# OPT-like pair: A = 24 layers, exits 6/12/24; B = 32 layers, exits 8/16/32.
A = Candidate("a", "opt", 24, (6, 12, 24), layer_bytes=100, fixed_bytes=200,
              kv_bytes_per_token_layer=1, tokens_per_s=40.0, perplexity=1.9)
B = Candidate("b", "opt", 32, (8, 16, 32), layer_bytes=400, fixed_bytes=800,
              kv_bytes_per_token_layer=2, tokens_per_s=25.0, perplexity=1.7)
A_DIST = {6: 0.6, 12: 0.1, 24: 0.3}  # mean layers at 24: 3.6 + 1.2 + 7.2 = 12
B_DIST = {8: 0.75, 16: 0.0, 32: 0.25}  # mean layers at 32: 6 + 8 = 14; at 8: 8
COSTS = SwitchCosts(load_ms_per_byte=0.01, horizon_tokens=1000)


def row(c: str, depth: int, tps: float, ppl: float, dist: dict[int, float],
        assessment: int = 1) -> PhtRow:
    return PhtRow(c, assessment, depth, tps, ttft_ms=40.0, tpot_ms=1000 / tps, perplexity=ppl,
                  exit_distribution=dist, memory_bytes=0, tokens=100)


# -- greedy depth --------------------------------------------------------------------------


def test_greedy_depth_loads_the_exit_most_tokens_take() -> None:
    opt13 = {6: 0.74, 12: 0.047, 24: 0.213}  # the papers' OPT-1.3B prompt mix: they load 6
    assert greedy_depth(opt13, 24) == 6
    assert greedy_depth(opt13, 24, q=0.76) == 12  # 0.74 + 0.047 = 0.787
    assert greedy_depth(opt13, 24, q=0.9) == 24


def test_greedy_depth_edges() -> None:
    assert greedy_depth({24: 1.0}, 24) == 24  # every token needs the last layer
    assert greedy_depth({6: 0.0, 24: 1.0}, 24) == 24
    assert greedy_depth({}, 24) == 24  # nothing known: the full model
    assert greedy_depth({6: 0.5, 24: 0.5}, 24, q=0.5) == 6  # mass exactly at the quantile
    assert greedy_depth({6: 0.2, 12: 0.7, 24: 0.1}, 24, q=0.9) == 12  # 0.2 + 0.7 in floats
    assert greedy_depth({6: 37, 24: 13}, 24) == 6  # counts are normalised
    with pytest.raises(ValueError):
        greedy_depth({30: 1.0}, 24)
    with pytest.raises(ValueError):
        greedy_depth(A_DIST, 24, q=0.0)


def test_distribution_helpers() -> None:
    assert coverage(A_DIST, 6) == pytest.approx(0.6)
    assert coverage(A_DIST, 12) == pytest.approx(0.7)
    assert mean_layers(A_DIST, 24) == pytest.approx(12.0)
    assert mean_layers(A_DIST, 6) == pytest.approx(6.0)
    assert mean_layers({}, 9) == 9.0
    exits = [6, 6, 12, 24]
    assert exit_distribution(exits) == {6: 0.5, 12: 0.25, 24: 0.25}
    assert exit_distribution(exits, depth=6) == {6: 1.0}  # deeper tokens left at 6
    assert breaches(exits, 6) == [False, False, True, True]
    assert perplexity([math.log(0.5), math.log(0.5)]) == pytest.approx(2.0)


# -- memory ----------------------------------------------------------------------------------


def test_max_batch_turns_unloaded_layers_into_requests() -> None:
    assert weight_bytes(A, 6) == 800 and kv_bytes(A, 6, 10) == 60
    assert max_batch(A, 6, 1000, 10) == 3  # (1000 - 800) // 60
    assert max_batch(A, 24, 1000, 10) == 0  # 2600 B of weights do not fit
    assert max_batch(A, 24, 2840, 10) == 1  # (2840 - 2600) // 240
    assert max_batch(A, 6, 2840, 10) == 34  # (2840 - 800) // 60: same memory, 34x the batch
    with pytest.raises(ValueError):
        max_batch(A, 25, 10_000, 10)
    with pytest.raises(ValueError):
        max_batch(A, 6, 10_000, 0)


# -- top-k -----------------------------------------------------------------------------------


def test_top_k_filters_memory_and_slo_and_ranks() -> None:
    huge = Candidate("huge", "opt", 24, (24,), 10_000, 0, 1, 100.0, 1.5)
    slow = Candidate("slow", "opt", 24, (24,), 10, 0, 1, 5.0, 1.4)  # TPOT 200 ms
    slo = Slo(max_tpot_ms=100.0)
    pool = [B, huge, slow, A]
    assert [c.name for c in select_top_k(pool, slo, memory_budget=20_000)] == ["a", "b"]
    assert [c.name for c in select_top_k(pool, slo, 20_000, k=1)] == ["a"]
    assert [c.name for c in select_top_k(pool, Slo("accuracy", 100.0), 20_000)] == ["b", "a"]
    # no TPOT bound: slow (ppl 1.4) is in, a (1.9) is out, huge never fits
    assert [c.name for c in select_top_k(pool, Slo(max_perplexity=1.8), 20_000)] == \
        ["b", "slow"]
    assert select_top_k(pool, slo, memory_budget=100) == []
    # B needs 800 + 32 * 400 = 13,600 B at full depth
    assert [c.name for c in select_top_k(pool, slo, 13_599)] == ["a"]
    assert [c.name for c in select_top_k(pool, slo, 13_600)] == ["a", "b"]
    # ...plus KV for one request: 2 B x 32 layers x 10 tokens
    assert [c.name for c in select_top_k(pool, slo, 13_600, tokens_per_request=10)] == ["a"]


def test_top_k_fits_at_the_likely_depth_and_keeps_one_family() -> None:
    deep = Candidate("deep", "opt", 24, (6, 24), 1000, 200, 1, 60.0, 1.8,
                     exit_distribution={6: 0.8, 24: 0.2})  # 24,200 B full; 6,200 B at 6
    gpt = Candidate("gpt", "gpt2", 12, (12,), 10, 10, 1, 500.0, 3.0)
    assert [c.name for c in select_top_k([A, deep], Slo(), 10_000)] == ["deep", "a"]
    assert [c.name for c in select_top_k([A, B, gpt], Slo(), 20_000)] == ["gpt"]
    assert [c.name for c in select_top_k([A, B, gpt], Slo(family="opt"), 20_000)] == ["a", "b"]


# -- confidence breach counter ---------------------------------------------------------------


def test_cbc_exactly_cbc_max_is_tolerated_one_more_breaches() -> None:
    cbc = BreachCounter()  # 50 in 100
    for _ in range(50):
        assert not cbc.observe(True)
    for _ in range(49):
        assert not cbc.observe(False)
    assert cbc.count == 50 and not cbc.breached
    assert cbc.observe(True)  # the 100th token is the 51st breach
    assert cbc.count == 51


def test_cbc_window_slides() -> None:
    cbc = BreachCounter(cbc_max=2, window=4)
    seq = [True, True, False, False, True, True]  # last four: F F T T -> 2
    assert [cbc.observe(b) for b in seq] == [False] * 6
    assert cbc.count == 2  # without the window it would be 4
    assert cbc.observe(True)  # F T T T -> 3 > 2


def test_cbc_first_breach_and_reset() -> None:
    cbc = BreachCounter(cbc_max=2, window=4)
    tokens = breaches([6, 12, 6, 24, 24, 6, 6], depth=6)  # F T F T T F F
    assert cbc.first_breach(tokens) == 4  # T F T T in the window ending at index 4
    cbc.reset()
    assert cbc.count == 0 and not cbc.breached
    assert cbc.first_breach([True, False, True, False, False]) is None
    with pytest.raises(ValueError):
        BreachCounter(cbc_max=4, window=4)


# -- load or switch ----------------------------------------------------------------------------


def test_load_when_more_layers_are_cheaper() -> None:
    pht = [row("a", 24, 50.0, 1.50, A_DIST), row("b", 32, 20.0, 1.52, B_DIST)]
    d = load_or_switch(A, 6, [A, B], pht, COSTS)
    # load: 18 layers x 100 B x 0.01 ms = 18 ms, 1000 tokens at 50 tok/s = 20,000 ms
    # switch b@8: 4000 B -> 40 ms; 20 x 14 / 8 = 35 tok/s -> 28,571.4 ms
    assert (d.kind, d.candidate, d.depth) == ("load", "a", 24)
    assert d.load_bytes == 1800 and d.load_ms == pytest.approx(18.0)
    assert d.cost_ms == pytest.approx(20_018.0)
    assert "20018.0 ms" in d.reason and "28611.4 ms" in d.reason


def test_switch_when_the_other_candidate_is_cheaper() -> None:
    pht = [row("a", 24, 50.0, 1.50, A_DIST), row("b", 32, 40.0, 1.52, B_DIST)]
    d = load_or_switch(A, 6, [A, B], pht, COSTS)
    # switch b@8: 40 x 14 / 8 = 70 tok/s -> 14,285.7 ms + 40 ms < 20,018 ms
    assert (d.kind, d.candidate, d.depth) == ("switch", "b", 8)
    assert d.load_bytes == 4000
    assert d.cost_ms == pytest.approx(40.0 + 1e6 / 70)
    assert expected_tokens_per_s(B, 8, pht) == pytest.approx(70.0)


def test_stay_when_fully_loaded_and_switching_costs_more() -> None:
    pht = [row("a", 24, 50.0, 1.50, A_DIST), row("b", 32, 20.0, 1.52, B_DIST)]
    d = load_or_switch(A, 24, [A, B], pht, COSTS)
    assert (d.kind, d.candidate, d.depth) == ("stay", "a", 24)
    assert d.load_bytes == 0 and d.cost_ms == pytest.approx(20_000.0)


def test_switch_needs_similar_perplexity_and_memory() -> None:
    worse = [row("a", 24, 50.0, 1.50, A_DIST), row("b", 32, 40.0, 1.60, B_DIST)]
    d = load_or_switch(A, 6, [A, B], worse, COSTS)  # 1.60 > 1.50 x 1.05
    assert d.kind == "load" and "ppl 1.600 > 1.575" in d.reason
    fine = [row("a", 24, 50.0, 1.50, A_DIST), row("b", 32, 40.0, 1.52, B_DIST)]
    # b@8 weighs 4000 B: with 3000 B only a@24 (2600 B + 24 B of KV) fits
    d = load_or_switch(A, 6, [A, B], fine, COSTS, memory_budget=3000)
    assert d.kind == "load" and "switch b@8: does not fit" in d.reason
    d = load_or_switch(A, 6, [A, B], fine, COSTS, memory_budget=2000)
    assert (d.kind, d.depth) == ("stay", 6) and "no option" in d.reason


def test_exact_pht_row_beats_scaling() -> None:
    pht = [row("b", 32, 40.0, 1.52, B_DIST), row("b", 8, 90.0, 1.53, {8: 1.0})]
    assert expected_tokens_per_s(B, 8, pht) == 90.0
    assert expected_tokens_per_s(B, 32, pht) == 40.0
    older = [row("b", 32, 10.0, 1.5, B_DIST, assessment=0), *pht]
    assert expected_tokens_per_s(B, 32, older) == 40.0  # the newest assessment counts
    assert expected_tokens_per_s(A, 24, []) == 40.0  # offline profile without rows
    assert expected_tokens_per_s(A, 12, []) == pytest.approx(80.0)  # no distribution: 24/12


# -- assessment choice -------------------------------------------------------------------------


def test_choose_after_assessment_by_objective() -> None:
    pht = [row("a", 24, 50.0, 1.50, A_DIST), row("b", 32, 40.0, 1.45, B_DIST)]
    # a@6: 50 x 12 / 6 = 100 tok/s; b@8: 70 tok/s
    d = choose_after_assessment([A, B], pht, Slo())
    assert (d.kind, d.candidate, d.depth, d.load_bytes) == ("switch", "a", 6, 800)
    assert choose_after_assessment([A, B], pht, Slo(), current=("a", 6)).kind == "stay"
    assert choose_after_assessment([A, B], pht, Slo(), current=("a", 24)).kind == "unload"
    d = choose_after_assessment([A, B], pht, Slo("accuracy"), current=("a", 6))
    assert (d.kind, d.candidate, d.depth) == ("switch", "b", 8)
    d = choose_after_assessment([A, B], pht, Slo(max_perplexity=1.48))
    assert d.candidate == "b"
    d = choose_after_assessment([A, B], pht, Slo(max_perplexity=1.0))
    assert d.candidate == "a" and "best effort" in d.reason


# -- re-assessment schedule --------------------------------------------------------------------


def test_ri_schedule_over_400_requests() -> None:
    s = ReassessSchedule(("a", "b"), ri=150, eval_prompts=5)
    evals = {n: s.eval_candidates(n) for n in range(400) if s.is_evaluation(n)}
    want = {**{n: ("a",) for n in [*range(5), *range(150, 155), *range(300, 305)]},
            **{n: ("b",) for n in [*range(5, 10), *range(155, 160), *range(305, 310)]}}
    assert evals == want
    assert s.eval_candidates(10) == () and not s.is_evaluation(149)
    assert [s.assessment(n) for n in (0, 149, 150, 399)] == [0, 0, 1, 2]
    assert s.phase_end(3) == 10 and s.phase_end(200) == 160
    assert s.next_assessment(149) == 150 and s.next_assessment(300) == 450


def test_ri_schedule_shared_prompts_run_on_every_candidate() -> None:
    s = ReassessSchedule(("a", "b"), eval_prompts=5, shared=True)
    evals = [n for n in range(400) if s.is_evaluation(n)]
    assert evals == [*range(5), *range(150, 155), *range(300, 305)]
    assert s.eval_candidates(151) == ("a", "b") and s.phase_end(151) == 155
    with pytest.raises(ValueError):
        ReassessSchedule(("a", "b"), ri=9, eval_prompts=5)


def test_an_assessment_keeps_perplexity_within_the_rise_of_the_best_candidate() -> None:
    # a@6 is faster (100 vs 70 tok/s) but its perplexity is 10 % above b's
    pht = [row("a", 24, 50.0, 1.60, A_DIST), row("b", 32, 40.0, 1.45, B_DIST)]
    d = choose_after_assessment([A, B], pht, Slo())  # default: within +5 %
    assert d.candidate == "b" and "best effort" not in d.reason
    assert choose_after_assessment([A, B], pht, Slo(max_perplexity_rise=0.15)).candidate == "a"
    assert choose_after_assessment([A, B], pht, Slo(max_perplexity_rise=None)).candidate == "a"
    # an absolute bound below the relative one still holds: nobody meets it
    d = choose_after_assessment([A, B], pht, Slo(max_perplexity=1.2))
    assert d.candidate == "a" and "best effort" in d.reason

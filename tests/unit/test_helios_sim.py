"""HELIOS replay (services.sim.helios_sim, helios_trace) on hand-made traces: two 8-layer candidates whose
exits are complementary (A answers prose at its first head and code only at the last layer,
B the reverse), so every decision can be computed by hand."""

from __future__ import annotations

import math

import pytest

from services.optimizer.helios import exit_distribution, greedy_depth
from services.sim.helios_sim import (
    HELIOS,
    NO_GREEDY,
    NO_SWITCH,
    SimConfig,
    compare,
    equal_batch,
    simulate,
)
from services.sim.helios_trace import (
    CandidateTrace,
    HeadTrace,
    PromptTrace,
    Timing,
    drifting_stream,
)

N_LAYERS = 8
HEADS = (2, 4, 6)
TOKENS = 10
TIMING = Timing(batches=(1, 8), step_ms=(9.0, 17.0), lm_head_ms=(1.0, 1.0), prefill_ms=5.0,
                n_layers=N_LAYERS)  # per layer: 1 ms at batch 1, 2 ms at batch 8


def prompt(pid: str, kind: str, exits: list[int | None]) -> PromptTrace:
    """Token i is first confident at head ``exits[i]`` (None: at no head). A confident head
    answers the full token (judge log-prob -0.5), an unsure one another (-3)."""
    full = tuple(100 + i for i in range(len(exits)))
    heads = {}
    for k in HEADS:
        sure = [e is not None and e <= k for e in exits]
        heads[k] = HeadTrace(tuple(0.95 if s else 0.1 for s in sure),
                             tuple(f if s else 900 + k for f, s in zip(full, sure)),
                             tuple(-0.5 if s else -3.0 for s in sure))
    return PromptTrace(pid, kind, 6, full, (-0.5,) * len(exits), heads)


def trace(name: str, good: str, mixed: list[int | None] | None = None,
          budget_layers: int = 100) -> CandidateTrace:
    """Four prose and four code prompts; on ``good`` every token exits at head 2, on the
    other kind none exits (or every prompt follows ``mixed``)."""
    prompts = []
    for kind in ("prose", "code"):
        exits = mixed or ([2] * TOKENS if kind == good else [None] * TOKENS)
        prompts += [prompt(f"{kind}{i}", kind, exits) for i in range(4)]
    return CandidateTrace(name, "fam", name, N_LAYERS, layer_bytes=budget_layers,
                          fixed_bytes=200, kv_bytes_per_token_layer=1, new_tokens=TOKENS,
                          prompt_tokens=6, timing=TIMING, prompts=tuple(prompts))


A, B = trace("a", "prose"), trace("b", "code")
TRACES = {"a": A, "b": B}
PROSE, CODE = 0, 4  # a prose and a code prompt
CFG = SimConfig(threshold=0.9, memory_budget=10_000, ri=40, eval_prompts=2,
                load_ms_per_byte=0.01)


def served(result, evaluation=False):
    return [s for s in result.timeline if s.evaluation == evaluation]


# -- stream and timing ------------------------------------------------------------------------


def test_the_stream_drifts_between_kinds_every_k_requests():
    kinds = ["prose", "prose", "code", "code"]
    s = drifting_stream(kinds, 12, 3, seed=5)
    assert s == drifting_stream(kinds, 12, 3, seed=5)  # seeded
    got = [kinds[i] for i in s]
    assert all(got[j] == got[3 * (j // 3)] for j in range(12))  # one kind per segment
    assert [got[j] for j in (0, 3, 6, 9)] in (["prose", "code"] * 2, ["code", "prose"] * 2)
    with pytest.raises(ValueError):
        drifting_stream(kinds, 0, 3)


def test_step_time_interpolates_and_extrapolates_linearly():
    t = Timing((1, 2, 4), (3.0, 4.0, 6.0), (1.0, 1.0, 1.0), prefill_ms=5.0, n_layers=2)
    assert t.layer_ms(3) == pytest.approx(2.0)  # between 1.5 (batch 2) and 2.5 (batch 4)
    assert t.layer_ms(8) == pytest.approx(4.5)  # 2.5 + 0.5 per request beyond batch 4
    assert t.step(2, 8) == pytest.approx(1 + 2 * 4.5)
    assert t.prefill(1) == pytest.approx(1 + (5 - 1) / 2)
    with pytest.raises(ValueError):
        Timing((2, 1), (1.0, 1.0), (0.0, 0.0), 1.0, 2)


# -- the alone baselines: served tokens, perplexity, agreement, time ---------------------------


def test_alone_arithmetic_of_tokens_perplexity_agreement_and_time():
    heads = {2: HeadTrace((0.95, 0.2, 0.95, 0.2), (7, 8, 9, 10), (-0.1, -9.0, -0.7, -9.0))}
    p = PromptTrace("x", "prose", 2, (7, 5, 6, 4), (-0.2, -0.3, -9.0, -0.4), heads)
    t = CandidateTrace("c", "fam", "c", 4, 10, 20, 1, 4, 2, Timing((1,), (5.0,), (1.0,), 3.0, 4),
                       (p,))
    r = simulate("alone:c", {"c": t}, [0, 0], SimConfig(0.9, memory_budget=60 + 24 * 5))
    s = r.summary(1)
    # tokens 0 and 2 leave at head 2 (7 agrees, 9 does not), 1 and 3 are the full tokens
    assert s["perplexity"] == pytest.approx(math.exp((0.1 + 0.3 + 0.7 + 0.4) / 4))
    assert s["token_agreement"] == 0.75
    # weights 20 + 4 * 10 = 60; KV 4 layers x 6 tokens = 24 per request: batch 5
    assert s["largest_batch"] == 5 and s["breaches"] == 0
    # every token runs all 4 loaded layers (the deferred KV of an exit) at 1 ms, and the
    # LM head (1 ms) plus head 2, which scores every token (1 ms)
    tpot = 4 * 1.0 + (1 + 1) * 1.0
    assert s["tpot_ms"] == pytest.approx(tpot)
    assert s["ttft_ms"] == pytest.approx(3.0)
    assert s["tokens_per_s"] == pytest.approx(8 * 1000 / (2 * (3.0 + 4 * tpot / 5)))
    assert s["memory_at_equal_batch_bytes"] == 60 + 24
    # loaded to head 2 only, tokens 1 and 3 breach and serve head 2's unsure answers
    row = simulate(HELIOS, {"c": t}, [0] * 4, SimConfig(0.9, 60 + 24 * 5, ri=4, eval_prompts=1))
    last = row.timeline[-1]
    assert (last.depth, last.breaches, last.agreement) == (2, 2, 0.25)


# -- HELIOS decisions -------------------------------------------------------------------------


def test_the_chosen_candidate_follows_the_drift():
    stream = [PROSE] * 40 + [CODE] * 40 + [PROSE] * 40  # RI 40: one assessment per kind
    r = simulate(HELIOS, TRACES, stream, CFG)
    assert [(s.candidate, s.evaluation) for s in r.timeline[:4]] == \
        [("a", True), ("a", True), ("b", True), ("b", True)]
    for s in served(r):
        assert (s.candidate, s.depth) == (("a", 2) if s.kind == "prose" else ("b", 2))
    assert r.summary(1)["switches"] == 2 and r.summary(1)["breaches"] == 0
    assessed = [e for e in r.events if e.cause == "assess"]
    assert [(e.request, e.candidate, e.depth) for e in assessed] == \
        [(4, "a", 2), (44, "b", 2), (84, "a", 2)]


def test_greedy_loading_picks_the_depth_of_the_exit_distribution():
    exits = [2, 4, 4, 4, None, None, 4, 4, 2, 2]  # 30 % at 2, 50 % at 4, 20 % need all 8
    one = {"m": trace("m", "none", mixed=exits)}
    r = simulate(HELIOS, one, [PROSE] * 12, SimConfig(0.9, 10_000, ri=40, eval_prompts=2))
    dist = exit_distribution([8 if e is None else e for e in exits])
    assert greedy_depth(dist, N_LAYERS) == 4
    assert {s.depth for s in served(r)} == {4}
    assert all(s.breaches == 2 for s in served(r))  # the two tokens that need layer 8
    assert {s.depth for s in served(r, evaluation=True)} == {N_LAYERS}


def test_breaches_trigger_load_or_switch():
    # evaluation: A sees prose (fast), B sees code (fast); the stream then stays on code, where
    # A breaches on every token. Moving B@2's 400 bytes beats loading A's 6 missing layers.
    stream = [PROSE, PROSE, CODE, CODE] + [CODE] * 36
    r = simulate(HELIOS, TRACES, stream, CFG)
    breach = [e for e in r.events if e.cause == "breach"]
    # 51 breaches: the sixth request of A@2 (10 tokens each) trips the counter
    assert [(e.request, e.action, e.candidate, e.depth, e.load_bytes) for e in breach] == \
        [(9, "switch", "b", 2, 400)]
    assert breach[0].cost_ms == pytest.approx(4.0)
    assert {s.candidate for s in served(r) if s.request > 9} == {"b"}
    # without switching, the same breach loads A's remaining layers (6 x 100 bytes)
    ns = simulate(NO_SWITCH, TRACES, stream, CFG)
    assert [(e.request, e.action, e.candidate, e.depth, e.load_bytes)
            for e in ns.events if e.cause == "breach"] == [(9, "load", "a", 8, 600)]
    assert {s.depth for s in served(ns) if s.request > 9} == {8}


def test_no_switch_never_switches_and_no_greedy_always_loads_fully():
    stream = [PROSE] * 40 + [CODE] * 40 + [PROSE] * 40
    ns = simulate(NO_SWITCH, TRACES, stream, CFG)
    assert {s.candidate for s in served(ns)} == {"a"}
    assert ns.summary(1)["switches"] == 0
    # later assessments evaluate only A: code makes it load all 8 layers, prose unloads
    assert {(s.kind, s.depth) for s in served(ns)} == {("prose", 2), ("code", 8)}
    assert [s.candidate for s in served(ns, evaluation=True)] == ["a", "a", "b", "b"] + ["a"] * 4
    ng = simulate(NO_GREEDY, TRACES, stream, CFG)
    assert {s.depth for s in ng.timeline} == {N_LAYERS}
    assert ng.summary(1)["breaches"] == 0 and ng.summary(1)["switches"] == 2
    assert {(s.kind, s.candidate) for s in served(ng)} == {("prose", "a"), ("code", "b")}


def test_compare_reports_every_policy_with_memory_at_an_equal_batch():
    stream = drifting_stream([p.kind for p in A.prompts], 120, 40, seed=1)
    results = compare(TRACES, stream, CFG)
    assert list(results) == ["alone:a", "alone:b", HELIOS, NO_SWITCH, NO_GREEDY]
    eq = equal_batch(results)
    full = (10_000 - 1000) // (N_LAYERS * 16)  # weights 200 + 8 x 100, KV 8 x 16 per request
    assert eq == full and results["alone:a"].summary(eq)["largest_batch"] == full
    h = results[HELIOS].summary(eq)
    assert h["largest_batch"] == (10_000 - 400) // (2 * 16)  # loaded to head 2
    assert h["memory_at_equal_batch_bytes"] < results["alone:a"].summary(eq)[
        "memory_at_equal_batch_bytes"]
    assert h["tokens_per_s"] > results["alone:a"].summary(eq)["tokens_per_s"]
    doc = results[HELIOS].to_dict(eq)
    assert len(doc["timeline"]) == 120 and doc["events"][0]["cause"] == "evaluate"


# -- bad input --------------------------------------------------------------------------------


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="unknown policy"):
        simulate("fastest", TRACES, [0], CFG)
    with pytest.raises(ValueError, match="prompt indices"):
        simulate(HELIOS, TRACES, [], CFG)
    with pytest.raises(ValueError, match="prompt indices"):
        simulate(HELIOS, TRACES, [8], CFG)
    with pytest.raises(ValueError, match="no trace"):
        simulate("alone:z", TRACES, [0], CFG)
    other = CandidateTrace("b", "fam", "b", N_LAYERS, 100, 200, 1, TOKENS, 6, TIMING,
                           tuple(reversed(B.prompts)))
    with pytest.raises(ValueError, match="different prompts"):
        simulate(HELIOS, {"a": A, "b": other}, [0], CFG)
    with pytest.raises(ValueError, match="does not fit"):
        simulate("alone:a", TRACES, [0], SimConfig(0.9, memory_budget=1000))
    with pytest.raises(ValueError, match="no candidate fits"):
        simulate(HELIOS, TRACES, [0], SimConfig(0.9, memory_budget=1000))
    with pytest.raises(ValueError):  # two candidates x 5 evaluation prompts > RI 6
        simulate(HELIOS, TRACES, [0], SimConfig(0.9, 10_000, ri=6, eval_prompts=5))
    with pytest.raises(ValueError):
        SimConfig(threshold=0.0, memory_budget=1)
    with pytest.raises(ValueError, match="unequal"):
        PromptTrace("x", "prose", 1, (1, 2), (0.0,), {})

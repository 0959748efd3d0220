"""HELIOS breach watch (services.tuner.breach_watch): which decision it follows, which
streams count, when it trips and that it alerts once per decision."""

from __future__ import annotations

from schemas.helios import BreachAlert, GenerationRecord, HeliosChoice
from services.tuner.breach_counter import CBC_MAX, CBC_WINDOW
from services.tuner.breach_watch import BreachWatch


def choice(decision: int, kind: str = "load", candidate: str = "a", depth: int = 6
           ) -> HeliosChoice:
    return HeliosChoice("m", decision, kind, candidate, depth, assessment=1)


def record(tokens: int, breach_at: list[int], candidate: str = "a", depth: int = 6
           ) -> GenerationRecord:
    return GenerationRecord(id="r", t=0.0, candidate=candidate, depth=depth, assessment=1,
                            prompt_tokens=4, tokens=tokens, ttft_ms=1.0, tpot_ms=1.0,
                            duration_ms=1.0, logprob=-1.0, exits={depth: tokens},
                            breach_at=breach_at)


def all_breached(tokens: int, **kw) -> GenerationRecord:
    return record(tokens, list(range(tokens)), **kw)


def test_defaults_are_the_papers_counter() -> None:
    w = BreachWatch("m")
    assert (w.cbc_max, w.window) == (CBC_MAX, CBC_WINDOW) == (50, 100)


def test_nothing_counts_before_a_decision() -> None:
    w = BreachWatch("m", cbc_max=2, window=10)
    assert w.observe(all_breached(10)) is None
    assert w.counter.count == 0 and not w.armed
    w.follow(choice(1))
    assert w.observe(all_breached(3)) is not None  # the earlier stream left no trace


def test_trips_exactly_when_more_than_cbc_max_of_the_window_breached() -> None:
    w = BreachWatch("m", cbc_max=3, window=5)
    w.follow(choice(7))
    assert w.observe(record(5, [0, 2, 4])) is None  # 3 of 5: tolerated
    assert w.counter.count == 3
    # next token slides token 0 (a breach) out: 2 + 1 = 3, still tolerated
    assert w.observe(record(1, [0])) is None
    assert w.counter.count == 3
    # window F T F T T; one more breach slides token 1 (no breach) out: 4 > 3
    got = w.observe(record(1, [0]))
    assert got == BreachAlert("m", 7, "a", 6, breaches=4, window=5)


def test_tokens_are_fed_in_order_and_the_window_spans_streams() -> None:
    late, early = BreachWatch("m", cbc_max=1, window=2), BreachWatch("m", cbc_max=1, window=2)
    for w in (late, early):
        w.follow(choice(1))
        assert w.observe(record(1, [0])) is None  # T
    # F then T: the window slides over the stream boundary and holds F T
    assert late.observe(record(2, [1])) is None
    assert late.counter.count == 1
    # T first: the window holds the previous stream's T and this one: 2 > 1
    got = early.observe(record(2, [0]))
    assert got is not None and got.breaches == 2


def test_a_stream_trips_on_the_token_that_breaks_the_count() -> None:
    w = BreachWatch("m", cbc_max=2, window=4)
    w.follow(choice(1))
    got = w.observe(record(6, [0, 1, 2, 3]))
    assert got is not None and got.breaches == 3  # stopped at the third breach


def test_only_the_decisions_candidate_and_depth_count() -> None:
    w = BreachWatch("m", cbc_max=1, window=10)
    w.follow(choice(2, candidate="a", depth=12))
    assert w.observe(all_breached(5, candidate="a", depth=6)) is None  # began before the load
    assert w.observe(all_breached(5, candidate="b", depth=12)) is None  # before the switch
    assert w.counter.count == 0
    assert w.observe(all_breached(2, candidate="a", depth=12)) is not None


def test_one_alert_until_the_next_decision() -> None:
    w = BreachWatch("m", cbc_max=1, window=10)
    w.follow(choice(1))
    assert w.observe(all_breached(2)) is not None
    assert w.observe(all_breached(9)) is None  # the optimizer is deciding: no storm
    w.follow(choice(1))  # the same decision re-broadcast does not re-arm
    assert w.observe(all_breached(9)) is None
    w.follow(choice(2, kind="stay"))  # it decided to stay: count afresh
    assert w.armed and w.counter.count == 0
    got = w.observe(all_breached(2))
    assert got is not None and got.decision == 2


def test_a_new_decision_resets_the_counter() -> None:
    w = BreachWatch("m", cbc_max=3, window=10)
    w.follow(choice(1))
    assert w.observe(all_breached(3)) is None
    w.follow(choice(2))
    assert w.counter.count == 0
    assert w.observe(all_breached(3)) is None  # 3 again, not 6
    assert w.observe(all_breached(1)) is not None


def test_older_and_repeated_decisions_are_ignored() -> None:
    w = BreachWatch("m", cbc_max=3, window=10)
    w.follow(choice(5, candidate="a", depth=6))
    assert w.observe(all_breached(2)) is None
    w.follow(choice(4, candidate="b", depth=8))  # late or reordered: not newer
    w.follow(choice(5, candidate="a", depth=6))  # re-broadcast: the count goes on
    assert w.choice.decision == 5 and w.counter.count == 2
    got = w.observe(all_breached(2))
    assert got is not None and (got.decision, got.candidate, got.depth) == (5, "a", 6)


def test_evaluation_never_alerts() -> None:
    w = BreachWatch("m", cbc_max=1, window=10)
    w.follow(choice(3, kind="evaluate", depth=24))
    assert w.observe(all_breached(10, depth=24)) is None
    assert w.counter.count == 0
    w.follow(choice(4, kind="load", depth=24))  # the assessment's outcome re-arms it
    assert w.observe(all_breached(2, depth=24)) is not None


def test_streams_without_breaches_never_trip() -> None:
    w = BreachWatch("m", cbc_max=0, window=3)
    w.follow(choice(1))
    for _ in range(50):
        assert w.observe(record(7, [])) is None
    assert w.observe(record(1, [0])) is not None  # cbc_max=0: the first breach is one too many

"""The profiler's PHT role against a real store: generation streams in, one PHT row per
assessment, candidate and depth out, rebuilt when an assessment's streams change (also
streams that commit late), left alone once caught up, and caught up after a restart."""

from __future__ import annotations

import logging
import math
from datetime import datetime

import pytest

from services.profiler import service
from services.profiler.pht_rows import pht_rows_from_generations
from services.profiler.service import RECHECK_IDS, PhtProfiler
from services.store import Store

LOG = logging.getLogger("test")
T0 = datetime(2030, 1, 1, 12, 0, 0)


def gen(rid: str, assessment: int | None, tokens: int, candidate: str = "opt-1.3b",
        depth: int = 12, model: str = "chat") -> dict:
    return {"request_id": rid, "model": model, "worker": "w", "received_at": T0,
            "candidate": candidate, "depth": depth, "assessment": assessment,
            "prompt_tokens": 3, "tokens": tokens, "ttft_ms": 40.0, "tpot_ms": 20.0,
            "duration_ms": 50.0 * tokens, "logprob": -0.5 * tokens, "exits": {12: tokens},
            "breaches": 0, "memory_bytes": 1000}


def pht(store: Store, model: str = "chat") -> dict[tuple, int]:
    return {(r["assessment"], r["candidate"], r["loaded_depth"]): r["tokens"]
            for r in store.pht_rows(model)}


def test_a_started_profiler_builds_the_assessments_streams_serve(store: Store) -> None:
    store.add_generations([gen("a", 1, 10), gen("b", 2, 10), gen("c", 2, 30),
                           gen("d", 2, 4, "opt-6.7b", 32), gen("e", None, 99),
                           gen("x", 5, 8, model="other")])
    role = PhtProfiler(store, LOG)
    assert role.poll() == 3  # chat's 1 and 2, other's 5
    assert pht(store) == {(1, "opt-1.3b", 12): 10, (2, "opt-1.3b", 12): 40,
                          (2, "opt-6.7b", 32): 4}
    assert pht(store, "other") == {(5, "opt-1.3b", 12): 8}
    row = store.pht_rows("chat", 2)[0]
    assert row["tokens_per_s"] == pytest.approx(20.0)  # 40 tokens in 2000 ms
    assert row["perplexity"] == pytest.approx(math.exp(0.5))
    assert row["exit_distribution"] == {12: 1.0}
    expected = pht_rows_from_generations(store.generations("chat", 2))
    assert [{k: r[k] for k in expected[0]} for r in store.pht_rows("chat", 2)] == expected
    assert role.poll() == 0  # caught up: nothing rewritten


def test_new_streams_rebuild_their_assessment_only(store: Store) -> None:
    store.add_generations([gen("a", 1, 10), gen("b", 2, 10)])
    role = PhtProfiler(store, LOG)
    role.poll()
    at = store.pht_rows("chat", 2)[0]["at"]
    store.add_generations([gen("c", 3, 6), gen("d", 1, 5), gen("e", None, 7)])
    assert role.poll() == 2  # assessment 1 caught a straggler, 3 began
    assert pht(store) == {(1, "opt-1.3b", 12): 15, (2, "opt-1.3b", 12): 10,
                          (3, "opt-1.3b", 12): 6}
    assert store.pht_rows("chat", 2)[0]["at"] == at  # untouched
    assert role.poll() == 0


def test_a_stream_committed_after_a_higher_id_was_seen_is_not_missed(store: Store) -> None:
    store.add_generations([gen("a", 1, 10)])
    role = PhtProfiler(store, LOG)
    role.poll()
    role.seen += RECHECK_IDS // 2  # as if later ids had committed before the next stream
    store.add_generations([gen("b", 1, 5)])
    assert role.poll() == 1
    assert pht(store) == {(1, "opt-1.3b", 12): 15}


def test_a_restarted_profiler_rebuilds_each_models_newest_assessment(
        store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    store.add_generations([gen("a", 1, 10), gen("b", 2, 10)])
    PhtProfiler(store, LOG).poll()
    stamped = {r["assessment"]: r["at"] for r in store.pht_rows("chat")}
    monkeypatch.setattr(service, "RECHECK_IDS", 0)  # only streams after the newest seen
    restarted = PhtProfiler(store, LOG)
    assert restarted.poll() == 1  # the newest, caught up or not: the PHT may be older code's
    assert store.pht_rows("chat", 1)[0]["at"] == stamped[1]
    assert store.pht_rows("chat", 2)[0]["at"] > stamped[2]
    store.add_generations([gen("c", 2, 5)])
    assert restarted.poll() == 1 and pht(store)[(2, "opt-1.3b", 12)] == 15
    assert restarted.poll() == 0


def test_streams_stored_while_no_profiler_ran_are_caught_up(store: Store) -> None:
    store.add_generations([gen("a", 1, 10)])
    PhtProfiler(store, LOG).poll()
    store.add_generations([gen("b", 1, 5), gen("c", 2, 3)])
    restarted = PhtProfiler(store, LOG)
    assert restarted.poll() == 2
    assert pht(store) == {(1, "opt-1.3b", 12): 15, (2, "opt-1.3b", 12): 3}
    assert restarted.poll() == 0


def test_nothing_to_build_without_assessed_streams(store: Store) -> None:
    role = PhtProfiler(store, LOG)
    assert role.poll() == 0
    store.add_generations([gen("a", None, 10), gen("b", 4, 0)])  # outside, and no tokens
    assert role.poll() == 0 and pht(store) == {}

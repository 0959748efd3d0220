"""PHT rows from generation streams (pure): grouping, the aggregates, hand-computed."""

from __future__ import annotations

import math
from dataclasses import fields

import pytest

from services.optimizer.helios import PhtRow
from services.profiler.pht_rows import (
    exit_distribution,
    pht_row,
    pht_rows_from_generations,
)


def stream(assessment: int | None, candidate: str, depth: int, tokens: int, ttft_ms: float,
           tpot_ms: float, duration_ms: float, logprob: float, exits: dict,
           memory_bytes: int = 1000) -> dict:
    return {"assessment": assessment, "candidate": candidate, "depth": depth, "tokens": tokens,
            "ttft_ms": ttft_ms, "tpot_ms": tpot_ms, "duration_ms": duration_ms,
            "logprob": logprob, "exits": exits, "memory_bytes": memory_bytes}


SMALL_A = stream(3, "opt-1.3b", 12, 10, 40.0, 20.0, 240.0, -5.0, {6: 7, 12: 3}, 1000)
SMALL_B = stream(3, "opt-1.3b", 12, 30, 60.0, 10.0, 360.0, -15.0, {"6": 20, "12": 10}, 1500)
LARGE = stream(3, "opt-6.7b", 32, 4, 90.0, 25.0, 100.0, 0.0, {32: 4}, 9000)
EARLIER = stream(2, "opt-6.7b", 32, 5, 70.0, 30.0, 125.0, -5.0, {9: 5})
OUTSIDE = stream(None, "opt-1.3b", 12, 99, 1.0, 1.0, 1.0, -1.0, {6: 99})


def test_one_row_per_assessment_candidate_and_depth_hand_computed():
    rows = pht_rows_from_generations([SMALL_A, LARGE, OUTSIDE, SMALL_B, EARLIER])
    assert [(r["assessment"], r["candidate"], r["loaded_depth"]) for r in rows] == [
        (2, "opt-6.7b", 32), (3, "opt-1.3b", 12), (3, "opt-6.7b", 32)]  # OUTSIDE: no assessment
    small = rows[1]
    assert small["tokens"] == 40
    assert small["tokens_per_s"] == pytest.approx(40 * 1000 / 600)  # 40 tokens in 240 + 360 ms
    assert small["ttft_ms"] == pytest.approx(50.0)  # per stream: (40 + 60) / 2
    assert small["tpot_ms"] == pytest.approx(12.5)  # per token: (10 * 20 + 30 * 10) / 40
    assert small["perplexity"] == pytest.approx(math.exp(20 / 40))  # -(-5 - 15) / 40 tokens
    assert small["exit_distribution"] == {6: pytest.approx(27 / 40), 12: pytest.approx(13 / 40)}
    assert small["memory_bytes"] == 1500  # the larger stream's
    large = rows[2]
    assert large["tokens_per_s"] == pytest.approx(40.0) and large["perplexity"] == 1.0
    assert large["exit_distribution"] == {32: 1.0}


def test_speed_counts_a_streams_own_decoding_calls_where_the_worker_measured_them():
    # an evaluated candidate's rounds also step the served model and run the judge: only
    # its own calls count (120 + 200 ms), a stream without the figure counts its duration
    own = [{**SMALL_A, "decode_ms": 120.0}, {**SMALL_B, "decode_ms": 200.0}]
    assert pht_rows_from_generations(own)[0]["tokens_per_s"] == pytest.approx(40 * 1000 / 320)
    mixed = [{**SMALL_A, "decode_ms": 120.0}, {**SMALL_B, "decode_ms": None}]
    assert pht_rows_from_generations(mixed)[0]["tokens_per_s"] == pytest.approx(40 * 1000 / 480)


def test_rows_carry_exactly_the_pht_row_fields():
    (row,) = pht_rows_from_generations([SMALL_A])
    assert set(row) == {f.name for f in fields(PhtRow)}
    assert PhtRow(**row).loaded_depth == 12


def test_streams_without_tokens_say_nothing():
    empty = stream(1, "c", 4, 0, 30.0, 0.0, 0.0, 0.0, {})
    assert pht_row(1, "c", 4, [empty]) is None
    assert pht_rows_from_generations([empty, OUTSIDE]) == []


def test_odd_streams_give_finite_rows():
    instant = stream(1, "c", 4, 2, 0.0, 0.0, 0.0, -2000.0, {4: 2})  # no duration, awful logprob
    row = pht_row(1, "c", 4, [instant])
    assert row is not None and row["tokens_per_s"] == 0.0
    assert math.isfinite(row["perplexity"]) and row["perplexity"] > 1e300


def test_exit_distribution_sums_counts_of_int_and_string_layers():
    assert exit_distribution([{6: 1}, {"6": 1, "24": 2}]) == {6: 0.5, 24: 0.5}
    assert exit_distribution([{}, {}]) == {}


def test_perplexity_is_the_served_models_where_it_judged_another_candidate():
    judged = {**SMALL_B, "judged_logprob": -35.0}  # the served model finds the text worse
    (row,) = pht_rows_from_generations([SMALL_A, judged])
    assert row["perplexity"] == pytest.approx(math.exp(40 / 40))  # -(-5 - 35) / 40 tokens
    (row,) = pht_rows_from_generations([SMALL_A, {**SMALL_B, "judged_logprob": None}])
    assert row["perplexity"] == pytest.approx(math.exp(20 / 40))

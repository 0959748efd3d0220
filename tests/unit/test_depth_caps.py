"""Depth caps (exit depth as a variant): keys, the capped config, the answers and
agreement a cap gives on feedback records, and the profile rows."""

from __future__ import annotations

import math

import numpy as np
import pytest

from schemas.messages import ExitConfig
from services.exits import depth_caps as dc

SITES = (0, 1, 2, 3)  # ramps in site order


def _config(active, thresholds=None) -> ExitConfig:
    return ExitConfig("m", 4, "compute", thresholds or {r: 0.5 for r in SITES}, list(active))


def test_keys_round_trip_and_malformed_caps_are_refused() -> None:
    assert dc.cap_key(2) == "depth<=2" and dc.cap_ramp("depth<=2") == 2
    assert dc.cap_key(None) == dc.FINAL and dc.cap_ramp(dc.FINAL) is None
    assert dc.is_cap("depth<=7") and not dc.is_cap("D=1,2;W=1") and not dc.is_cap(None)
    for bad in ("depth<=", "depth<=x", "depth<=-1", "D=1"):
        with pytest.raises(ValueError):
            dc.cap_ramp(bad)


def test_a_cap_gives_the_deepest_active_ramp_at_or_before_it_an_infinite_threshold() -> None:
    config = _config([0, 2, 3])
    capped = dc.capped_config(config, SITES, 2)
    assert capped.thresholds[2] == math.inf and capped.active == [0, 2, 3]
    assert {r: t for r, t in capped.thresholds.items() if r != 2} == {0: 0.5, 1: 0.5, 3: 0.5}
    assert config.thresholds[2] == 0.5  # the served config is untouched
    # an inactive cap answers at the deepest active ramp before it
    assert dc.capped_config(config, SITES, 1).thresholds[0] == math.inf
    # the final cap, or a cap before every active ramp, runs the model as it is
    assert dc.capped_config(config, SITES, None) is config
    assert dc.capped_config(_config([2, 3]), SITES, 1).thresholds == _config([2, 3]).thresholds
    with pytest.raises(ValueError, match="ramps are"):
        dc.capped_config(config, SITES, 9)


def test_cap_answers_keep_earlier_exits_and_answer_the_rest_at_the_cap() -> None:
    ramp_ids = [0, 2]
    pred = np.array([[1, 1, 1, 1], [2, 2, 2, 2]])
    exit_at = np.array([0, -1, 2, -1])
    assert dc.cap_answers(ramp_ids, pred, exit_at, 0).tolist() == [1, 1, 1, 1]
    assert dc.cap_answers(ramp_ids, pred, exit_at, 2).tolist() == [1, 2, 2, 2]
    final = np.array([1, 2, 0, 2])
    assert dc.cap_agreement(ramp_ids, pred, exit_at, final) == {0: 1, 2: 3}


def test_cap_latency_counts_blocks_to_the_site_and_the_active_heads_before_it() -> None:
    block = np.array([[1.0, 2.0], [10.0, 20.0], [100.0, 200.0]])
    head = np.array([[0.1, 0.2], [0.01, 0.02]])
    after = (0, 1)
    assert dc.cap_latency_ms(block, head, after, [0, 1], 0).tolist() == [1.1, 2.2]
    assert np.allclose(dc.cap_latency_ms(block, head, after, [0, 1], 1), [11.11, 22.22])
    assert np.allclose(dc.cap_latency_ms(block, head, after, [1], None), [111.01, 222.02])


def test_rows_cover_the_active_caps_and_final_and_flag_the_frontier() -> None:
    block = np.array([[1.0, 2.0], [10.0, 20.0], [100.0, 200.0]])
    head = np.array([[0.1, 0.2], [0.01, 0.02]])
    rows = dc.cap_rows((1, 16), block, head, (5, 6), (0, 1), [5, 6],
                       {5: 0.7, 6: 0.65, None: 0.99})
    by = {r["variant"]: r for r in rows}
    assert set(by) == {"depth<=5", "depth<=6", "depth<=final"}
    assert by["depth<=5"]["latency_ms"] == {1: pytest.approx(1.1), 16: pytest.approx(2.2)}
    # ramp 6 is slower than ramp 5 and less accurate: off the frontier
    assert [by[k]["pareto"] for k in ("depth<=5", "depth<=6", "depth<=final")] == [
        True, False, True]
    # an inactive ramp gets no row even with an accuracy
    assert {r["variant"] for r in dc.cap_rows((1, 16), block, head, (5, 6), (0, 1), [6],
                                               {5: 0.7, 6: 0.8, None: 1.0})} == {
        "depth<=6", "depth<=final"}


def _lever_manifest(agreements, block_ms, trained=None) -> dict:
    """Blocks of ``block_ms`` (at batch 16), ramp k after block k with ``agreements[k]``."""
    trained = trained or [True] * len(agreements)
    return {"blocks": [{"index": k, "cost_ms": 0.1, "cost_by_batch": {"16": ms}}
                       for k, ms in enumerate(block_ms)],
            "ramps": [{"index": k, "after_block": k, "agreement": a, "trained": t}
                      for k, (a, t) in enumerate(zip(agreements, trained))]}


def test_lever_caps_are_the_cheapest_pareto_ramp_and_ones_spread_over_the_cost() -> None:
    # cumulative cost at ramps 0..5: 10, 20, 40, 50, 60, 70; the whole model 100
    doc = _lever_manifest([0.5, 0.4, 0.7, 0.75, 0.74, 0.8], [10, 10, 20, 10, 10, 10, 30])
    # ramp 1 and 4 are beaten by a cheaper ramp; targets 10 + 30 = 40 and 10 + 60 = 70
    assert dc.lever_caps(doc) == [0, 2, 5]
    assert dc.lever_caps(doc, count=1) == [0]
    assert dc.lever_caps(doc, count=2) == [0, 3]          # 55: ramp 3 at 50 is nearest
    # an untrained ramp is never a cap; nor is a model without trained ramps capped
    doc = _lever_manifest([0.5, 0.6], [10, 10, 80], trained=[False, True])
    assert dc.lever_caps(doc) == [1]
    assert dc.lever_caps(_lever_manifest([0.5], [10, 10], trained=[False])) == []

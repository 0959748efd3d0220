"""The deployment plan on the wire (schemas/plans.py): round trip and the checks that keep
a pool worker from acting on a plan that is not whole."""

from __future__ import annotations

import dataclasses

import pytest

from schemas import errors
from schemas.codec import unpack
from schemas.errors import ServingError
from schemas.plans import Plan, StageRole

S0 = StageRole(0, 0, 4, "cpu-2c", 16, 200.0, (1, 3), ("pool-a",))
S1 = StageRole(1, 4, 8, "cpu-2c", 16, 200.0, (6,), ("pool-b", "pool-c"))


def plan(**kw) -> Plan:
    base = {"model": "m", "version": 3, "reason": "timer", "feasible": True, "n_blocks": 8,
            "stages": (S0, S1), "goodput_rps": 120.0, "latency_ms": 80.0, "cost": 9.0,
            "t": 1.5, "extra": {"probe_ramps": [6]}}
    return Plan(**{**base, **kw})


def test_round_trip_and_roles() -> None:
    p = plan()
    back = Plan.decode(unpack(p.encode()))
    assert back == p
    assert back.cuts == (4,)
    assert back.role_of("pool-c") == S1 and back.role_of("pool-z") is None


@pytest.mark.parametrize("change, words", [
    ({"stages": (S1,)}, "stage 0 must start at block 0"),
    ({"stages": (S0, dataclasses.replace(S1, first_block=5))}, "must start at block 4"),
    ({"stages": (S0, dataclasses.replace(S1, last_block=7))}, "the model has 8"),
    ({"stages": (S0, dataclasses.replace(S1, workers=("pool-a",)))}, "at most one stage"),
    ({"stages": (S0, dataclasses.replace(S1, batch=0))}, "batch >= 1"),
    ({"stages": ()}, "at least one stage"),
    ({"mode": "latency"}, "mode must be 'compute'"),
    ({"version": 0}, "version and n_blocks"),
])
def test_a_plan_that_is_not_whole_is_refused(change: dict, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        plan(**change)
    wire = plan().to_map()
    for key, value in change.items():
        wire[key] = [s.to_map() for s in value] if key == "stages" else value
    with pytest.raises(ServingError) as info:
        Plan.decode(wire)
    assert info.value.code == errors.BAD_REQUEST and words in str(info.value)


def test_an_infeasible_plan_has_no_stages_and_malformed_fields_are_named() -> None:
    assert Plan.decode(plan(feasible=False, stages=()).to_map()).stages == ()
    wire = plan().to_map()
    wire["stages"][0]["batch"] = "16"
    with pytest.raises(ServingError, match="batch"):
        Plan.decode(wire)
    with pytest.raises(ServingError, match="expected a map"):
        Plan.decode([1, 2])

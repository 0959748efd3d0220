"""Router policy code: EDF queue, batching policy, worker registry, input contract."""

from __future__ import annotations

import numpy as np
import pytest

from schemas.errors import ServingError
from services.router.edf_queue import EDFQueue, Pending, QueueFull
from services.router.model_specs import ModelSpec, TensorContract
from services.router.policy import BatchDecision, FixedBatchPolicy, QueueView, make_policy
from services.router.workers import Inflight, WorkerRegistry


def _p(i: int, deadline: float, arrival: float = 0.0) -> Pending:
    return Pending(id=str(i), model="m", reply="r", inputs={}, arrival=arrival, deadline=deadline)


def test_edf_pops_earliest_deadline_first_and_is_bounded():
    q = EDFQueue(limit=3)
    for i, d in enumerate([5.0, 1.0, 3.0]):
        q.push(_p(i, d))
    with pytest.raises(QueueFull):
        q.push(_p(9, 0.5))
    q.push(_p(9, 0.5), force=True)  # re-admitted work bypasses the bound
    assert [p.id for p in q.pop(2)] == ["9", "1"]
    assert [p.id for p in q.pop(10)] == ["2", "0"]
    assert q.pop(1) == []


def test_edf_expire_and_oldest():
    q = EDFQueue(limit=10)
    q.push(_p(0, 1.0, arrival=0.3))
    q.push(_p(1, 2.0, arrival=0.1))
    q.push(_p(2, 3.0, arrival=0.2))
    assert q.oldest_arrival() == 0.1
    assert [p.id for p in q.expire(2.0)] == ["0", "1"]
    assert len(q) == 1 and q.peek().id == "2"


@pytest.mark.parametrize("view,expected", [
    (QueueView(0, 0, 100), BatchDecision(0)),
    (QueueView(20, 0, 100), BatchDecision(8)),                 # full batch available
    (QueueView(3, 0, 100), BatchDecision(0, wait_ms=4.0)),     # wait for more (timeout 4 ms)
    (QueueView(3, 4.0, 100), BatchDecision(3)),                # waited long enough
    (QueueView(3, 1.0, 2.0), BatchDecision(3)),                # no slack to wait
])
def test_fixed_batch_policy(view, expected):
    assert FixedBatchPolicy(max_batch=8, timeout_ms=4.0).decide(view) == expected


def test_fixed_policy_zero_timeout_dispatches_at_once():
    assert FixedBatchPolicy(max_batch=8, timeout_ms=0).decide(QueueView(1, 0, 100)) == BatchDecision(1)


def test_unknown_policy_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown batching policy"):
        make_policy("nope", 8, 0)


def test_registry_credit_liveness_and_readiness():
    reg = WorkerRegistry(timeout_s=0.6)
    assert reg.heartbeat("a", "m", 0, 2, capacity=2, now=0.0)
    assert not reg.heartbeat("a", "m", 0, 2, capacity=2, now=0.1, set_aside=3, gave_way=7,
                             late=4)
    assert (reg.workers["a"].set_aside, reg.workers["a"].gave_way,
            reg.workers["a"].late) == (3, 7, 4)  # for status
    assert not reg.ready("m")                       # stage 1 missing
    reg.heartbeat("b", "m", 1, 2, capacity=2, now=0.1)
    assert reg.ready("m")
    a = reg.workers["a"]
    a.inflight["x"] = Inflight("x", "a", "m", [], 0.0, 1)
    a.inflight["y"] = Inflight("y", "a", "m", [], 0.0, 1)
    assert reg.pick("m") is None                    # no credit left: never flooded
    assert reg.release("a", "x").batch_id == "x"
    assert reg.pick("m").id == "a"
    dead = reg.expire(now=1.0)                      # both silent for > 0.6 s
    assert {w.id for w in dead} == {"a", "b"} and "y" in dead[0].inflight | dead[1].inflight
    assert not reg.has_stage0("m")


def test_registry_prefers_most_credit():
    reg = WorkerRegistry(timeout_s=1)
    reg.heartbeat("a", "m", 0, 1, 2, 0.0)
    reg.heartbeat("b", "m", 0, 1, 2, 0.0)
    reg.workers["a"].inflight["x"] = Inflight("x", "a", "m", [], 0.0, 1)
    assert reg.pick("m").id == "b"


SPEC = ModelSpec("m", (TensorContract("x", "<f4", (3, -1)),), (TensorContract("logits", "<f4", (10,)),),
                 10, 1.0)


@pytest.mark.parametrize("inputs,fragment", [
    ({"x": np.zeros((3, 5), np.float64)}, "dtype"),
    ({"x": np.zeros((4, 5), np.float32)}, "shape"),
    ({"x": np.zeros((1, 3, 5), np.float32)}, "shape"),
    ({"y": np.zeros((3, 5), np.float32)}, "unexpected"),
    ({"x": np.zeros((3, 5), np.float32), "z": np.zeros(1, np.float32)}, "unexpected"),
])
def test_input_contract_rejects(inputs, fragment):
    with pytest.raises(ServingError) as err:
        SPEC.check_inputs(inputs)
    assert err.value.code == "bad_request" and fragment in err.value.message


def test_input_contract_accepts_variable_dim():
    SPEC.check_inputs({"x": np.zeros((3, 7), np.float32)})
    assert SPEC.describe()["inputs"] == [{"name": "x", "dtype": "<f4", "shape": [3, -1]}]

"""End to end, greedy partial loading: `OFFRAMP_LLM_DEPTH=4 offramp up --models tiny-llm`
loads four of the six layers; streams answer at the head there, and their request rows
say so."""

from __future__ import annotations

import json

import pytest

from tests.e2e.conftest import wait_for

pytestmark = pytest.mark.e2e
MODEL = "tiny-llm"
STACK_ENV = {"OFFRAMP_LLM_DEPTH": "4"}


def test_a_partially_loaded_worker_answers_at_its_depth(stack):
    done = stack.cli("generate", MODEL, "Once upon a time", "--max-tokens", "6", "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    msgs = [json.loads(line) for line in done.stdout.splitlines()]
    last = msgs[-1]
    assert last["done"] and last["depth"] == 4 and set(last["exits"]) <= {"2", "4"}
    assert msgs[:-1] and all(e <= 4 for m in msgs[:-1] for e in m["exits"])
    rows = wait_for(lambda: stack.sql("SELECT status, variant FROM requests WHERE model = ? "
                                      "AND request_id = ?", MODEL, last["id"]), timeout=60)
    assert rows == [("ok", f"{MODEL}@4")]

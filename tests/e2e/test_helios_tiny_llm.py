"""End to end, HELIOS live: `offramp up --models tiny-llm --adapt` runs the HELIOS service.
Assessment 1 starts with an evaluation (the candidate fully loaded, every exit head
scored); the profiler turns the served streams into PHT rows; the choice loads only the
layers most tokens need and the worker serves at that depth; after RI requests assessment 2
starts. The store answers "which model and depth served these requests, and why" in one
query (the README's)."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from services.store.pht import SERVED_BY_SQL
from tests.e2e.conftest import wait_for

pytestmark = pytest.mark.e2e
MODEL = "tiny-llm"
STACK_ARGS = ("--adapt",)
# every head scored at threshold 0: each token after the first leaves at the first head
# (layer 2) in the evaluation, so the greedy depth is 2 and no token breaches there
STACK_ENV = {"OFFRAMP_HELIOS_RI": "8", "OFFRAMP_HELIOS_EVAL_PROMPTS": "2",
             "OFFRAMP_LLM_THRESHOLD": "0", "OFFRAMP_LLM_HEADS": "all"}


def _generate(stack, prompt: str) -> dict:
    done = stack.cli("generate", MODEL, prompt, "--max-tokens", "6", "--json")
    assert done.returncode == 0, done.stdout + done.stderr + stack.warnings()
    return json.loads(done.stdout.splitlines()[-1])


def _decisions(stack) -> list[tuple]:
    return stack.sql("SELECT kind, candidate, depth, assessment FROM helios_decisions "
                     "WHERE model = ? ORDER BY id", MODEL)


def test_helios_evaluates_then_loads_the_greedy_depth_and_reassesses(stack):
    assert wait_for(lambda: _decisions(stack), timeout=60) == [("evaluate", MODEL, 6, 1)]
    # a stream the worker started before it heard of the evaluation counts toward none:
    # clients keep sending until the evaluation has its two streams and HELIOS chooses
    for prompt in ("Once upon a time", "The sea", "Stars", "Moon", "Clouds", "Hills"):
        assert _generate(stack, prompt)["depth"] == 6
        if wait_for(lambda: len(_decisions(stack)) > 1, timeout=5):
            break
    chosen = wait_for(lambda: len(_decisions(stack)) > 1 and _decisions(stack)[1], timeout=30)
    assert chosen == ("unload", MODEL, 2, 1), (_decisions(stack), stack.warnings())
    pht = stack.sql("SELECT assessment, candidate, loaded_depth, tokens FROM pht "
                    "WHERE model = ?", MODEL)
    assert [(a, c, d) for a, c, d, _ in pht] == [(1, MODEL, 6)] and pht[0][3] > 0
    later = wait_for(lambda: (d := _generate(stack, "A cat")) and d["depth"] == 2 and d,
                     timeout=30)
    assert later, stack.warnings()
    for p in ("def f(x):", "Hello", "Rain", "Snow", "Wind", "Sun"):
        _generate(stack, p)
    assert wait_for(lambda: ("evaluate", MODEL, 6, 2) in _decisions(stack), timeout=60), \
        (_decisions(stack), stack.warnings())
    with sqlite3.connect(stack.db_path, timeout=30) as conn:
        conn.row_factory = sqlite3.Row
        rows = wait_for(lambda: [dict(r) for r in conn.execute(
            SERVED_BY_SQL, {"model": MODEL, "since": "2000-01-01", "until": "2100-01-01"})
            if r["request_id"] == later["id"]], timeout=30)
    assert [(r["candidate"], r["depth"], r["kind"], r["assessment"]) for r in rows] == \
        [(MODEL, 2, "unload", 1)] and "assessment by throughput" in rows[0]["reason"]
    assert stack.sql("SELECT variant FROM requests WHERE request_id = ?", later["id"]) == \
        [(f"{MODEL}@2",)]
    readme = [r for r in stack.sql(readme_query().replace("smollm2-135m", MODEL))
              if r[0] == later["id"]]  # the README's own query answers the same
    assert [r[1:6] for r in readme] == [("ok", f"{MODEL}@2", MODEL, 2, "unload")]
    status = stack.cli("status")  # the decision in force and the streams, for the operator
    assert status.returncode == 0, status.stderr
    assert f"helios {MODEL}: {MODEL}@6 (evaluate, assessment 2" in status.stdout, status.stdout
    assert "generation streams" in status.stdout


def readme_query() -> str:
    """The README's "which model and depth served ..." query, as printed there."""
    text = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    start = text.index("-- which model and depth served")
    body = text[text.index("\n", start) + 1:]
    return body[:body.index(";") + 1]

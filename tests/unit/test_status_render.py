"""`offramp status` says when the generation figures it prints are only stored history."""

from datetime import datetime

from services.cli.status import render

HELIOS = {"tiny-llm": {"decision": {"candidate": "tiny-llm", "depth": 6, "kind": "evaluate",
                                    "assessment": 2, "at": datetime(2026, 12, 4, 21, 0, 0)},
                       "streams": {"streams": 1, "tokens": 8}, "thresholds": {}}}


def test_generation_history_is_labelled_when_no_router_answers():
    down = render({"nats": "x", "router": {"error": "no router answered"}, "monitor": {},
                   "helios": HELIOS})
    assert "helios tiny-llm (stored history; no router answered): tiny-llm@6" in down
    up = render({"nats": "x", "router": {"models": {}}, "monitor": {}, "helios": HELIOS})
    assert "helios tiny-llm: tiny-llm@6 (evaluate, assessment 2, since 21:00:00)" in up
    assert "stored history" not in up


def _router(version: int) -> dict:
    worker = {"id": "w1", "stage": 0, "pid": 7, "credit": 2, "config_version": version}
    return {"models": {"m": {"ready": True, "queue": 0, "served": 3, "errors": 0, "early": 1,
                             "p50_ms": 1.0, "p95_ms": 2.0, "workers": [worker]}}}


def test_a_worker_behind_the_stored_exit_config_shows_it_pending():
    behind = render({"nats": "x", "router": _router(3), "monitor": {},
                     "exit_configs": {"m": 4}})
    assert "exit_config=v3 (v4 pending: taken at its next batch)" in behind
    current = render({"nats": "x", "router": _router(4), "monitor": {},
                      "exit_configs": {"m": 4}})
    assert "exit_config=v4 gave_way" in current and "pending" not in current
    unknown = render({"nats": "x", "router": _router(3), "monitor": {}})
    assert "pending" not in unknown


def test_a_store_that_cannot_be_read_is_said_beside_the_bus_status():
    out = render({"nats": "x", "router": _router(3), "monitor": {},
                  "store_error": "OperationalError('locked')"})
    assert "store: unreadable (OperationalError('locked'))" in out
    assert "worker w1" in out

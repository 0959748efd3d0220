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

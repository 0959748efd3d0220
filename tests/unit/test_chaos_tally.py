"""The chaos bench's accounting: what its client saw against the store's rows, counted by
hand on small cases; and its fuzzed messages, deterministic and of every kind."""

from __future__ import annotations

import numpy as np

from services.bench.chaos_tally import Reply, Tracked, tally
from services.bench.request_fuzz import MUTATIONS, mutated


def _req(rid, *replies, resent=False):
    """A request with replies given as (time, attempt, code, id)."""
    t = Tracked(rid, [f"s.{rid}"] + ([f"s.{rid}-r1"] if resent else []), [0.0])
    for at, attempt, code, reply_id in replies:
        t.replies.append(Reply(at, t.subjects[attempt], code, reply_id, 1))
    return t


def test_codes_losses_duplicates_and_resends():
    reqs = [_req("a", (1.0, 0, "ok", "a")),
            _req("b", (1.0, 0, "overloaded", "b"), (1.1, 0, "ok", "b")),  # two on one subject
            _req("c"),                                                      # no reply at all
            _req("d", (3.0, 1, "ok", "d"), resent=True),                    # resend answered
            _req("e", (2.5, 1, "ok", "e"), (2.9, 0, "ok", "e"), resent=True),  # both answered
            _req("f", (0.5, 0, "no_responders", None))]
    got = tally(reqs, [("a", "ok"), ("b", "overloaded"), ("d", "ok"), ("e", "ok")])
    assert got["requests"] == 6
    assert got["ok"] == 3  # a, d, e; b's first reply was overloaded
    assert got["errors"] == {"no_responders": 1, "overloaded": 1}
    assert got["silent_losses"] == 1
    assert got["duplicate_replies"] == 1
    assert got["answered_twice"] == 1
    assert got["resent"] == 2
    # rows are due for a, b, d, e (no router saw f)
    assert (got["rows_due"], got["rows_missing"], got["rows_mismatched"], got["extra_rows"]) == (
        4, 0, 0, 0)
    assert got["examples"]["duplicate_replies"] == ["b b: overloaded, ok"]


def test_rows_missing_mismatched_and_extra():
    reqs = [_req(r, (1.0, 0, "ok", r)) for r in "abcd"] + [_req("x")]
    rows = [("a", "ok"), ("b", "deadline_exceeded"), ("c", "ok"), ("c", "ok"), ("x", "ok"),
            ("zz", "ok")]
    got = tally(reqs, rows)
    assert got["rows_missing"] == 1        # d
    assert got["rows_mismatched"] == 1     # b: the client got ok
    assert got["extra_rows"] == 3          # c's second, x (never answered), zz
    assert got["examples"] == {"silent_losses": ["x"], "duplicate_replies": [],
                               "rows_missing": ["d"], "rows_mismatched": ["b"],
                               "extra_rows": ["c", "x", "zz"]}


def test_fuzzed_requests_are_matched_by_the_id_their_reply_names():
    reqs = [_req(None, (1.0, 0, "bad_request", "t-1")),
            _req(None, (1.0, 0, "bad_request", None)),   # too mangled to have an id
            _req(None, (1.0, 0, "bad_request", "")),     # "" is what id-less rows carry
            _req(None, (1.0, 0, "ok", "t-3"))]
    got = tally(reqs, [("t-1", "bad_request"), ("t-3", "ok")], by_reply_id=True)
    assert got["answered_without_id"] == 2
    assert (got["rows_due"], got["rows_missing"], got["extra_rows"]) == (2, 0, 0)


def test_fuzz_is_deterministic_and_covers_every_mutation():
    inputs = [{"x": np.linspace(0, 1, 16, dtype=np.float32)}]
    a = mutated("tiny", inputs, 2000, "t", seed=3)
    assert a == mutated("tiny", inputs, 2000, "t", seed=3)
    assert len(a) == 2000 and {k for k, _, _ in a} == set(MUTATIONS)
    assert [rid for _, rid, _ in a[:3]] == ["t-0", "t-1", "t-2"]
    assert all(isinstance(body, bytes) for _, _, body in a)
    assert len({body for _, _, body in a}) > 1600  # mutations, not copies (non-maps repeat)


def test_retry_hint_accuracy_sets_each_hint_against_the_drain_it_met():
    from services.bench.chaos_tally import Reply, Tracked, retry_hint_accuracy

    def req(code, answered, hint=None):
        return Tracked("r", ["s"], [0.0], [Reply(answered, "s", code, "r", None, hint)])

    # two admitted (answered at 3 s and 5 s), then refusals at 1 s hinting 2 s and 8 s:
    # the queue they met drained at 5 s, 4 s later
    requests = [req("ok", 3.0), req("ok", 5.0), req("overloaded", 1.0, 2000.0),
                req("overloaded", 1.0, 8000.0)]
    got = retry_hint_accuracy(requests)
    assert got["refusals"] == 2 and got["ratio_p5"] == 0.5 and got["ratio_p95"] == 2.0
    assert got["within_2x"] == 1.0
    assert retry_hint_accuracy([req("overloaded", 1.0, 5.0)]) is None  # nothing admitted


def test_requests_sharing_an_id_are_due_one_row():
    """The store keeps one row per request id: two fuzzed messages carrying one id are both
    answered and stored once, which is neither a missing nor an extra row."""
    from services.bench.chaos_tally import Reply, Tracked, tally

    def req(rid, subject, code):
        return Tracked(rid, [subject], [0.0], [Reply(1.0, subject, code, rid, None)])

    got = tally([req("a", "s1", "bad_request"), req("a", "s2", "ok"), req("b", "s3", "ok")],
                [("a", "bad_request"), ("b", "ok"), ("c", "ok")])
    assert (got["rows_due"], got["rows_missing"], got["extra_rows"]) == (2, 0, 1)  # "c": extra
    assert tally([req("a", "s1", "ok")], [])["rows_missing"] == 1


def test_hint_ratio_summary_reads_the_routers_histogram_over_the_scenario():
    from services.bench.chaos_tally import hint_ratio_summary
    inf = float("inf")
    before = {0.5: 10.0, 1.0: 10.0, 2.0: 10.0, 4.0: 10.0, inf: 10.0}  # an earlier scenario's
    # 100 refusals in the scenario: 20 at or below 0.5, 60 in (0.5, 1], 10 in (1, 2],
    # 10 in (2, 4]
    after = {0.5: 30.0, 1.0: 90.0, 2.0: 100.0, 4.0: 110.0, inf: 110.0}
    got = hint_ratio_summary(before, after)
    assert got["refusals"] == 100
    assert got["within_2x"] == 0.7
    # rank 50 lies 30 of the 60 into (0.5, 1]: 0.75, interpolated as histogram_quantile does
    assert got["ratio_p50"] == 0.75
    assert got["ratio_p5"] == 0.12    # 5 of 20 into (0, 0.5]
    assert got["ratio_p95"] == 3.0    # 5 of 10 into (2, 4]
    assert hint_ratio_summary(after, after) is None   # no refusal in the scenario
    assert hint_ratio_summary({}, {}) is None

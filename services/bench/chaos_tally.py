"""What a chaos scenario's client saw, set against the store: counts of answers per code,
silent losses, duplicate replies and request rows missing, mismatched or extra.

Pure: the requests and their replies come from ``services.bench.tracked_load``, the rows
from the store, and the figures are plain counts."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

OK = "ok"
# Answers the NATS server gives itself (no router saw the request): no row is due for them.
NO_RESPONDERS = "no_responders"
LOCAL_CODES = frozenset({NO_RESPONDERS})


@dataclass(slots=True)
class Reply:
    t: float                    # when it arrived (time.monotonic)
    subject: str                # the reply subject it came on
    code: str                   # "ok" or the error code
    rid: str | None             # the id the reply carries
    config_version: int | None  # exit config of a success reply
    retry_after_ms: float | None = None  # the hint of an overloaded reply


@dataclass(slots=True)
class Tracked:
    """One request and every attempt at it: the reply subject and send time of each (a
    resend reuses the id with a new subject), and every reply on any of them."""

    rid: str | None             # the id sent (None: unknown, e.g. a fuzzed body)
    subjects: list[str] = field(default_factory=list)
    sent: list[float] = field(default_factory=list)
    replies: list[Reply] = field(default_factory=list)

    @property
    def first(self) -> Reply | None:
        return min(self.replies, key=lambda r: r.t) if self.replies else None


def row_key(t: Tracked, by_reply_id: bool) -> str | None:
    """The request id a row should carry: the id sent, or (a fuzzed body whose id may be
    mangled) the one the first reply names."""
    if not by_reply_id:
        return t.rid
    first = t.first
    # "" cannot be told apart from the rows of requests that had no id at all
    return (first.rid or None) if first is not None else None


def tally(requests: list[Tracked], rows: list[tuple[str, str]],
          by_reply_id: bool = False) -> dict:
    """The scenario's figures. The client's outcome of a request is its first reply; a
    request is a silent loss when no attempt got any reply. ``duplicate_replies`` counts
    replies beyond the first on one reply subject, ``answered_twice`` requests answered on
    more than one of their subjects (a resend that was not needed). Rows: the store keeps one
    row per request id, so each id of an answered request is due one row (with the status
    its client got, when one request alone carried the id; fuzzed messages may share one);
    ``rows_missing`` counts ids without one, ``rows_mismatched`` those whose row has another
    status, ``extra_rows`` rows beyond one per due id and rows of ids never answered."""
    firsts = [t.first for t in requests]
    codes = Counter(f.code for f in firsts if f is not None)
    per_subject = Counter(r.subject for t in requests for r in t.replies)
    due: Counter[str] = Counter()
    client_code: dict[str, str] = {}
    without_id = 0
    for t, f in zip(requests, firsts, strict=True):
        if f is None or f.code in LOCAL_CODES:
            continue
        key = row_key(t, by_reply_id)
        if key is None:
            without_id += 1
            continue
        due[key] += 1
        client_code[key] = f.code
    stored: dict[str, list[str]] = {}
    for rid, status in rows:
        stored.setdefault(rid, []).append(status)
    missing = {k: 1 for k in due if k not in stored}
    mismatched = [k for k, n in due.items()
                  if n == 1 and len(stored.get(k, [])) == 1 and stored[k][0] != client_code[k]]
    extra = {k: len(v) - (k in due) for k, v in stored.items() if len(v) > (k in due)}
    return {
        "requests": len(requests),
        "ok": codes.get(OK, 0),
        "errors": dict(sorted((c, n) for c, n in codes.items() if c != OK)),
        "silent_losses": sum(f is None for f in firsts),
        "duplicate_replies": sum(n - 1 for n in per_subject.values() if n > 1),
        "answered_twice": sum(len({r.subject for r in t.replies}) > 1 for t in requests),
        "resent": sum(len(t.subjects) > 1 for t in requests),
        "rows_due": len(due),
        "rows_missing": sum(missing.values()),
        "rows_mismatched": len(mismatched),
        "extra_rows": sum(extra.values()),
        "answered_without_id": without_id,
        # a few of each, to look them up in the store and the logs
        "examples": {"silent_losses": sample(t.rid for t, f in zip(requests, firsts, strict=True)
                                             if f is None and t.rid),
                     "duplicate_replies": sample(duplicated(requests, per_subject)),
                     "rows_missing": sample(missing), "rows_mismatched": sample(mismatched),
                     "extra_rows": sample(extra)},
    }


def duplicated(requests: list[Tracked], per_subject: Counter) -> list[str]:
    """"<id> <subject's last token>: <codes in order of arrival>" of every reply subject
    that got more than one reply."""
    return [f"{t.rid} {s.rsplit('.', 1)[-1]}: "
            + ", ".join(r.code for r in sorted(t.replies, key=lambda r: r.t) if r.subject == s)
            for t in requests for s in t.subjects if per_subject[s] > 1]


def sample(ids, n: int = 5, width: int = 80) -> list[str]:
    """The first ``n`` ids in sorted order, each cut to ``width`` characters (a fuzzed id
    may be 256 KB)."""
    return [k[:width] for k in sorted(ids)[:n]]


OVERLOADED = "overloaded"


def retry_hint_accuracy(requests: list[Tracked]) -> dict | None:
    """How the ``retry_after_ms`` of each refusal compares with the time the queue it met
    actually took to drain: until the answer to the last request admitted before it (sent
    earlier and not refused; routers queue in arrival order). ``ratio`` = hint / actual;
    None when nothing was refused after something was admitted."""
    ratios: list[float] = []
    last_admitted: float | None = None
    for q in requests:
        first = q.first
        refused = first is not None and first.code == OVERLOADED
        if refused and first.retry_after_ms is not None and last_admitted is not None:
            actual_s = last_admitted - first.t
            if actual_s > 0:
                ratios.append(first.retry_after_ms / 1e3 / actual_s)
        if first is not None and not refused:
            last_admitted = first.t if last_admitted is None else max(last_admitted, first.t)
    if not ratios:
        return None
    ratios.sort()

    def pct(p: float) -> float:
        return round(ratios[min(len(ratios) - 1, int(p * len(ratios)))], 2)

    return {"refusals": len(ratios), "ratio_p5": pct(0.05), "ratio_p50": pct(0.5),
            "ratio_p95": pct(0.95),
            "within_2x": round(sum(0.5 <= r <= 2 for r in ratios) / len(ratios), 3)}


def hint_ratio_summary(before: dict[float, float], after: dict[float, float]) -> dict | None:
    """The routers' own check of their hints over a scenario, from the cumulative buckets
    (``le`` -> count, summed over routers) of ``offramp_retry_hint_ratio`` scraped before
    and after it: each refusal's hint over the time until the tail of the queue it met was
    answered. Quantiles interpolate within a bucket, as PromQL's histogram_quantile does;
    ``within_2x`` counts ratios in (0.5, 2] (bucket bounds)."""
    bounds = sorted(after)
    counts = [after[b] - before.get(b, 0.0) for b in bounds]
    total = counts[-1] if counts else 0.0
    if total <= 0:
        return None

    def quantile(q: float) -> float:
        rank, lo, below = q * total, 0.0, 0.0
        for bound, c in zip(bounds, counts, strict=True):
            if c >= rank:
                if bound == float("inf"):
                    return lo  # beyond the largest finite bound: that bound, as PromQL
                return round(lo + (bound - lo) * (rank - below) / max(c - below, 1e-9), 2)
            lo, below = bound, c
        return lo

    count = dict(zip(bounds, counts, strict=True))
    return {"refusals": int(total), "ratio_p5": quantile(0.05), "ratio_p50": quantile(0.5),
            "ratio_p95": quantile(0.95),
            "within_2x": round((count.get(2.0, 0.0) - count.get(0.5, 0.0)) / total, 3)}

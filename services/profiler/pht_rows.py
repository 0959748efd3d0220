"""HELIOS's Performance History Table rows from the generation streams LLM workers ended
(HELIOS §3.3.2): per assessment, candidate and loaded depth, how fast the candidate decoded,
how soon it answered, how well it predicted the served text and where its tokens left.

The input is the store's ``generations`` rows (dicts: ``assessment``, ``candidate``,
``depth``, ``tokens``, ``ttft_ms``, ``tpot_ms``, ``duration_ms``, ``decode_ms`` (optional),
``logprob``, ``exits`` {layer: tokens}, ``memory_bytes``); the output dicts carry exactly the
fields of ``services.optimizer.helios.PhtRow``, what ``Store.record_pht`` stores. Streams outside any
assessment (``assessment`` None) and groups that emitted no token are left out: there is no
speed or perplexity to report for them. Where the paper is vague the docstrings say "Choice:".
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

# exp() of more overflows a float64: a perplexity this large means "no better than chance"
# anyway, and an overflow must not stop the role on one odd stream.
MAX_MEAN_NLL = 700.0


def pht_rows_from_generations(generations: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One PHT row per (assessment, candidate, loaded depth) of ``generations`` with tokens,
    ordered by those three."""
    groups: dict[tuple[int, str, int], list[Mapping[str, Any]]] = {}
    for g in generations:
        if g["assessment"] is not None:
            key = (int(g["assessment"]), str(g["candidate"]), int(g["depth"]))
            groups.setdefault(key, []).append(g)
    rows = [pht_row(*key, streams) for key, streams in sorted(groups.items())]
    return [r for r in rows if r is not None]


def pht_row(assessment: int, candidate: str, depth: int,
            streams: list[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The PHT row of ``streams``, all served by ``candidate`` at ``depth`` in ``assessment``;
    None when they emitted no token.

    Choice: ``tokens_per_s`` is the tokens over the time the streams decoded, i.e. one
    stream's decoding speed weighted by its length, not the worker's throughput over
    concurrent streams (which depends on the load, not on the candidate). A stream's time is
    its ``decode_ms`` where the worker measured it: the time in its own candidate's
    decoding calls. While a candidate is evaluated its rounds also step the served model's
    draining streams and run the judge, so the time from acceptance to last token
    (``duration_ms``, the fallback) would charge it for another candidate's work.
    ``ttft_ms`` is the mean over streams (one first token each); ``tpot_ms`` the mean over
    tokens; ``perplexity`` exp of the mean negative log-probability per token, judged by the
    served model where it judged (another candidate's evaluation streams: so candidates
    compare) else by the candidate itself; ``memory_bytes`` the largest stream's (weights plus its KV cache: what must fit)."""
    tokens = sum(int(s["tokens"]) for s in streams)
    if tokens <= 0:
        return None
    decoding_ms = sum(_decoding_ms(s) for s in streams)
    nll = -sum(_judged(s) for s in streams) / tokens
    return {"candidate": candidate, "assessment": assessment, "loaded_depth": depth,
            "tokens_per_s": tokens * 1000.0 / decoding_ms if decoding_ms > 0 else 0.0,
            "ttft_ms": sum(float(s["ttft_ms"]) for s in streams) / len(streams),
            "tpot_ms": sum(float(s["tpot_ms"]) * int(s["tokens"]) for s in streams) / tokens,
            "perplexity": math.exp(min(nll, MAX_MEAN_NLL)),
            "exit_distribution": exit_distribution(s["exits"] for s in streams),
            "memory_bytes": max(int(s["memory_bytes"]) for s in streams),
            "tokens": tokens}


def _decoding_ms(stream: Mapping[str, Any]) -> float:
    """The time ``stream`` spent in its candidate's decoding calls, else (not measured) from
    its acceptance to its last token."""
    own = stream.get("decode_ms")
    return float(stream["duration_ms"] if own is None else own)


def _judged(stream: Mapping[str, Any]) -> float:
    """A stream's log-probability under the served model where another candidate answered
    and the served model judged it, else under the candidate that answered."""
    judged = stream.get("judged_logprob")
    return float(stream["logprob"] if judged is None else judged)


def exit_distribution(exits: Iterable[Mapping[Any, int]]) -> dict[int, float]:
    """{layer: share of tokens that left there} of per-stream {layer: tokens} counts (layer
    keys as ints, whether they came as ints or JSON strings); {} without tokens."""
    counts: dict[int, int] = {}
    for per_stream in exits:
        for layer, n in per_stream.items():
            counts[int(layer)] = counts.get(int(layer), 0) + int(n)
    total = sum(counts.values())
    return {layer: n / total for layer, n in sorted(counts.items())} if total else {}

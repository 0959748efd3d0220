"""One generation stream as an LLM worker serves it: the request, the tokens produced, the
text they add, when it ends (end-of-sequence, a stop string, ``max_tokens``, the model's
context) and the messages it sends: token chunks, one terminal message, and its generation
telemetry record (what served it and how it went, for HELIOS).

No torch and no bus: the worker passes the tokenizer's ``decode`` and the clock.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from schemas.generation import (
    FINISH_LENGTH,
    FINISH_STOP,
    GenerateDone,
    GenerateRequest,
    encode_chunk,
)
from schemas.helios import GenerationRecord

Decode = Callable[[list[int]], str]


@dataclass
class GenStream:
    request: GenerateRequest
    reply: str
    router: str
    prompt: list[int]
    accepted: float                  # monotonic seconds
    limit: int                       # the most tokens it may produce (max_tokens, context)
    received: float = 0.0            # unix seconds the router received it
    candidate: str = ""              # the candidate it started on (HELIOS may switch)
    depth: int = 0                   # loaded depth when it started: what serves it
    assessment: int | None = None    # the HELIOS assessment it counts toward
    tokens: list[int] = field(default_factory=list)
    exits: list[int] = field(default_factory=list)
    text: str = ""
    first_at: float | None = None
    last_at: float | None = None
    logprob: float = 0.0             # sum of ln p of the tokens kept
    breach_at: list[int] = field(default_factory=list)
    confidences: list[float] = field(default_factory=list)  # per token kept
    feedback: list[tuple[int, float, int]] = field(default_factory=list)
    first_deviation: int | None = None
    seq: int = 0
    finish: str = ""
    decode_ms: float = 0.0           # in its own candidate's prefill and steps (HELIOS's PHT)

    @property
    def id(self) -> str:
        return self.request.id

    def add(self, token: int, layers: int, now: float, decode: Decode, eos: frozenset[int],
            confidence: float = 1.0, breach: bool = False) -> bytes:
        """Record one produced token, emitted with top probability ``confidence`` (greedy:
        the token's own) and, with ``breach``, below the threshold at a partial depth's
        head; returns its chunk (and sets ``finish`` when it ends the stream). The
        end-of-sequence token ends it without being sent as text."""
        if self.first_at is None:
            self.first_at = now
        self.last_at = now
        chunk_tokens, chunk_exits, delta = [], [], ""
        if token in eos:
            self.finish = FINISH_STOP
        else:
            if breach:
                self.breach_at.append(len(self.tokens))
            self.tokens.append(token)
            self.exits.append(layers)
            self.confidences.append(confidence)
            self.logprob += math.log(max(confidence, 1e-30))
            chunk_tokens, chunk_exits = [token], [layers]
            # a token may end inside a multi-byte character (shown as U+FFFD until the next
            # token completes it): text is sent up to the last complete character
            full = decode(self.tokens).rstrip("\ufffd")
            if full.startswith(self.text):
                delta, self.text = full[len(self.text):], full
            if any(s in self.text for s in self.request.stop):
                self.finish = FINISH_STOP
            elif len(self.tokens) >= self.limit:
                self.finish = FINISH_LENGTH
        data = encode_chunk(self.id, self.seq, chunk_tokens, delta, chunk_exits)
        self.seq += 1
        return data

    def timings(self, now: float) -> tuple[float, float, float]:
        """(TTFT, TPOT, accepted to last token) in ms; a stream without tokens ends now."""
        first = self.first_at if self.first_at is not None else now
        last = self.last_at if self.last_at is not None else now
        n = len(self.tokens)
        return ((first - self.accepted) * 1e3, (last - first) * 1e3 / (n - 1) if n > 1 else 0.0,
                (last - self.accepted) * 1e3)

    def done(self, now: float) -> bytes:
        """Its terminal message, naming the candidate and depth it started on."""
        ttft, tpot, _ = self.timings(now)
        return GenerateDone(
            self.id, self.request.model, self.finish or FINISH_LENGTH, len(self.prompt),
            len(self.tokens), ttft, tpot, (now - self.accepted) * 1e3,
            dict(Counter(self.exits)), self.candidate, self.depth).encode()


    def check(self, index: int, layer: int, agreed: bool) -> None:
        """Token-level feedback: the full model's token at answer token ``index`` (emitted at
        exit ``layer``) is the same (``agreed``) or not. A token past the stream's end (the
        end-of-sequence token is not kept) is not the stream's."""
        if not 0 <= index < len(self.tokens):
            return
        self.feedback.append((layer, self.confidences[index], int(agreed)))
        if not agreed and (self.first_deviation is None or index < self.first_deviation):
            self.first_deviation = index

    def record(self, now: float, memory_bytes: int) -> GenerationRecord:
        """Its generation telemetry once it ended with an answer."""
        ttft, tpot, duration = self.timings(now)
        return GenerationRecord(
            self.id, self.received, self.candidate, self.depth, self.assessment, len(self.prompt),
            len(self.tokens), ttft, tpot, duration, self.logprob, dict(Counter(self.exits)),
            list(self.breach_at), memory_bytes, list(self.feedback), self.first_deviation,
            decode_ms=self.decode_ms)


def prompt_problem(prompt: list[int], max_tokens: int, vocab: int,
                   slot_tokens: int) -> str | None:
    """Why a tokenised prompt cannot be served (None: it can)."""
    if not prompt:
        return "the prompt has no tokens"
    if max(prompt) >= vocab:
        return f"token id {max(prompt)} is outside the vocabulary of {vocab}"
    if len(prompt) + max_tokens > slot_tokens:
        return (f"the prompt's {len(prompt)} tokens and max_tokens {max_tokens} exceed the "
                f"{slot_tokens} tokens a stream may hold (the model's context, or "
                "OFFRAMP_LLM_SLOT_TOKENS)")
    return None

"""What the HELIOS replay (``services.sim.helios_sim``) reads (pure): one candidate's recorded
per-token exit trace, its timing profile and memory sizes, and the drifting prompt stream.
``services.bench.helios_traces`` records and stores traces; this module holds no I/O.

A token's *needed* layer under threshold ``t`` is the first exit head whose confidence (top
probability) reaches ``t``, else ``n_layers``; leaving at an exit layer it serves that head's
argmax (the full model's token at ``n_layers``), scored by the judge's log-prob of it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from services.optimizer.helios import Candidate, perplexity


@dataclass(frozen=True)
class HeadTrace:
    """One exit head over a prompt's generated tokens: top probability, argmax token and the
    judge's natural-log probability of that token."""

    confidence: tuple[float, ...]
    token: tuple[int, ...]
    judge_logprob: tuple[float, ...]


@dataclass(frozen=True)
class PromptTrace:
    """One prompt: its generated tokens as the full model chose them (``full_logprob``: the
    judge's log-prob of each) and every head's reading; ``prompt_tokens`` its length."""

    prompt_id: str
    kind: str
    prompt_tokens: int
    full_token: tuple[int, ...]
    full_logprob: tuple[float, ...]
    heads: Mapping[int, HeadTrace]

    def __post_init__(self) -> None:
        n = len(self.full_token)
        lengths = {len(self.full_logprob)} | {len(x) for h in self.heads.values()
                                              for x in (h.confidence, h.token, h.judge_logprob)}
        if n < 1 or lengths != {n}:
            raise ValueError(f"prompt {self.prompt_id}: per-token columns of unequal or no length")

    def needed(self, threshold: float, n_layers: int) -> tuple[int, ...]:
        """Per token: the first head layer confident at ``threshold``, else ``n_layers``."""
        layers = sorted(self.heads)
        return tuple(next((k for k in layers if self.heads[k].confidence[i] >= threshold),
                          n_layers) for i in range(len(self.full_token)))

    def served(self, i: int, layer: int) -> tuple[int, float]:
        """(token, judge log-prob) that token ``i`` emits leaving at ``layer``."""
        head = self.heads.get(layer)
        if head is None:
            return self.full_token[i], self.full_logprob[i]
        return head.token[i], head.judge_logprob[i]


def _interpolate(xs: Sequence[int], ys: Sequence[float], x: float) -> float:
    """Linear between points; below the first, the first; beyond the last, extrapolated from
    the last two with a slope of at least 0."""
    if len(xs) == 1 or x <= xs[0]:
        return ys[0]
    for i in range(1, len(xs)):
        if x <= xs[i]:
            return ys[i - 1] + (ys[i] - ys[i - 1]) * (x - xs[i - 1]) / (xs[i] - xs[i - 1])
    slope = max(0.0, (ys[-1] - ys[-2]) / (xs[-1] - xs[-2]))
    return ys[-1] + slope * (x - xs[-1])


@dataclass(frozen=True)
class Timing:
    """Measured where the trace was recorded (ms): one full-depth decode step with KV cache
    (``step_ms``) and the LM head alone (``lm_head_ms``) at each of ``batches`` (ascending),
    and one full-depth pass over a prompt at batch 1 (``prefill_ms``)."""

    batches: tuple[int, ...]
    step_ms: tuple[float, ...]
    lm_head_ms: tuple[float, ...]
    prefill_ms: float
    n_layers: int

    def __post_init__(self) -> None:
        if not self.batches or list(self.batches) != sorted(set(self.batches)) \
                or self.batches[0] < 1 or len(self.step_ms) != len(self.batches) \
                or len(self.lm_head_ms) != len(self.batches) or self.n_layers < 1:
            raise ValueError("timing: batches must ascend from >= 1, one time per batch")
        if min(self.step_ms) <= 0 or min(self.lm_head_ms) < 0 or self.prefill_ms < 0:
            raise ValueError("timing: steps must take > 0 ms, the rest >= 0 ms")

    def fixed_ms(self, batch: int) -> float:
        return _interpolate(self.batches, self.lm_head_ms, batch)

    def layer_ms(self, batch: int) -> float:
        per = [max(0.0, s - h) / self.n_layers for s, h in zip(self.step_ms, self.lm_head_ms,
                                                                 strict=True)]
        return _interpolate(self.batches, per, batch)

    def step(self, layers: float, batch: int) -> float:
        """Modeled decode step of ``batch`` rows running ``layers`` layers on average."""
        return self.fixed_ms(batch) + layers * self.layer_ms(batch)

    def prefill(self, depth: int) -> float:
        """Modeled prompt pass at batch 1 through ``depth`` layers."""
        fixed = self.fixed_ms(1)
        return fixed + depth * max(0.0, self.prefill_ms - fixed) / self.n_layers


@dataclass(frozen=True)
class CandidateTrace:
    """Everything the replay knows of one candidate. ``judge`` names the model whose
    log-probs the trace holds (perplexities compare across candidates only under one)."""

    name: str
    family: str
    judge: str
    n_layers: int
    layer_bytes: int
    fixed_bytes: int
    kv_bytes_per_token_layer: int
    new_tokens: int
    prompt_tokens: int
    timing: Timing
    prompts: tuple[PromptTrace, ...]
    layer_load_ms: float | None = None  # measured: one layer read back from disk

    def __post_init__(self) -> None:
        if not self.prompts:
            raise ValueError(f"{self.name}: a trace without prompts")
        heads = {tuple(sorted(p.heads)) for p in self.prompts}
        if len(heads) != 1 or any(not 1 <= k < self.n_layers for k in next(iter(heads))):
            raise ValueError(f"{self.name}: every prompt needs the same heads below "
                             f"{self.n_layers}, got {sorted(heads)}")
        if self.timing.n_layers != self.n_layers:
            raise ValueError(f"{self.name}: timing of {self.timing.n_layers} layers")

    @property
    def head_layers(self) -> tuple[int, ...]:
        return tuple(sorted(self.prompts[0].heads))

    @property
    def tokens_per_request(self) -> int:
        return self.prompt_tokens + self.new_tokens

    def candidate(self) -> Candidate:
        """The repository entry: offline tokens/s at full depth and batch 1, the full model's
        perplexity over the whole trace, no exit distribution."""
        lps = [lp for p in self.prompts for lp in p.full_logprob]
        return Candidate(self.name, self.family, self.n_layers,
                         (*self.head_layers, self.n_layers), self.layer_bytes,
                         self.fixed_bytes, self.kv_bytes_per_token_layer,
                         1000.0 / self.timing.step(self.n_layers, 1), perplexity(lps))


def check_traces(traces: Mapping[str, CandidateTrace]) -> None:
    """The traces replay one stream: same prompts (ids, kinds) in the same order, same
    prompt and answer lengths."""
    if not traces:
        raise ValueError("no traces")
    first = next(iter(traces.values()))
    for name, t in traces.items():
        if name != t.name:
            raise ValueError(f"trace {t.name!r} filed as {name!r}")
        if [(p.prompt_id, p.kind) for p in t.prompts] != \
                [(p.prompt_id, p.kind) for p in first.prompts]:
            raise ValueError(f"{name} and {first.name} were recorded on different prompts: "
                             "record them again together")
        if (t.new_tokens, t.prompt_tokens) != (first.new_tokens, first.prompt_tokens):
            raise ValueError(f"{name} and {first.name} differ in prompt or answer length")


def drifting_stream(kinds: Sequence[str], requests: int, drift_every: int,
                    seed: int = 0) -> list[int]:
    """Prompt indices (into ``kinds``, the traces' prompt kinds) of a stream whose kind
    changes every ``drift_every`` requests, cycling through the kinds from a seeded start.
    Choice: each request draws a prompt of the current kind uniformly, with replacement
    (seeded hash, no global state)."""
    if requests < 1 or drift_every < 1:
        raise ValueError("requests and drift_every must be >= 1")
    order = list(dict.fromkeys(kinds))
    if not order:
        raise ValueError("no prompts to draw from")
    by_kind = {k: [i for i, x in enumerate(kinds) if x == k] for k in order}
    start = _draw(seed, "start", len(order))
    out = []
    for n in range(requests):
        pool = by_kind[order[(start + n // drift_every) % len(order)]]
        out.append(pool[_draw(seed, n, len(pool))])
    return out


def _draw(seed: int, key: object, n: int) -> int:
    return int.from_bytes(hashlib.sha256(f"{seed}\0{key}".encode()).digest()[:8], "big") % n

"""HELIOS on the bus (``schemas/README.md``, "Generation telemetry", "HELIOS decision",
"Confidence breach"): what an LLM worker reports per stream, what the optimizer decides
serves a generative model, and the tuner's breach alert that asks it to decide again.

- **Generation telemetry** (``offramp.telemetry.generation.<model>``, stored in the telemetry
  stream): one record per stream an LLM worker ended, with the candidate and loaded depth
  that served it and the assessment it counts toward. The monitor stores the records
  (``generations``), the profiler turns them into Performance History Table rows, the tuner
  feeds their breaches to the Confidence Breach Counter.
- **HELIOS decision** (``offramp.helios.decision.<model>``): the optimizer's choice of
  candidate and depth, re-broadcast periodically so a new worker catches up.
- **Confidence breach** (``offramp.helios.breach.<model>``): the tuner's counter tripped.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from schemas.codec import SCHEMA_VERSION, pack
from schemas.fields import FieldReader

DECISION_KINDS = ("evaluate", "load", "unload", "switch", "stay")


@dataclass(slots=True)
class GenerationRecord:
    """One stream an LLM worker ended with an answer. ``logprob`` is the natural-log
    probability of the emitted tokens summed, each under the distribution it was emitted
    from (greedy: its top probability); ``exits`` counts tokens per layer they left at;
    ``breach_at`` lists the tokens (0-based) that left at a partial depth's head below the
    confidence threshold, i.e. needed layers that were not loaded. ``feedback`` is the
    token-level feedback of parallel decoding: for each token emitted at an exit head whose
    position later reached the last layer, ``[exit layer, its confidence, 1 if the full
    model's token is the same else 0]``, in token order; ``first_deviation`` is the first
    answer token (0-based) the full model disagreed with, None when none did.
    ``judged_logprob``: the served model's own log-probability of the same tokens
    (teacher-forced) when another candidate answered while the worker held the served model
    as judge (HELIOS's evaluation), so that candidates' perplexities compare; else None.
    A judged stream is reported twice: with ``judging`` set beside its terminal message (the
    stream is on record even if the worker dies before the judge is done), then again with
    ``judged_logprob``, which completes that record and adds nothing else. ``decode_ms``: the
    time the worker spent in the decoding calls that advanced this stream (its prefill and
    each step of its candidate's decoder), without other candidates' steps or judge passes
    sharing its rounds: what the candidate itself cost it; None from a worker that does not
    measure it."""

    id: str
    t: float                  # unix seconds the router received it
    candidate: str
    depth: int                # loaded depth that served it
    assessment: int | None    # the HELIOS decision's assessment it counts toward
    prompt_tokens: int
    tokens: int
    ttft_ms: float
    tpot_ms: float
    duration_ms: float        # accepted by the worker to its last token
    logprob: float
    exits: dict[int, int] = field(default_factory=dict)
    breach_at: list[int] = field(default_factory=list)
    memory_bytes: int = 0     # resident weights plus this stream's KV cache
    feedback: list[tuple[int, float, int]] = field(default_factory=list)
    first_deviation: int | None = None
    judged_logprob: float | None = None
    judging: bool = False     # the served model is scoring it: judged_logprob follows
    decode_ms: float | None = None  # in its own candidate's decoding calls

    @property
    def completes(self) -> bool:
        """Whether this record only completes one sent before with its judged score."""
        return self.judged_logprob is not None

    @property
    def checked(self) -> int:
        return len(self.feedback)

    @property
    def agreed(self) -> int:
        return sum(int(a) for _, _, a in self.feedback)

    def to_map(self) -> dict[str, Any]:
        return {"id": self.id, "t": float(self.t), "candidate": self.candidate,
                "depth": int(self.depth),
                "assessment": None if self.assessment is None else int(self.assessment),
                "prompt_tokens": int(self.prompt_tokens), "tokens": int(self.tokens),
                "ttft_ms": float(self.ttft_ms), "tpot_ms": float(self.tpot_ms),
                "duration_ms": float(self.duration_ms), "logprob": float(self.logprob),
                "exits": {int(k): int(v) for k, v in self.exits.items()},
                "breach_at": [int(i) for i in self.breach_at],
                "memory_bytes": int(self.memory_bytes),
                "feedback": [[int(k), float(c), int(a)] for k, c, a in self.feedback],
                "first_deviation": (None if self.first_deviation is None
                                    else int(self.first_deviation)),
                "judged_logprob": (None if self.judged_logprob is None
                                   else float(self.judged_logprob)),
                "judging": bool(self.judging),
                "decode_ms": None if self.decode_ms is None else float(self.decode_ms)}

    @classmethod
    def from_map(cls, rec: Any, i: int) -> GenerationRecord:
        r = FieldReader(rec, f"generation record {i}")
        exits = r.int_key_numbers("exits")
        tokens = r.integer("tokens")
        if any(v < 0 or v != int(v) for v in exits.values()) or sum(exits.values()) != tokens:
            raise r.error(f"exits {exits} must count the {tokens} tokens")
        breach_at = r.integers("breach_at")
        if any(not 0 <= b < tokens for b in breach_at):
            raise r.error(f"breach_at {breach_at} must index the {tokens} tokens")
        feedback = [(int(k), c, int(a)) for k, c, a in _triples(r, "feedback")]
        first = r.integer("first_deviation", None)
        if first is not None and not 0 <= first < tokens:
            raise r.error(f"first_deviation {first} must index the {tokens} tokens")
        decode_ms = r.number("decode_ms", None)
        if decode_ms is not None and decode_ms < 0:
            raise r.error(f"decode_ms {decode_ms} must be >= 0")
        return cls(id=r.text("id"), t=r.number("t"), candidate=r.text("candidate"),
                   depth=r.integer("depth"), assessment=r.integer("assessment", None),
                   prompt_tokens=r.integer("prompt_tokens"), tokens=tokens,
                   ttft_ms=r.number("ttft_ms"), tpot_ms=r.number("tpot_ms"),
                   duration_ms=r.number("duration_ms"), logprob=r.number("logprob"),
                   exits={k: int(v) for k, v in exits.items()}, breach_at=breach_at,
                   memory_bytes=r.integer("memory_bytes"), feedback=feedback,
                   first_deviation=first, judged_logprob=r.number("judged_logprob", None),
                   judging=r.flag("judging", False), decode_ms=decode_ms)


def _triples(r: FieldReader, name: str) -> list[list[float]]:
    """``[layer, confidence, agreed]`` rows (absent: none)."""
    if r.msg.get(name) is None:
        return []
    rows = r.number_rows(name)
    for row in rows:
        if len(row) != 3 or row[0] != int(row[0]) or row[0] < 1 or not 0 <= row[1] <= 1 \
                or row[2] not in (0, 1):
            raise r.error(f"{name} rows must be [layer >= 1, confidence in [0, 1], 0 or 1], "
                          f"got {row}")
    return rows


@dataclass(frozen=True, slots=True)
class GenerationTelemetry:
    """The streams one LLM worker of ``model`` ended since its last report."""

    model: str
    worker: str
    records: list[GenerationRecord] = field(default_factory=list)

    def encode(self) -> bytes:
        return pack({"v": SCHEMA_VERSION, "model": self.model, "worker": self.worker,
                     "records": [r.to_map() for r in self.records]})

    @classmethod
    def decode(cls, msg: dict[str, Any]) -> GenerationTelemetry:
        f = FieldReader(msg, "generation telemetry")
        return cls(model=f.text("model"), worker=f.text("worker"),
                   records=[GenerationRecord.from_map(r, i)
                            for i, r in enumerate(f.maps("records"))])


@dataclass(frozen=True, slots=True)
class HeliosChoice:
    """What serves ``model`` from now on: ``candidate`` loaded to ``depth``. ``decision`` is
    the ``helios_decisions`` row id (increasing; a worker ignores older ones); ``kind`` says
    why (evaluate, load, unload, switch, stay) and ``assessment`` which interval it belongs to."""

    model: str
    decision: int
    kind: str
    candidate: str
    depth: int
    assessment: int | None
    threshold: float | None = None  # the confidence a token needs at the loaded depth's head

    def encode(self) -> bytes:
        return pack({"v": SCHEMA_VERSION, "model": self.model, "decision": int(self.decision),
                     "kind": self.kind, "candidate": self.candidate, "depth": int(self.depth),
                     "assessment": None if self.assessment is None else int(self.assessment),
                     "threshold": None if self.threshold is None else float(self.threshold)})

    @classmethod
    def decode(cls, msg: dict[str, Any]) -> HeliosChoice:
        f = FieldReader(msg, "HELIOS decision")
        kind, depth = f.text("kind"), f.integer("depth")
        if kind not in DECISION_KINDS:
            raise f.error(f"kind {kind!r} is not one of {DECISION_KINDS}")
        if depth < 1:
            raise f.error(f"depth must be >= 1, got {depth}")
        threshold = f.number("threshold", None)
        if threshold is not None and not 0 <= threshold <= 1:
            raise f.error(f"threshold must be in [0, 1], got {threshold}")
        return cls(model=f.text("model"), decision=f.integer("decision"), kind=kind,
                   candidate=f.text("candidate"), depth=depth,
                   assessment=f.integer("assessment", None), threshold=threshold)


@dataclass(frozen=True, slots=True)
class BreachAlert:
    """The tuner's Confidence Breach Counter for ``model`` served by ``candidate`` at
    ``depth`` (under decision ``decision``) counted ``breaches`` of the last ``window``
    tokens: more than it tolerates."""

    model: str
    decision: int
    candidate: str
    depth: int
    breaches: int
    window: int

    def encode(self) -> bytes:
        return pack({"v": SCHEMA_VERSION, "model": self.model, "decision": int(self.decision),
                     "candidate": self.candidate, "depth": int(self.depth),
                     "breaches": int(self.breaches), "window": int(self.window)})

    @classmethod
    def decode(cls, msg: dict[str, Any]) -> BreachAlert:
        f = FieldReader(msg, "confidence breach")
        return cls(model=f.text("model"), decision=f.integer("decision"),
                   candidate=f.text("candidate"), depth=f.integer("depth"),
                   breaches=f.integer("breaches"), window=f.integer("window"))

"""Generation on the bus (``schemas/README.md``, "Generation"): a request on
``offramp.generate.<model>`` and the stream of replies it gets.

One request gets, on its reply subject, zero or more **token chunks** (``seq`` 0, 1, ...)
and then exactly one terminal message: **done** (usage, timings, exits) or an **error**
reply (``schemas.messages.encode_error``). A client reads until the terminal message.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from schemas import errors
from schemas.codec import SCHEMA_VERSION, pack
from schemas.errors import ServingError
from schemas.fields import FieldReader
from schemas.messages import MAX_ID_BYTES

MAX_TOKENS_LIMIT = 4096   # the wire's bound on max_tokens; a model may allow fewer
MAX_PROMPT_CHARS = 65536  # text prompts longer than this are refused before tokenising
MAX_STOPS = 8             # stop strings per request
MAX_STOP_CHARS = 64
FINISH_STOP = "stop"      # a stop string or token ended it
FINISH_LENGTH = "length"  # max_tokens, or the model's context, ended it


def _bad(message: str) -> ServingError:
    return ServingError(errors.BAD_REQUEST, message)


@dataclass(slots=True)
class GenerateRequest:
    id: str
    model: str
    max_tokens: int
    prompt: str | None = None             # text, tokenised by the serving worker
    prompt_tokens: list[int] | None = None
    stop: list[str] = field(default_factory=list)
    chat: bool = False                    # wrap the prompt in the model's chat template
    ttft_slo_ms: float | None = None
    tpot_slo_ms: float | None = None

    def encode(self) -> bytes:
        msg: dict[str, Any] = {"v": SCHEMA_VERSION, "id": self.id, "model": self.model,
                               "max_tokens": self.max_tokens}
        if self.prompt is not None:
            msg["prompt"] = self.prompt
        if self.prompt_tokens is not None:
            msg["prompt_tokens"] = list(self.prompt_tokens)
        if self.stop:
            msg["stop"] = list(self.stop)
        if self.chat:
            msg["chat"] = True
        for name in ("ttft_slo_ms", "tpot_slo_ms"):
            if getattr(self, name) is not None:
                msg[name] = float(getattr(self, name))
        return pack(msg)


def _positive(r: FieldReader, name: str) -> float | None:
    value = r.number(name, None)
    if value is not None and (not math.isfinite(value) or value <= 0):
        raise r.error(f"field {name!r} must be a positive number, got {value!r}")
    return value


def _prompt(r: FieldReader, msg: dict[str, Any]) -> tuple[str | None, list[int] | None]:
    has_text, has_tokens = msg.get("prompt") is not None, msg.get("prompt_tokens") is not None
    if has_text == has_tokens:
        raise r.error("give exactly one of 'prompt' (a string) and 'prompt_tokens' "
                      "(an array of token ids)")
    if has_text:
        text = r.text("prompt")
        if not text:
            raise r.error("field 'prompt' is empty")
        if len(text) > MAX_PROMPT_CHARS:
            raise r.error(f"field 'prompt' is {len(text)} characters; at most "
                          f"{MAX_PROMPT_CHARS}")
        return text, None
    tokens = r.integers("prompt_tokens")
    if not tokens:
        raise r.error("field 'prompt_tokens' is empty")
    if min(tokens) < 0:
        raise r.error("field 'prompt_tokens' holds a negative token id")
    return None, tokens


def decode_generate_request(msg: dict[str, Any], subject_model: str) -> GenerateRequest:
    """Validate a generation request (the serving worker checks token ids and the prompt's
    length against its model)."""
    r = FieldReader(msg, "generate request")
    rid = r.text("id")
    if not rid or len(rid.encode()) > MAX_ID_BYTES:
        raise r.error(f"field 'id' must be a non-empty string of at most {MAX_ID_BYTES} bytes")
    model = r.text("model", subject_model)
    if model != subject_model:
        raise _bad(f"field 'model' is {model!r} but the request was sent to "
                   f"{subject_model!r}")
    max_tokens = r.integer("max_tokens")
    if not 1 <= max_tokens <= MAX_TOKENS_LIMIT:
        raise r.error(f"field 'max_tokens' must be 1 to {MAX_TOKENS_LIMIT}, got {max_tokens}")
    prompt, tokens = _prompt(r, msg)
    stop = r.texts("stop") if msg.get("stop") is not None else []
    if len(stop) > MAX_STOPS or any(not s or len(s) > MAX_STOP_CHARS for s in stop):
        raise r.error(f"field 'stop' must hold at most {MAX_STOPS} non-empty strings of at "
                      f"most {MAX_STOP_CHARS} characters")
    return GenerateRequest(rid, model, max_tokens, prompt, tokens, stop, r.flag("chat", False),
                           _positive(r, "ttft_slo_ms"), _positive(r, "tpot_slo_ms"))


def encode_chunk(rid: str, seq: int, tokens: list[int], text: str, exits: list[int]) -> bytes:
    """Tokens as they are produced: ``exits`` holds, per token, the number of layers it ran
    (the model's depth when no exit head answered)."""
    return pack({"v": SCHEMA_VERSION, "id": rid, "seq": int(seq),
                 "tokens": [int(t) for t in tokens], "text": text,
                 "exits": [int(e) for e in exits]})


@dataclass(slots=True)
class GenerateDone:
    """The terminal message of a successful stream."""

    id: str
    model: str
    finish: str                 # FINISH_STOP or FINISH_LENGTH
    prompt_tokens: int
    completion_tokens: int
    ttft_ms: float              # from the worker accepting the request to the first token
    tpot_ms: float              # mean time per output token after the first
    total_ms: float
    exits: dict[int, int]       # layers run -> tokens
    candidate: str = ""         # the model (HELIOS candidate) that produced the tokens
    depth: int = 0              # the layers it had loaded

    def encode(self) -> bytes:
        return pack({"v": SCHEMA_VERSION, "id": self.id, "done": True, "model": self.model,
                     "finish": self.finish, "candidate": self.candidate,
                     "depth": int(self.depth),
                     "usage": {"prompt_tokens": int(self.prompt_tokens),
                               "completion_tokens": int(self.completion_tokens)},
                     "timings": {"ttft_ms": float(self.ttft_ms), "tpot_ms": float(self.tpot_ms),
                                 "total_ms": float(self.total_ms)},
                     "exits": {int(k): int(v) for k, v in sorted(self.exits.items())}})


@dataclass(slots=True)
class LlmWork:
    """A router hands a generation request to one LLM worker (``offramp.llm.<worker_id>``):
    the client's request as sent, where to stream (``reply``), and where to release the
    stream when its terminal message is out (``router``: a Results with ``release`` and the
    request id as ``batch_id``)."""

    router: str
    reply: str
    request: bytes
    waited_ms: float = 0.0   # queued at the router before a slot was free

    def encode(self) -> bytes:
        return pack({"v": SCHEMA_VERSION, "router": self.router, "reply": self.reply,
                     "request": self.request, "waited_ms": float(self.waited_ms)})

    @classmethod
    def decode(cls, msg: dict[str, Any]) -> LlmWork:
        r = FieldReader(msg, "llm work")
        request = msg.get("request")
        if not isinstance(request, bytes):
            raise r.error("field 'request' must be bytes")
        return cls(r.text("router"), r.text("reply"), request, r.number("waited_ms", 0.0))

"""Typed wire messages. ``schemas/README.md`` documents each field.

Every message is a msgpack map with ``"v": SCHEMA_VERSION``. ``decode_*`` functions and
``decode`` classmethods validate and raise :class:`ServingError` (``bad_request``) with a
message that says exactly what is wrong, so a service can turn any bad input into an error
reply. Telemetry and heartbeats are in ``schemas/telemetry.py`` and ``schemas/heartbeat.py``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from schemas import errors
from schemas.codec import SCHEMA_VERSION, CodecError, pack, unpack
from schemas.errors import ServingError
from schemas.fields import FieldReader, is_int

# what an exit config may name (services.exits.scores computes the score kinds)
# generation: an LLM's exit heads, a token leaves at a head whose top probability reaches
# the head's threshold (the tuner's per-layer thresholds, keyed by head layer)
GENERATION = "generation"
EXIT_MODES = ("latency", "compute", GENERATION)
MAX_ID_BYTES = 256  # a request id (UTF-8): every batch and record carries it
SCORE_KINDS = ("max_softmax", "entropy", "margin")


def _bad(message: str) -> ServingError:
    return ServingError(errors.BAD_REQUEST, message)


def decode_map(data: bytes) -> dict[str, Any]:
    """Unpack a message and check it is a map of the supported schema version."""
    try:
        msg = unpack(data)
    except CodecError as exc:
        raise _bad(str(exc)) from None
    if not isinstance(msg, dict):
        raise _bad(f"message must be a msgpack map, got {type(msg).__name__}")
    version = msg.get("v")
    if version != SCHEMA_VERSION:
        raise _bad(f"unsupported schema version {version!r}; this server speaks v={SCHEMA_VERSION}")
    return msg


def request_id_of(data: bytes) -> str | None:
    """Best-effort request id of a message that failed validation (for the error reply)."""
    try:
        msg = unpack(data)
    except CodecError:
        return None
    rid = msg.get("id") if isinstance(msg, dict) else None
    return rid if isinstance(rid, str) else None


# ---------------------------------------------------------------- client contract


@dataclass(slots=True)
class InferRequest:
    id: str
    model: str
    inputs: dict[str, np.ndarray]
    slo_ms: float | None

    def encode(self) -> bytes:
        msg: dict[str, Any] = {"v": SCHEMA_VERSION, "id": self.id, "model": self.model,
                               "inputs": self.inputs}
        if self.slo_ms is not None:
            msg["slo_ms"] = float(self.slo_ms)
        return pack(msg)


def decode_infer_request(msg: dict[str, Any], subject_model: str) -> InferRequest:
    """Validate the envelope of a request (tensor shapes are checked against the model later)."""
    rid = msg.get("id")
    if not isinstance(rid, str) or not rid:
        raise _bad("field 'id' must be a non-empty string")
    if len(rid.encode()) > MAX_ID_BYTES:
        raise _bad(f"field 'id' is {len(rid.encode())} bytes; at most {MAX_ID_BYTES}")
    model = msg.get("model")
    if model is None:  # absent or nil: the subject's model
        model = subject_model
    if model != subject_model:
        raise ServingError(errors.BAD_REQUEST,
                           f"field 'model' is {model!r} but the request was sent to {subject_model!r}")
    inputs = msg.get("inputs")
    if not isinstance(inputs, dict) or not inputs:
        raise _bad("field 'inputs' must be a non-empty map of name -> tensor")
    for name, value in inputs.items():
        if not isinstance(value, np.ndarray):
            raise _bad(f"input {name!r} must be a tensor (msgpack ext type 1), got {type(value).__name__}")
    slo = msg.get("slo_ms")
    if slo is not None:
        if isinstance(slo, bool) or not isinstance(slo, (int, float)) or not math.isfinite(slo) or slo <= 0:
            raise _bad(f"field 'slo_ms' must be a positive number, got {slo!r}")
        slo = float(slo)
    return InferRequest(id=rid, model=model, inputs=inputs, slo_ms=slo)


def encode_reply(rid: str, model: str, outputs: dict[str, np.ndarray], label: int, score: float,
                 exit_index: int, early: bool, latency_ms: float, config_version: int,
                 variant: str | None = None) -> bytes:
    msg = {"v": SCHEMA_VERSION, "id": rid, "model": model, "outputs": outputs,
           "label": int(label), "score": float(score), "exit": int(exit_index),
           "early": bool(early), "latency_ms": float(latency_ms),
           "config_version": int(config_version)}
    if variant is not None:
        msg["variant"] = str(variant)
    return pack(msg)


def variant_of(msg: dict[str, Any], what: str) -> str | None:
    """A message's optional ``variant``: absent or nil is None, else a non-empty string."""
    v = msg.get("variant")
    if v is None:
        return None
    if not isinstance(v, str) or not v or len(v) > 200:
        raise _bad(f"{what}: field 'variant' must be a non-empty string of at most 200 "
                   f"characters, got {v!r:.80}")
    return v


def encode_error(rid: str | None, code: str, message: str, **extra: Any) -> bytes:
    err: dict[str, Any] = {"code": code, "message": message}
    err.update(extra)
    return pack({"v": SCHEMA_VERSION, "id": rid, "error": err})


@dataclass(slots=True)
class Batch:
    """A batch entering a stage: router -> first stage, or stage k -> stage k+1.

    ``ramp_pred``/``ramp_score`` accumulate the records of ramps already evaluated
    (rows in ``ramp_ids`` order) so the last stage can emit complete telemetry;
    ``exit_at`` holds, per sample, the ramp whose early result was already sent (-1: none).
    """

    batch_id: str
    model: str
    stage: int
    router: str
    ids: list[str]
    config_version: int
    inputs: dict[str, np.ndarray]
    ramp_ids: list[int] = field(default_factory=list)
    ramp_pred: np.ndarray | None = None
    ramp_score: np.ndarray | None = None
    exit_at: np.ndarray | None = None
    stage_ms: list[float] = field(default_factory=list)
    carry: dict[str, np.ndarray] = field(default_factory=dict)  # model inputs later blocks read
    replies: list[str] = field(default_factory=list)  # client reply subject per id ([] = via router)
    ages_ms: list[float] = field(default_factory=list)  # per id: ms since the router admitted it
    slos_ms: list[float] = field(default_factory=list)  # per id: its SLO; an answer later is not sent
    # compute mode: every row was answered already and runs on only as feedback (shadow
    # work, served after real work)
    shadow: bool = False
    variant: str | None = None  # the subnet or depth cap the router chose (None: the model)

    def encode(self) -> bytes:
        return pack({"v": SCHEMA_VERSION, "batch_id": self.batch_id, "model": self.model,
                     "stage": self.stage, "router": self.router, "ids": self.ids,
                     "config_version": self.config_version, "inputs": self.inputs,
                     "ramp_ids": self.ramp_ids, "ramp_pred": self.ramp_pred,
                     "ramp_score": self.ramp_score, "exit_at": self.exit_at,
                     "stage_ms": self.stage_ms, "carry": self.carry, "replies": self.replies,
                     "ages_ms": self.ages_ms, "slos_ms": self.slos_ms, "shadow": self.shadow,
                     "variant": self.variant})

    @classmethod
    def decode(cls, msg: dict[str, Any]) -> Batch:
        try:
            return cls(batch_id=msg["batch_id"], model=msg["model"], stage=int(msg["stage"]),
                       router=msg["router"], ids=list(msg["ids"]),
                       config_version=int(msg["config_version"]), inputs=dict(msg["inputs"]),
                       ramp_ids=list(msg.get("ramp_ids") or []), ramp_pred=msg.get("ramp_pred"),
                       ramp_score=msg.get("ramp_score"), exit_at=msg.get("exit_at"),
                       stage_ms=list(msg.get("stage_ms") or []),
                       carry=dict(msg.get("carry") or {}),
                       replies=list(msg.get("replies") or []),
                       ages_ms=[float(a) for a in msg.get("ages_ms") or []],
                       slos_ms=[float(a) for a in msg.get("slos_ms") or []],
                       shadow=bool(msg.get("shadow")), variant=variant_of(msg, "batch"))
        except (KeyError, TypeError, ValueError) as exc:
            raise _bad(f"malformed batch: {exc!r}") from None


@dataclass(slots=True)
class Results:
    """Answers for some samples of a batch (early exits or finals), worker -> router.

    ``release`` tells the router the first-stage worker finished the batch and its
    credit is free; ``error`` reports a batch that failed as a whole.
    """

    batch_id: str
    worker: str
    stage: int
    ids: list[str]
    labels: np.ndarray
    scores: np.ndarray
    exits: np.ndarray
    logits: np.ndarray | None
    early: bool
    config_version: int
    release: bool = False
    error: dict[str, str] | None = None
    direct: bool = False  # the worker already replied to these clients: record, don't reply
    variant: str | None = None  # the batch's variant, as the worker ran it

    def encode(self) -> bytes:
        return pack({"v": SCHEMA_VERSION, "batch_id": self.batch_id, "worker": self.worker,
                     "stage": self.stage, "ids": self.ids, "labels": self.labels,
                     "scores": self.scores, "exits": self.exits, "logits": self.logits,
                     "early": self.early, "config_version": self.config_version,
                     "release": self.release, "error": self.error, "direct": self.direct,
                     "variant": self.variant})

    @classmethod
    def decode(cls, msg: dict[str, Any]) -> Results:
        try:
            return cls(batch_id=msg["batch_id"], worker=msg["worker"], stage=int(msg["stage"]),
                       ids=list(msg["ids"]), labels=msg["labels"], scores=msg["scores"],
                       exits=msg["exits"], logits=msg.get("logits"), early=bool(msg["early"]),
                       config_version=int(msg["config_version"]),
                       release=bool(msg.get("release")), error=msg.get("error"),
                       direct=bool(msg.get("direct")), variant=variant_of(msg, "results"))
        except (KeyError, TypeError, ValueError) as exc:
            raise _bad(f"malformed results: {exc!r}") from None


def plain_head_file(name: Any) -> str:
    """A ramp head's file name as an exit config may name it: a plain ``.onnx`` file name
    (the file lives next to the model's other files; no path may point elsewhere)."""
    if (not isinstance(name, str) or not name.endswith(".onnx") or "/" in name
            or "\\" in name or name.startswith(".")):
        raise ValueError(f"a head must be a plain .onnx file name, got {name!r}")
    return name


@dataclass(slots=True)
class ExitConfig:
    """Thresholds (ramp index -> threshold on the exit score) and active ramps.

    A sample exits at the earliest active ramp whose score is strictly below its
    threshold; a threshold of 0 therefore never exits.
    """

    model: str
    version: int
    mode: str = "latency"
    thresholds: dict[int, float] = field(default_factory=dict)
    active: list[int] = field(default_factory=list)
    score: str = "max_softmax"
    # ramp index -> the head file it serves (a refitted version); absent: the prepared head
    heads: dict[int, str] = field(default_factory=dict)

    def encode(self) -> bytes:
        return pack({"v": SCHEMA_VERSION, "model": self.model, "version": self.version,
                     "mode": self.mode, "thresholds": {int(k): float(v) for k, v in self.thresholds.items()},
                     "active": [int(r) for r in self.active], "score": self.score,
                     "heads": {int(k): str(v) for k, v in self.heads.items()}})

    @classmethod
    def decode(cls, msg: dict[str, Any]) -> ExitConfig:
        """A checked config (:meth:`check`): a malformed one raises ``bad_request``."""
        f = FieldReader(msg, "exit config")
        heads = msg.get("heads") or {}
        if not isinstance(heads, dict) or not all(is_int(k) for k in heads):
            raise f.error(f"field 'heads' must be a map of ramp indices to file names, "
                          f"got {heads!r:.80}")
        try:
            config = cls(model=f.text("model"), version=f.integer("version"),
                         mode=f.text("mode", "latency"),
                         thresholds=(f.int_key_numbers("thresholds")
                                     if msg.get("thresholds") is not None else {}),
                         active=f.integers("active") if msg.get("active") is not None else [],
                         score=f.text("score", "max_softmax"),
                         heads={int(k): plain_head_file(v) for k, v in heads.items()})
            config.check()
        except ValueError as exc:
            raise f.error(str(exc)) from None
        return config

    def check(self) -> None:
        """ValueError unless a worker can serve this config: a known mode and score kind, a
        version >= 0, thresholds finite in [0, 1] (scores lie in [0, 1]), each active ramp
        once and with a threshold, ramp indices >= 0."""
        if not self.model:
            raise ValueError("the model name is empty")
        if self.version < 0:
            raise ValueError(f"version must be >= 0, got {self.version}")
        if self.mode not in EXIT_MODES:
            raise ValueError(f"unknown mode {self.mode!r}; known: {', '.join(EXIT_MODES)}")
        if self.score not in SCORE_KINDS:
            raise ValueError(f"unknown score kind {self.score!r}; known: "
                             f"{', '.join(SCORE_KINDS)}")
        for ramp, t in self.thresholds.items():
            if ramp < 0 or not (math.isfinite(t) and 0.0 <= t <= 1.0):
                raise ValueError(f"threshold of ramp {ramp} must be in [0, 1], got {t!r}")
        if len(set(self.active)) != len(self.active) or any(r < 0 for r in self.active):
            raise ValueError(f"active ramps must be distinct indices >= 0, got {self.active}")
        missing = [r for r in self.active if r not in self.thresholds]
        if missing:
            raise ValueError(f"active ramps {missing} have no threshold")
        if any(r < 0 for r in self.heads):
            raise ValueError(f"ramp indices must be >= 0, got heads for {sorted(self.heads)}")

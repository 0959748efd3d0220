"""Telemetry messages (``schemas/README.md``, "Sample telemetry" and "Request telemetry").

Sample telemetry goes from last-stage workers to the monitor and the tuner, ramp features
from last-stage workers to the tuner, request
telemetry from routers to the monitor; both are stored in the telemetry stream. Each
class has the one encoder and the one decoder of its message.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from schemas.codec import SCHEMA_VERSION, pack
from schemas.fields import FLOATS, INTS, FieldReader

FINAL_LOGITS_MAX_CLASSES = 100  # ramp features carry the final logits up to this many classes
OK = "ok"  # request-record status of a request that got an answer (else its error code)


@dataclass(frozen=True, slots=True, eq=False)
class SampleTelemetry:
    """Per sample, what every evaluated ramp and the final layer predicted, for the batches
    one last-stage worker ran under one exit config (``N`` samples, ``R`` ramps).

    A worker builds one per batch; consecutive ones under the same config are merged
    (``services/worker/telemetry.py``), so ``batch_ids``/``batch_sizes``/``stage_ms``
    list the merged batches.
    """

    model: str
    worker: str
    batch_id: str                    # the last batch merged
    batch_ids: list[str]
    batch_sizes: list[int]
    config_version: int
    mode: str
    score: str
    thresholds: dict[int, float]
    active: list[int]
    ids: list[str]                   # N request ids
    ramp_ids: list[int]              # R ramps, the rows of ramp_pred / ramp_score
    ramp_pred: np.ndarray            # int32 R x N, top-1 label
    ramp_score: np.ndarray           # float32 R x N, exit score
    exit_at: np.ndarray              # int32 N, ramp that answered, -1 = final layer
    final_pred: np.ndarray           # int32 N
    final_score: np.ndarray          # float32 N
    batch_size: int                  # N
    stage_ms: list[list[float]]      # per merged batch, compute ms of each stage
    t: float                         # unix seconds

    def encode(self) -> bytes:
        return pack({"v": SCHEMA_VERSION, "model": self.model, "worker": self.worker,
                     "batch_id": self.batch_id, "batch_ids": list(self.batch_ids),
                     "batch_sizes": [int(s) for s in self.batch_sizes],
                     "config_version": int(self.config_version), "mode": self.mode,
                     "score": self.score,
                     "thresholds": {int(k): float(v) for k, v in self.thresholds.items()},
                     "active": [int(r) for r in self.active], "ids": list(self.ids),
                     "ramp_ids": [int(r) for r in self.ramp_ids], "ramp_pred": self.ramp_pred,
                     "ramp_score": self.ramp_score, "exit_at": self.exit_at,
                     "final_pred": self.final_pred, "final_score": self.final_score,
                     "batch_size": int(self.batch_size),
                     "stage_ms": [[float(ms) for ms in run] for run in self.stage_ms],
                     "t": float(self.t)})

    @classmethod
    def decode(cls, msg: dict[str, Any]) -> SampleTelemetry:
        f = FieldReader(msg, "sample telemetry")
        ids, ramp_ids = f.texts("ids"), f.integers("ramp_ids")
        n, r = len(ids), len(ramp_ids)
        batch_ids, batch_sizes = f.texts("batch_ids"), f.integers("batch_sizes")
        stage_ms, batch_size = f.number_rows("stage_ms"), f.integer("batch_size")
        if batch_size != n or sum(batch_sizes) != n:
            raise f.error(f"{n} ids but batch_size {batch_size} and batch_sizes {batch_sizes}")
        if not len(batch_ids) == len(batch_sizes) == len(stage_ms):
            raise f.error(f"batch_ids, batch_sizes and stage_ms must list the same batches, got "
                          f"{len(batch_ids)}, {len(batch_sizes)} and {len(stage_ms)}")
        return cls(model=f.text("model"), worker=f.text("worker"), batch_id=f.text("batch_id"),
                   batch_ids=batch_ids, batch_sizes=batch_sizes,
                   config_version=f.integer("config_version"), mode=f.text("mode"),
                   score=f.text("score"), thresholds=f.int_key_numbers("thresholds"),
                   active=f.integers("active"), ids=ids, ramp_ids=ramp_ids,
                   ramp_pred=f.tensor("ramp_pred", INTS, (r, n)),
                   ramp_score=f.tensor("ramp_score", FLOATS, (r, n)),
                   exit_at=f.tensor("exit_at", INTS, (n,)),
                   final_pred=f.tensor("final_pred", INTS, (n,)),
                   final_score=f.tensor("final_score", FLOATS, (n,)),
                   batch_size=batch_size, stage_ms=stage_ms, t=f.number("t"))


@dataclass(frozen=True, slots=True, eq=False)
class RampFeatures:
    """For ``N`` sampled samples of one batch, what each ramp's linear layer reads at every
    ramp site (active or not) and the final model's answer: the training data of online
    ramp refits (``services/tuner/refit.py``)."""

    model: str
    worker: str
    config_version: int
    ids: list[str]                   # N request ids
    ramp_ids: list[int]              # R ramp sites, in order
    features: list[np.ndarray]       # per site, float32 N x C_r (pooled site activation)
    final_pred: np.ndarray           # int32 N, the final model's top-1
    final_logits: np.ndarray | None  # float32 N x K (soft targets), or None
    t: float                         # unix seconds

    def encode(self) -> bytes:
        return pack({"v": SCHEMA_VERSION, "model": self.model, "worker": self.worker,
                     "config_version": int(self.config_version), "ids": list(self.ids),
                     "ramp_ids": [int(r) for r in self.ramp_ids],
                     "features": [np.ascontiguousarray(x, np.float32) for x in self.features],
                     "final_pred": self.final_pred, "final_logits": self.final_logits,
                     "t": float(self.t)})

    @classmethod
    def decode(cls, msg: dict[str, Any]) -> RampFeatures:
        f = FieldReader(msg, "ramp features")
        ids, ramp_ids = f.texts("ids"), f.integers("ramp_ids")
        n = len(ids)
        features = f.tensors("features", FLOATS)
        if len(features) != len(ramp_ids):
            raise f.error(f"{len(ramp_ids)} ramp_ids but {len(features)} feature tensors")
        for r, x in zip(ramp_ids, features, strict=True):
            if x.ndim != 2 or x.shape[0] != n or x.shape[1] < 1:
                raise f.error(f"features of ramp {r} must be [{n}, C], got {list(x.shape)}")
        logits = None
        if msg.get("final_logits") is not None:
            logits = f.tensor("final_logits", FLOATS, (n, f.value_shape("final_logits", 1)))
        return cls(model=f.text("model"), worker=f.text("worker"),
                   config_version=f.integer("config_version"), ids=ids, ramp_ids=ramp_ids,
                   features=[x.astype(np.float32, copy=False) for x in features],
                   final_pred=f.tensor("final_pred", INTS, (n,)), final_logits=logits,
                   t=f.number("t"))


@dataclass(slots=True)  # not frozen: the router builds one per request, and frozen costs 4x
class RequestRecord:
    """One request a router answered or refused. ``exit``, ``early``, ``label`` and
    ``config_version`` are None for errors."""

    id: str | None
    t: float                 # unix time the request was received (or refused at intake)
    latency_ms: float
    status: str              # OK or the error code
    exit: int | None = None
    early: bool | None = None
    label: int | None = None
    config_version: int | None = None
    variant: str | None = None  # the subnet or depth cap that answered (None: the model)


@dataclass(frozen=True, slots=True)
class RequestTelemetry:
    """The requests one router answered (or refused) for one model since its last flush."""

    model: str
    router: str              # router id, not a subject
    records: list[RequestRecord] = field(default_factory=list)

    def encode(self) -> bytes:
        return pack({"v": SCHEMA_VERSION, "model": self.model, "router": self.router,
                     "records": [{"id": r.id, "t": float(r.t), "latency_ms": float(r.latency_ms),
                                  "status": r.status,
                                  "exit": None if r.exit is None else int(r.exit),
                                  "early": None if r.early is None else bool(r.early),
                                  "label": None if r.label is None else int(r.label),
                                  "config_version": (None if r.config_version is None
                                                     else int(r.config_version)),
                                  **({} if r.variant is None else {"variant": str(r.variant)})}
                                 for r in self.records]})

    @classmethod
    def decode(cls, msg: dict[str, Any]) -> RequestTelemetry:
        f = FieldReader(msg, "request telemetry")
        records = [_exact_record(rec) or _checked_record(rec, i)
                   for i, rec in enumerate(f.maps("records"))]
        return cls(model=f.text("model"), router=f.text("router"), records=records)


def _optional(value: Any, kind: type) -> bool:
    return value is None or type(value) is kind


def _exact_record(rec: dict) -> RequestRecord | None:
    """The record as :meth:`RequestTelemetry.encode` writes it (exact types), else None.
    A monitor decodes one per request served: this path skips the per-field checks."""
    t, latency, status = rec.get("t"), rec.get("latency_ms"), rec.get("status")
    rid, exit_, early = rec.get("id"), rec.get("exit"), rec.get("early")
    label, version, variant = rec.get("label"), rec.get("config_version"), rec.get("variant")
    if (type(t) is float and type(latency) is float and type(status) is str
            and _optional(rid, str) and _optional(exit_, int) and _optional(early, bool)
            and _optional(label, int) and _optional(version, int)
            and _optional(variant, str)):
        return RequestRecord(rid, t, latency, status, exit_, early, label, version, variant)
    return None


def _checked_record(rec: dict, i: int) -> RequestRecord:
    """Any other record, field by field: a clear error names what is wrong."""
    r = FieldReader(rec, f"request telemetry record {i}")
    return RequestRecord(
        id=r.text("id", None), t=r.number("t"), latency_ms=r.number("latency_ms"),
        status=r.text("status"), exit=r.integer("exit", None), early=r.flag("early", None),
        label=r.integer("label", None), config_version=r.integer("config_version", None),
        variant=r.text("variant", None))

"""ORM models of the store. The schema itself is owned by the Alembic revisions in
`migrations/versions`; a test checks that these models and the migrated schema agree.

Timestamps are naive UTC so plain SQL works on both back ends, e.g.
`WHERE window_end > datetime('now', '-1 hour')` (SQLite) or
`WHERE window_end > now() AT TIME ZONE 'UTC' - interval '1 hour'` (PostgreSQL).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    UniqueConstraint,
    false,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

# Explicit constraint names: identical on both back ends, and required by SQLite
# batch migrations to find constraints again.
NAMING = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

Json = JSON().with_variant(JSONB(), "postgresql")  # JSONB: indexable, comparable
# SQLite only auto-increments an INTEGER PRIMARY KEY (the rowid alias).
BigId = BigInteger().with_variant(Integer(), "sqlite")
Name = String(200)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)


class Model(Base):
    __tablename__ = "models"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(Name, unique=True)
    version: Mapped[str] = mapped_column(String(64))
    kind: Mapped[str] = mapped_column(String(32))
    manifest: Mapped[dict[str, Any]] = mapped_column(Json)
    path: Mapped[str] = mapped_column(Text)
    classes: Mapped[Any] = mapped_column(Json, nullable=True)  # count or label list
    created_at: Mapped[datetime] = mapped_column(DateTime)
    updated_at: Mapped[datetime] = mapped_column(DateTime)


class Artifact(Base):
    __tablename__ = "artifacts"
    __table_args__ = (UniqueConstraint("model_id", "kind", "idx"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    model_id: Mapped[int] = mapped_column(ForeignKey("models.id", ondelete="CASCADE"))
    kind: Mapped[str] = mapped_column(String(16))  # 'block' | 'ramp'
    idx: Mapped[int] = mapped_column(Integer)
    file: Mapped[str] = mapped_column(Text)
    sha256: Mapped[str | None] = mapped_column(String(64), nullable=True)
    bytes: Mapped[int | None] = mapped_column(BigInteger, nullable=True)


class Ramp(Base):
    __tablename__ = "ramps"
    __table_args__ = (UniqueConstraint("model_id", "idx"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    model_id: Mapped[int] = mapped_column(ForeignKey("models.id", ondelete="CASCADE"))
    idx: Mapped[int] = mapped_column(Integer)
    site: Mapped[int] = mapped_column(Integer)  # the block the ramp follows
    arch: Mapped[str | None] = mapped_column(String(64), nullable=True)
    params: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    agreement: Mapped[float | None] = mapped_column(Float, nullable=True)
    cost_ms: Mapped[float | None] = mapped_column(Float, nullable=True)
    tensor: Mapped[str | None] = mapped_column(Text, nullable=True)  # the graph tensor it reads
    # batch size (JSON keys are strings) -> ms, as measured when the model was prepared
    cost_by_batch: Mapped[dict[str, float] | None] = mapped_column(Json, nullable=True)


class ExitConfig(Base):
    __tablename__ = "exit_configs"
    __table_args__ = (
        UniqueConstraint("model", "version"),  # makes concurrent version bumps safe
        Index(None, "model", "created_at"),
    )
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    model: Mapped[str] = mapped_column(Name)
    version: Mapped[int] = mapped_column(Integer)
    thresholds: Mapped[dict[str, float]] = mapped_column(Json)  # JSON keys are strings
    active: Mapped[list[int]] = mapped_column(Json)
    mode: Mapped[str] = mapped_column(String(16))
    reason: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(DateTime)
    # ramp index (JSON keys are strings) -> head file it serves; NULL: all prepared heads
    heads: Mapped[dict[str, str] | None] = mapped_column(Json, nullable=True)


class ExitProfile(Base):
    __tablename__ = "exit_profiles"
    __table_args__ = (Index(None, "model", "window_end"),)
    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    model: Mapped[str] = mapped_column(Name)
    config_version: Mapped[int | None] = mapped_column(Integer, nullable=True)
    window_start: Mapped[datetime] = mapped_column(DateTime)
    window_end: Mapped[datetime] = mapped_column(DateTime)
    ramp: Mapped[int] = mapped_column(Integer)  # -1: the whole deployed config
    samples: Mapped[int] = mapped_column(Integer)
    exit_rate: Mapped[float] = mapped_column(Float)
    agreement: Mapped[float | None] = mapped_column(Float, nullable=True)
    # agreement when every sample answers here at the latest (a depth cap at this ramp)
    cap_agreement: Mapped[float | None] = mapped_column(Float, nullable=True)


class Request(Base):
    __tablename__ = "requests"
    __table_args__ = (
        Index(None, "model", "received_at"),
        # one row per request (ids without one are ""): see migration 0005
        Index("uq_requests_model_request_id", "model", "request_id", unique=True,
              sqlite_where=text("request_id <> ''"), postgresql_where=text("request_id <> ''")),
    )
    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    request_id: Mapped[str] = mapped_column(String(64))
    model: Mapped[str] = mapped_column(Name)
    received_at: Mapped[datetime] = mapped_column(DateTime)
    latency_ms: Mapped[float | None] = mapped_column(Float, nullable=True)
    status: Mapped[str] = mapped_column(String(32))  # 'ok' or an error code
    exit: Mapped[int | None] = mapped_column(Integer, nullable=True)
    early: Mapped[bool | None] = mapped_column(Boolean, nullable=True)
    label: Mapped[int | None] = mapped_column(Integer, nullable=True)
    config_version: Mapped[int | None] = mapped_column(Integer, nullable=True)
    variant: Mapped[str | None] = mapped_column(String(200), nullable=True)  # subnet, depth cap


class Worker(Base):
    __tablename__ = "workers"
    worker_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    model: Mapped[str] = mapped_column(Name)
    stage: Mapped[int] = mapped_column(Integer)
    first_block: Mapped[int] = mapped_column(Integer)
    last_block: Mapped[int] = mapped_column(Integer)
    host: Mapped[str] = mapped_column(String(255))
    pid: Mapped[int] = mapped_column(Integer)
    status: Mapped[str] = mapped_column(String(32))
    started_at: Mapped[datetime] = mapped_column(DateTime)
    last_seen: Mapped[datetime] = mapped_column(DateTime)
    device: Mapped[str | None] = mapped_column(String(128), nullable=True)  # device class
    # set while its batches run slower than its class's profile: plans leave it out
    straggler_since: Mapped[datetime | None] = mapped_column(DateTime, nullable=True)


class IngestedBatch(Base):
    """Telemetry batches already stored, so a redelivered batch is not counted twice."""

    __tablename__ = "ingested_batches"
    key: Mapped[str] = mapped_column(String(255), primary_key=True)
    at: Mapped[datetime] = mapped_column(DateTime)


class LatencyProfile(Base):
    """Median latency of one block, ramp or the whole model (idx -1) per batch size, as
    measured by the profiler on one device class: what the optimizer plans with."""

    __tablename__ = "latency_profiles"
    __table_args__ = (
        UniqueConstraint("model", "device", "kind", "idx", "batch_size"),
        Index(None, "model", "device"),
    )
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    model: Mapped[str] = mapped_column(Name)
    device: Mapped[str] = mapped_column(String(128))  # device class: "cpu-2c", a GPU name
    kind: Mapped[str] = mapped_column(String(16))  # 'block' | 'ramp' | 'full'
    idx: Mapped[int] = mapped_column(Integer)  # block or ramp index; -1 for 'full'
    batch_size: Mapped[int] = mapped_column(Integer)
    ms: Mapped[float] = mapped_column(Float)  # median over `runs`
    runs: Mapped[int] = mapped_column(Integer)
    measured_at: Mapped[datetime] = mapped_column(DateTime)


class RampUtility(Base):
    """One ramp's utility in one ramp-adjustment round, and what the round did."""

    __tablename__ = "ramp_utilities"
    __table_args__ = (Index(None, "model", "at"),)
    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    model: Mapped[str] = mapped_column(Name)
    round: Mapped[int] = mapped_column(Integer)  # adjustment round number
    config_version: Mapped[int | None] = mapped_column(Integer, nullable=True)
    ramp: Mapped[int] = mapped_column(Integer)
    exits: Mapped[int] = mapped_column(Integer)
    saved_ms: Mapped[float] = mapped_column(Float)
    added_ms: Mapped[float] = mapped_column(Float)
    utility_ms: Mapped[float] = mapped_column(Float)  # saved - added
    action: Mapped[str] = mapped_column(String(32))  # 'retune', 'add_earlier', 'keep', ...
    at: Mapped[datetime] = mapped_column(DateTime)


class TunerState(Base):
    """The tuner controller's serialised state per model, so a restarted tuner resumes."""

    __tablename__ = "tuner_state"
    model: Mapped[str] = mapped_column(Name, primary_key=True)
    state: Mapped[dict[str, Any]] = mapped_column(Json)
    config_version: Mapped[int] = mapped_column(Integer)
    updated_at: Mapped[datetime] = mapped_column(DateTime)


class RampHead(Base):
    """A refitted head of one ramp: its file (content-hashed ONNX next to the model's), what
    it was trained and judged on, and how it compared with the head it replaced."""

    __tablename__ = "ramp_heads"
    __table_args__ = (UniqueConstraint("model", "ramp", "version"),
                      Index(None, "model", "created_at"))
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    model: Mapped[str] = mapped_column(Name)
    ramp: Mapped[int] = mapped_column(Integer)
    version: Mapped[int] = mapped_column(Integer)  # 1, 2, ...; 0 is the prepared head
    file: Mapped[str] = mapped_column(Text)
    sha256: Mapped[str] = mapped_column(String(64))
    trained_on: Mapped[int] = mapped_column(Integer)  # samples fitted on
    judged_on: Mapped[int] = mapped_column(Integer)  # newest samples held back to judge it
    serving_agreement: Mapped[float] = mapped_column(Float)  # the replaced head's, there
    agreement: Mapped[float] = mapped_column(Float)
    serving_calibration: Mapped[float] = mapped_column(Float)  # expected calibration error
    calibration: Mapped[float] = mapped_column(Float)
    created_at: Mapped[datetime] = mapped_column(DateTime)
    # the preparation (its manifest version) the head was fitted to; NULL: not recorded
    prepared: Mapped[str | None] = mapped_column(String(64), nullable=True)


class BatchProfile(Base):
    """How much of a batch survives one ramp in one profile window (E3 §3.1): observed once
    the window is over, forecast (ARIMA, and the naive last value) before it began."""

    __tablename__ = "batch_profiles"
    __table_args__ = (UniqueConstraint("model", "window_start", "ramp"),
                      Index(None, "model", "window_end"))
    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    model: Mapped[str] = mapped_column(Name)
    window_start: Mapped[datetime] = mapped_column(DateTime)
    window_end: Mapped[datetime] = mapped_column(DateTime)
    ramp: Mapped[int] = mapped_column(Integer)
    config_version: Mapped[int | None] = mapped_column(Integer, nullable=True)
    samples: Mapped[int | None] = mapped_column(Integer, nullable=True)  # NULL: not observed yet
    observed: Mapped[float | None] = mapped_column(Float, nullable=True)
    forecast: Mapped[float | None] = mapped_column(Float, nullable=True)  # ARIMA: what plans use
    forecast_naive: Mapped[float | None] = mapped_column(Float, nullable=True)
    error: Mapped[float | None] = mapped_column(Float, nullable=True)  # |forecast - observed|
    drifted: Mapped[bool | None] = mapped_column(Boolean, nullable=True)  # window asked a re-plan


class DeploymentPlanRecord(Base):
    """A versioned deployment plan (E3 §3.2) of one model: the plan as broadcast, the
    inputs it was computed from, and why it was made."""

    __tablename__ = "deployment_plans"
    __table_args__ = (UniqueConstraint("model", "version"), Index(None, "model", "created_at"))
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    model: Mapped[str] = mapped_column(Name)
    version: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(DateTime)
    reason: Mapped[str] = mapped_column(Text)  # 'timer', 'drift: ...', 'inventory: ...', ...
    feasible: Mapped[bool] = mapped_column(Boolean)
    goodput_rps: Mapped[float] = mapped_column(Float)  # expected
    latency_ms: Mapped[float] = mapped_column(Float)   # expected worst case
    cost: Mapped[float] = mapped_column(Float)         # device-seconds per 1,000 answers
    plan: Mapped[dict[str, Any]] = mapped_column(Json)    # the broadcast plan message
    inputs: Mapped[dict[str, Any]] = mapped_column(Json)  # forecast, rate, SLO, inventory


class SubnetProfile(Base):
    """One variant a model can serve per batch (SuperServe §4.2): a supernet's subnet or an
    early-exit model's depth cap, with its accuracy and its latency per batch size on one
    device class. The router's variant policies decide over the ``pareto`` rows."""

    __tablename__ = "subnet_profiles"
    __table_args__ = (UniqueConstraint("model", "device", "variant"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    model: Mapped[str] = mapped_column(Name)
    device: Mapped[str] = mapped_column(String(128))
    variant: Mapped[str] = mapped_column(String(200))
    created_at: Mapped[datetime] = mapped_column(DateTime)
    accuracy: Mapped[float] = mapped_column(Float)  # agreement with the full model
    labelled_accuracy: Mapped[float | None] = mapped_column(Float, nullable=True)
    latency_ms: Mapped[dict[str, Any]] = mapped_column(Json)  # {"batch": ms}; {} off-frontier
    pareto: Mapped[bool] = mapped_column(Boolean)
    source: Mapped[str] = mapped_column(String(64))  # "search" (supernet), "depth-cap"


class RepositoryCandidate(Base):
    """One early-exit LLM of HELIOS's model repository with its offline profile (§3.3.1):
    what top-k candidate selection filters by memory and SLO and ranks."""

    __tablename__ = "model_repository"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(Name, unique=True)
    family: Mapped[str] = mapped_column(Name)  # tokenizer: perplexities compare within one
    n_layers: Mapped[int] = mapped_column(Integer)
    exit_layers: Mapped[list[int]] = mapped_column(Json)  # 1-based depths, the last n_layers
    layer_bytes: Mapped[int] = mapped_column(BigInteger)  # weights per transformer layer
    fixed_bytes: Mapped[int] = mapped_column(BigInteger)  # embedding, heads: any depth
    kv_bytes_per_token_layer: Mapped[int] = mapped_column(BigInteger)
    tokens_per_s: Mapped[float] = mapped_column(Float)  # offline, full depth
    perplexity: Mapped[float] = mapped_column(Float)  # offline
    # exit layer (JSON keys are strings) -> fraction of tokens; NULL: not profiled offline
    exit_distribution: Mapped[dict[str, float] | None] = mapped_column(Json, nullable=True)
    benchmarks: Mapped[dict[str, Any] | None] = mapped_column(Json, nullable=True)
    path: Mapped[str | None] = mapped_column(Text, nullable=True)  # where its weights are
    updated_at: Mapped[datetime] = mapped_column(DateTime)


class PhtEntry(Base):
    """HELIOS's Performance History Table: how one candidate did, loaded to one depth, on
    the text the served model ``model`` saw during one assessment."""

    __tablename__ = "pht"
    __table_args__ = (UniqueConstraint("model", "assessment", "candidate", "loaded_depth"),
                      Index(None, "model", "at"))
    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    model: Mapped[str] = mapped_column(Name)  # the served model clients address
    at: Mapped[datetime] = mapped_column(DateTime)
    assessment: Mapped[int] = mapped_column(Integer)  # re-assessment interval number
    candidate: Mapped[str] = mapped_column(Name)
    loaded_depth: Mapped[int] = mapped_column(Integer)
    tokens_per_s: Mapped[float] = mapped_column(Float)
    ttft_ms: Mapped[float] = mapped_column(Float)
    tpot_ms: Mapped[float] = mapped_column(Float)
    perplexity: Mapped[float] = mapped_column(Float)
    exit_distribution: Mapped[dict[str, float]] = mapped_column(Json)  # layer -> fraction
    memory_bytes: Mapped[int] = mapped_column(BigInteger)
    tokens: Mapped[int] = mapped_column(Integer)


class HeliosDecision(Base):
    """What served ``model`` from ``at`` on (until its next row) and why: an evaluation
    slice, the choice after an assessment, a load or a switch after a confidence breach."""

    __tablename__ = "helios_decisions"
    __table_args__ = (Index(None, "model", "at"),)
    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    model: Mapped[str] = mapped_column(Name)
    at: Mapped[datetime] = mapped_column(DateTime)
    kind: Mapped[str] = mapped_column(String(16))  # 'evaluate', 'load', 'unload', 'switch', 'stay'
    candidate: Mapped[str] = mapped_column(Name)
    depth: Mapped[int] = mapped_column(Integer)
    assessment: Mapped[int | None] = mapped_column(Integer, nullable=True)
    reason: Mapped[str] = mapped_column(Text)  # the numbers compared
    batch: Mapped[int | None] = mapped_column(Integer, nullable=True)  # max batch at depth
    load_bytes: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    load_ms: Mapped[float | None] = mapped_column(Float, nullable=True)
    cost_ms: Mapped[float | None] = mapped_column(Float, nullable=True)


class Generation(Base):
    """One generation stream an LLM worker ended with an answer: the candidate and loaded
    depth that served it, the assessment it counts toward, and how it went. The profiler's
    PHT rows are aggregates of these per (assessment, candidate, depth)."""

    __tablename__ = "generations"
    __table_args__ = (
        Index(None, "model", "received_at"),
        Index(None, "model", "assessment"),
        # one row per stream, like requests (migration 0005): a redelivery adds nothing
        Index("uq_generations_model_request_id", "model", "request_id", unique=True,
              sqlite_where=text("request_id <> ''"), postgresql_where=text("request_id <> ''")),
    )
    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    request_id: Mapped[str] = mapped_column(String(64))
    model: Mapped[str] = mapped_column(Name)  # the served model clients address
    worker: Mapped[str] = mapped_column(String(128))
    received_at: Mapped[datetime] = mapped_column(DateTime)  # by the router
    candidate: Mapped[str] = mapped_column(Name)
    depth: Mapped[int] = mapped_column(Integer)  # loaded depth that served it
    assessment: Mapped[int | None] = mapped_column(Integer, nullable=True)
    prompt_tokens: Mapped[int] = mapped_column(Integer)
    tokens: Mapped[int] = mapped_column(Integer)
    ttft_ms: Mapped[float] = mapped_column(Float)
    tpot_ms: Mapped[float] = mapped_column(Float)
    duration_ms: Mapped[float] = mapped_column(Float)  # accepted by the worker to last token
    logprob: Mapped[float] = mapped_column(Float)  # natural log, summed over the tokens
    exits: Mapped[dict[str, int]] = mapped_column(Json)  # exit layer (string key) -> tokens
    breaches: Mapped[int] = mapped_column(Integer)  # tokens that needed layers not loaded
    memory_bytes: Mapped[int] = mapped_column(BigInteger)  # weights + this stream's KV cache
    # token-level feedback: early tokens the full model checked, and agreed with
    checked: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    agreed: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    first_deviation: Mapped[int | None] = mapped_column(Integer, nullable=True)
    # the served model's log-probability of these tokens when another candidate answered
    judged_logprob: Mapped[float | None] = mapped_column(Float, nullable=True)
    # the served model is still scoring it: judged_logprob comes later; out of the PHT until
    judging: Mapped[bool] = mapped_column(Boolean, server_default=false())
    # in its own candidate's decoding calls (null: not measured): the PHT's tokens/s
    decode_ms: Mapped[float | None] = mapped_column(Float, nullable=True)

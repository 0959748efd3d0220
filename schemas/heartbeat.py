"""The worker heartbeat (``schemas/README.md``, "Heartbeat"): liveness, credit and state of
one stage worker, published every ``OFFRAMP_HEARTBEAT_MS``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from schemas.codec import SCHEMA_VERSION, pack
from schemas.fields import FieldReader

MISSED_HEARTBEATS = 3  # a worker silent for this many heartbeat periods is lost


def worker_timeout_s(heartbeat_ms: float) -> float:
    """How long a router waits for a worker's next heartbeat before taking it for lost."""
    return MISSED_HEARTBEATS * heartbeat_ms / 1000.0


def transit_margin_s(heartbeat_ms: float) -> float:
    """How long after dispatch a heartbeat must come to show a batch that never arrived:
    five periods, at least 2 s, well past the 3 missed periods that already make a silent
    worker lost, so a slow delivery to a busy worker is not taken for a loss."""
    return max(2.0, 5 * heartbeat_ms / 1000.0)


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """What a router needs to route to a worker (``worker`` .. ``capacity``, required on the
    wire) and what ``offramp status`` shows (the rest: absent reads as 0 / "" / false)."""

    worker: str
    model: str
    stage: int
    stages: int
    capacity: int           # batches it may hold at once
    first_block: int = 0
    last_block: int = 0     # exclusive
    pid: int = 0
    host: str = ""
    busy: bool = False
    queued: int = 0         # batches waiting in its queue
    batches: int = 0        # batches completed since start
    set_aside: int = 0      # batches waiting for their feedback re-run
    gave_way: int = 0       # runs stopped for a waiting batch since start
    late: int = 0           # answers past their SLO since start (sent as deadline_exceeded)
    config_version: int = 0
    t: float = 0.0          # unix seconds
    # stage-0 batches it holds (received, not yet released); None: it does not say. A
    # router settles a batch it sent that a later heartbeat does not list (lost in transit)
    held: tuple[str, ...] | None = None
    pool: str = ""          # the pool worker (process) serving this role; "" for a fixed one
    # batches it ran since its previous heartbeat: how many, their samples and compute ms in
    # all (the optimizer compares them with the device class's profile: stragglers)
    ran: int = 0
    ran_rows: int = 0
    ran_ms: float = 0.0
    # an LLM worker: ``capacity`` is the streams it may serve at once, ``held`` the request
    # ids of its open streams
    llm: bool = False

    def encode(self) -> bytes:
        return pack({"v": SCHEMA_VERSION, "worker": self.worker, "model": self.model,
                     "stage": int(self.stage), "stages": int(self.stages),
                     "first_block": int(self.first_block), "last_block": int(self.last_block),
                     "capacity": int(self.capacity), "pid": int(self.pid), "host": self.host,
                     "busy": bool(self.busy), "queued": int(self.queued),
                     "batches": int(self.batches), "set_aside": int(self.set_aside),
                     "gave_way": int(self.gave_way), "late": int(self.late),
                     "config_version": int(self.config_version),
                     "t": float(self.t),
                     **({} if self.held is None else {"held": list(self.held)}),
                     "pool": self.pool, "ran": int(self.ran), "ran_rows": int(self.ran_rows),
                     "ran_ms": float(self.ran_ms), "llm": bool(self.llm)})

    @classmethod
    def decode(cls, msg: dict[str, Any]) -> Heartbeat:
        f = FieldReader(msg, "heartbeat")
        return cls(worker=f.text("worker"), model=f.text("model"), stage=f.integer("stage"),
                   stages=f.integer("stages"), capacity=f.integer("capacity"),
                   first_block=f.integer("first_block", 0), last_block=f.integer("last_block", 0),
                   pid=f.integer("pid", 0), host=f.text("host", ""), busy=f.flag("busy", False),
                   queued=f.integer("queued", 0), batches=f.integer("batches", 0),
                   set_aside=f.integer("set_aside", 0), gave_way=f.integer("gave_way", 0),
                   late=f.integer("late", 0),
                   config_version=f.integer("config_version", 0), t=f.number("t", 0.0),
                   held=None if msg.get("held") is None else tuple(f.texts("held")),
                   pool=f.text("pool", ""), ran=f.integer("ran", 0),
                   ran_rows=f.integer("ran_rows", 0), ran_ms=f.number("ran_ms", 0.0),
                   llm=f.flag("llm", False))

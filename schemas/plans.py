"""The deployment plan (``schemas/README.md``, "Deployment plan"): how the optimizer splits
one model into stages, how many pool workers of which device class run each stage, and
which pool workers take which stage. Broadcast on ``offramp.plan.<model>``; every version
is also a row of the store's ``deployment_plans``.

A plan is checked whole when decoded: stages tile the model's blocks from 0 in order, a
worker takes at most one stage, and every number is in range. A pool worker that cannot
trust a plan keeps its role.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from schemas.codec import SCHEMA_VERSION, pack
from schemas.fields import FieldReader

COMPUTE = "compute"  # the one mode a plan deploys: exited samples leave the batch


@dataclass(frozen=True, slots=True)
class StageRole:
    """Blocks ``first_block..last_block - 1`` on the pool workers ``workers`` (device
    class ``device``), fusing input back to ``batch`` and holding a partial batch at most
    ``hold_ms``; ``active_ramps``: the ramps that run in this stage (the exit wrapper)."""

    stage: int
    first_block: int
    last_block: int  # exclusive
    device: str
    batch: int
    hold_ms: float
    active_ramps: tuple[int, ...] = ()
    workers: tuple[str, ...] = ()

    def to_map(self) -> dict[str, Any]:
        return {"stage": self.stage, "first_block": self.first_block,
                "last_block": self.last_block, "device": self.device, "batch": self.batch,
                "hold_ms": float(self.hold_ms), "active_ramps": list(self.active_ramps),
                "workers": list(self.workers)}

    @classmethod
    def from_map(cls, msg: Any) -> StageRole:
        f = FieldReader(msg, "plan stage")
        return cls(stage=f.integer("stage"), first_block=f.integer("first_block"),
                   last_block=f.integer("last_block"), device=f.text("device"),
                   batch=f.integer("batch"), hold_ms=f.number("hold_ms"),
                   active_ramps=tuple(f.integers("active_ramps"))
                   if msg.get("active_ramps") is not None else (),
                   workers=tuple(f.texts("workers")) if msg.get("workers") is not None else ())


@dataclass(frozen=True, slots=True)
class Plan:
    """One version of one model's deployment plan. ``feasible=False``: no plan meets the
    constraints (``reason`` says why) and the workers keep the roles they have."""

    model: str
    version: int
    reason: str
    feasible: bool
    n_blocks: int
    stages: tuple[StageRole, ...] = ()
    goodput_rps: float = 0.0   # expected
    latency_ms: float = 0.0    # expected worst case
    cost: float = 0.0          # device-seconds per 1,000 answers, expected
    mode: str = COMPUTE
    t: float = 0.0             # unix seconds it was made
    extra: dict[str, Any] = field(default_factory=dict)  # informative: forecast, inputs

    def __post_init__(self) -> None:
        check(self)

    @property
    def cuts(self) -> tuple[int, ...]:
        """Blocks where one stage hands over to the next."""
        return tuple(s.first_block for s in self.stages[1:])

    def role_of(self, worker: str) -> StageRole | None:
        return next((s for s in self.stages if worker in s.workers), None)

    def to_map(self) -> dict[str, Any]:
        return {"v": SCHEMA_VERSION, "model": self.model, "version": self.version,
                "reason": self.reason, "feasible": self.feasible, "n_blocks": self.n_blocks,
                "stages": [s.to_map() for s in self.stages],
                "goodput_rps": float(self.goodput_rps), "latency_ms": float(self.latency_ms),
                "cost": float(self.cost), "mode": self.mode, "t": float(self.t),
                "extra": self.extra}

    def encode(self) -> bytes:
        return pack(self.to_map())

    @classmethod
    def decode(cls, msg: Any) -> Plan:
        """A checked plan; a malformed one raises ``bad_request`` naming what is wrong."""
        f = FieldReader(msg, "deployment plan")
        extra = msg.get("extra") or {}
        if not isinstance(extra, dict):
            raise f.error(f"field 'extra' must be a map, got {type(extra).__name__}")
        try:
            return cls(model=f.text("model"), version=f.integer("version"),
                       reason=f.text("reason", ""), feasible=f.flag("feasible"),
                       n_blocks=f.integer("n_blocks"),
                       stages=tuple(StageRole.from_map(m) for m in f.maps("stages"))
                       if msg.get("stages") is not None else (),
                       goodput_rps=f.number("goodput_rps", 0.0),
                       latency_ms=f.number("latency_ms", 0.0), cost=f.number("cost", 0.0),
                       mode=f.text("mode", COMPUTE), t=f.number("t", 0.0), extra=extra)
        except ValueError as exc:
            raise f.error(str(exc)) from None


def check(plan: Plan) -> None:
    """ValueError unless the plan is whole (see the module docstring)."""
    if plan.version < 1 or plan.n_blocks < 1:
        raise ValueError("version and n_blocks must be >= 1")
    if plan.mode != COMPUTE:
        raise ValueError(f"mode must be {COMPUTE!r}, got {plan.mode!r}")
    if plan.feasible and not plan.stages:
        raise ValueError("a feasible plan has at least one stage")
    edge, seen = 0, set()
    for k, s in enumerate(plan.stages):
        if s.stage != k or s.first_block != edge or not s.first_block < s.last_block:
            raise ValueError(f"stage {k} must start at block {edge} and hold at least one "
                             f"block, got stage {s.stage} blocks {s.first_block}..{s.last_block}")
        if s.batch < 1 or not s.hold_ms >= 0:
            raise ValueError(f"stage {k}: batch >= 1 and hold_ms >= 0 required")
        if any(w in seen for w in s.workers) or len(set(s.workers)) != len(s.workers):
            raise ValueError(f"stage {k}: a worker takes at most one stage")
        seen.update(s.workers)
        edge = s.last_block
    if plan.stages and edge != plan.n_blocks:
        raise ValueError(f"stages end at block {edge}, the model has {plan.n_blocks}")

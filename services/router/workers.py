"""The router's view of live workers: liveness from heartbeats and credit per worker (pure)."""

from __future__ import annotations

from dataclasses import dataclass, field

from services.router.edf_queue import Pending


@dataclass(slots=True)
class Inflight:
    batch_id: str
    worker: str
    model: str
    entries: list[Pending]
    dispatched: float
    size: int
    alone: bool = False  # its worker held nothing else when it was sent
    expected_ms: float = 0.0  # a variant batch: its profiled batch time (0: not profiled)


@dataclass(slots=True)
class WorkerState:
    id: str
    model: str
    stage: int
    stages: int
    capacity: int
    last_seen: float
    pid: int = 0
    config_version: int = 0
    set_aside: int = 0   # batches whose feedback run gave way, waiting for a re-run
    gave_way: int = 0    # runs it stopped for a waiting batch since start
    late: int = 0        # answers it sent as deadline_exceeded since start
    inflight: dict[str, Inflight] = field(default_factory=dict)

    @property
    def credit(self) -> int:
        return self.capacity - len(self.inflight)


class WorkerRegistry:
    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.workers: dict[str, WorkerState] = {}

    def heartbeat(self, worker: str, model: str, stage: int, stages: int, capacity: int,
                  now: float, pid: int = 0, config_version: int = 0, set_aside: int = 0,
                  gave_way: int = 0, late: int = 0) -> bool:
        """Record a heartbeat; True when the worker is new (or came back)."""
        state = self.workers.get(worker)
        if state is None:
            self.workers[worker] = WorkerState(worker, model, stage, stages, capacity, now, pid,
                                               config_version, set_aside, gave_way, late)
            return True
        state.last_seen = now
        state.capacity = capacity
        state.config_version = config_version
        state.set_aside, state.gave_way, state.late = set_aside, gave_way, late
        return False

    def lost_in_transit(self, worker: str, held: tuple[str, ...] | None, now: float,
                        margin_s: float) -> list[Inflight]:
        """Batches sent to ``worker`` at least ``margin_s`` before a heartbeat that does not
        list them, taken off its in-flight work: it never got them (a batch it released is
        released here first: its release and its heartbeats leave on one connection, in
        order). A worker that does not report what it holds (``held`` None) loses none."""
        state = self.workers.get(worker)
        if held is None or state is None or not state.inflight:
            return []
        listed = set(held)
        lost = [b for b in state.inflight.values()
                if b.batch_id not in listed and now - b.dispatched >= margin_s]
        for b in lost:
            del state.inflight[b.batch_id]
        return lost

    def remove(self, worker: str) -> WorkerState | None:
        return self.workers.pop(worker, None)

    def expire(self, now: float) -> list[WorkerState]:
        """Forget workers whose heartbeats stopped; their in-flight batches come back to the caller."""
        dead = [w for w in self.workers.values() if now - w.last_seen > self.timeout_s]
        for w in dead:
            del self.workers[w.id]
        return dead

    def pick(self, model: str) -> WorkerState | None:
        """The first-stage worker of ``model`` with the most free credit (ties: least recent)."""
        best: WorkerState | None = None
        for w in self.workers.values():
            if w.model != model or w.stage != 0 or w.credit <= 0:
                continue
            if best is None or w.credit > best.credit:
                best = w
        return best

    def ready(self, model: str) -> bool:
        """Every stage of ``model`` has at least one live worker."""
        stages = {w.stage: w.stages for w in self.workers.values() if w.model == model}
        if 0 not in stages:
            return False
        return all(s in stages for s in range(stages[0]))

    def has_stage0(self, model: str) -> bool:
        return self.stage0_count(model) > 0

    def stage0_count(self, model: str) -> int:
        return sum(w.model == model and w.stage == 0 for w in self.workers.values())

    def release(self, worker: str, batch_id: str) -> Inflight | None:
        state = self.workers.get(worker)
        if state is None:
            return None
        return state.inflight.pop(batch_id, None)

    def for_model(self, model: str) -> list[WorkerState]:
        return [w for w in self.workers.values() if w.model == model]

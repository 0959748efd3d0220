"""Pool worker (``offramp serve worker --pool``): a worker process with no fixed stage.

It announces itself in the store (status ``pool``, its device class), where the optimizer
counts it, and takes its role, a stage of one model, from the deployment plan in force
(``offramp.plan.<model>``, and the store's newest feasible plan at start). A role change
loads the new stage and starts serving it first, then retires the old one: the routers
are told it takes no more batches, it keeps its subjects for ``DRAIN_S`` so work sent
under the old plan still arrives, then it finishes what it holds. No request is lost or
answered twice on the way; a plan that drops the worker leaves it idle until the next.
"""

from __future__ import annotations

import asyncio
import os
import socket
import uuid
from datetime import UTC, datetime
from typing import Any

from nats.aio.client import Client
from nats.aio.msg import Msg

from schemas import subjects
from schemas.messages import decode_map
from schemas.plans import Plan, StageRole
from services.common import bus, gc_pauses, logs
from services.common.config import Config
from services.common.readiness import mark_ready
from services.common.service_loop import spawn
from services.runtime.devices import device_class
from services.worker.service import STORE_HEARTBEAT_S, Role, StagePlan, finish_role, start_role

POOL = "pool"   # the status the optimizer counts (services.optimizer.plan_inputs.POOL)
# How long a retiring role keeps its subjects: routers see its credit drop within a
# heartbeat (200 ms) and batches already on their way arrive within a second.
DRAIN_S = 2.0


def role_key(plan: Plan, role: StageRole) -> tuple[Any, ...]:
    """What makes two roles the same stage (and worth keeping loaded)."""
    return (plan.model, role.first_block, role.last_block, len(plan.stages))


class PoolWorker:
    def __init__(self, nc: Client, cfg: Config, store: Any, log: Any) -> None:
        self.nc, self.cfg, self.store, self.log = nc, cfg, store, log
        self.device = device_class(cfg.device, threads=cfg.ort_threads)
        self.id = f"pool-{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:4]}"
        self.versions: dict[str, int] = {}  # model -> newest plan version seen
        self.key: tuple[Any, ...] | None = None
        self.role: Role | None = None
        self.lock = asyncio.Lock()  # one role change at a time, in plan order
        self.tasks: set[asyncio.Task] = set()

    async def on_plan(self, msg: Msg) -> None:
        try:
            plan = Plan.decode(decode_map(msg.data))
        except Exception as exc:  # noqa: BLE001 - a plan it cannot trust: keep the role
            self.log.error("deployment plan refused: %r", exc)
            return
        await self.apply(plan)

    async def apply(self, plan: Plan) -> None:
        if not plan.feasible or plan.version <= self.versions.get(plan.model, 0):
            return
        async with self.lock:
            if plan.version <= self.versions.get(plan.model, 0):
                return
            self.versions[plan.model] = plan.version
            role = plan.role_of(self.id)
            if role is None:
                if self.key is not None and self.key[0] == plan.model:
                    self.log.info("plan %s leaves this worker idle", plan.version)
                    await self._retire(None, None)
                return
            key = role_key(plan, role)
            if key == self.key and self.role is not None:
                self.role.worker.take_plan_role(role)  # same stage: new batch, hold, ramps
                return
            await self._retire(key, await self._start(plan, role))

    async def _start(self, plan: Plan, role: StageRole) -> Role:
        stage = StagePlan(plan.model, role.stage, len(plan.stages), role.first_block,
                          role.last_block)
        self.log.info("taking role %s", logs.kv(plan=plan.version, model=plan.model,
                                                 stage=role.stage,
                                                 blocks=f"{role.first_block}:{role.last_block}"))
        return await start_role(self.nc, self.cfg, self.store, self.log, stage, role, self.id)

    async def _retire(self, key: tuple[Any, ...] | None, new: Role | None) -> None:
        """Make ``new`` the role served (after it is ready) and retire the old one."""
        old, self.role, self.key = self.role, new, key
        if old is not None:
            spawn(finish_role(old, self.log, DRAIN_S), self.tasks, self.log)

    async def resume(self) -> None:
        """The plans in force for the served models, from the store (a restart)."""
        for model in self.cfg.models:
            row = await asyncio.to_thread(self.store.latest_plan, model, True)
            if row is not None:
                await self.apply(Plan.decode(row["plan"]))

    async def announce_loop(self, stop: asyncio.Event) -> None:
        """Keep this worker's pool row fresh (the optimizer's inventory)."""
        host, pid = socket.gethostname(), os.getpid()
        while not stop.is_set():
            plan = self.role.worker.plan if self.role is not None else None
            try:
                await asyncio.to_thread(
                    self.store.upsert_worker, self.id, plan.model if plan else "",
                    plan.stage if plan else -1, plan.first_block if plan else 0,
                    plan.last_block if plan else 0, host, pid, POOL,
                    datetime.now(UTC).replace(tzinfo=None), self.device)
            except Exception:  # store hiccup: the next beat tries again
                self.log.exception("pool heartbeat failed")
            try:
                await asyncio.wait_for(stop.wait(), STORE_HEARTBEAT_S)
            except TimeoutError:
                pass

    async def stop(self) -> None:
        async with self.lock:
            await self._retire(None, None)
        if self.tasks:
            await asyncio.gather(*list(self.tasks), return_exceptions=True)


async def serve_pool(cfg: Config, stop: asyncio.Event) -> None:
    from services.store.repository import Store

    log = logs.setup("worker.pool", cfg.log_level)
    store = Store(cfg.database_url)
    nc = await bus.connect_as(cfg, "worker", "offramp-worker-pool")
    pool = PoolWorker(nc, cfg, store, log)
    await nc.subscribe(subjects.plan("*"), cb=pool.on_plan)
    announce = asyncio.ensure_future(pool.announce_loop(stop))
    await pool.resume()
    gc_pauses.settle(cfg.gc_freeze)  # the startup heap: out of every later collection
    log.info("pool worker ready %s", logs.kv(id=pool.id, device=pool.device,
                                             models=",".join(cfg.models)))
    mark_ready()
    await stop.wait()
    await pool.stop()
    await announce
    await asyncio.to_thread(store.upsert_worker, pool.id, "", -1, 0, 0, socket.gethostname(),
                            os.getpid(), "stopped", datetime.now(UTC).replace(tzinfo=None),
                            pool.device)
    await bus.close(nc)
    store.close()

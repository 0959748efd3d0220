"""The store's E3 history: batch profiles (observed and forecast survival per ramp and
window), versioned deployment plans, and worker marks the optimizer plans around (device
class, straggler). A mixin of :class:`services.store.repository.Store`, which supplies the
engine, the serialised writer and the dialect's INSERT.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

from sqlalchemy import func, insert, select, update

from services.store.db import naive_utc, retry_unique, utcnow
from services.store.tables import BatchProfile, DeploymentPlanRecord, Request, Worker

PLAN_COLUMNS = ("model", "version", "created_at", "reason", "feasible", "goodput_rps",
                "latency_ms", "cost", "plan", "inputs")


def _num(value: Any) -> float | None:
    return None if value is None else float(value)


class PlanHistory:
    """Batch profiles, deployment plans and worker marks (see the module docstring)."""

    # supplied by Store: the engine, the serialised writer and the dialect's INSERT
    engine: Any
    _writer: Any
    _insert: Callable[[Any], Any]

    # -- batch profiles -------------------------------------------------------------

    def record_forecast(self, model: str, window_start: datetime, window_end: datetime,
                        forecasts: Mapping[int, tuple[float, float | None]],
                        config_version: int | None = None) -> int:
        """The forecast survival of each ramp for the window ``[window_start, window_end)``
        before it is observed: ramp -> (ARIMA, naive). Recording a window again replaces
        its forecasts (and the error, when it was observed already)."""
        rows = [{"model": model, "window_start": naive_utc(window_start),
                 "window_end": naive_utc(window_end), "ramp": int(r),
                 "config_version": config_version, "forecast": _num(f),
                 "forecast_naive": _num(naive)} for r, (f, naive) in forecasts.items()]
        stmt = self._insert(BatchProfile)
        new = stmt.excluded
        stmt = stmt.on_conflict_do_update(
            index_elements=["model", "window_start", "ramp"],
            set_={"forecast": new.forecast, "forecast_naive": new.forecast_naive,
                  "error": func.abs(new.forecast - BatchProfile.observed)})
        return self._write_rows(stmt, rows)

    def record_observed(self, model: str, window_start: datetime, window_end: datetime,
                        observed: Mapping[int, tuple[int, float]],
                        config_version: int | None = None, drifted: bool | None = None) -> int:
        """What a finished window showed: ramp -> (samples, survival after the ramp), and
        whether it drifted from its forecast enough to ask for a re-plan. The error against
        a forecast recorded before is computed here."""
        rows = [{"model": model, "window_start": naive_utc(window_start),
                 "window_end": naive_utc(window_end), "ramp": int(r),
                 "config_version": config_version, "samples": int(n), "observed": float(s),
                 "drifted": drifted} for r, (n, s) in observed.items()]
        stmt = self._insert(BatchProfile)
        new = stmt.excluded
        stmt = stmt.on_conflict_do_update(
            index_elements=["model", "window_start", "ramp"],
            set_={"samples": new.samples, "observed": new.observed, "drifted": new.drifted,
                  "window_end": new.window_end, "config_version": new.config_version,
                  "error": func.abs(BatchProfile.forecast - new.observed)})
        return self._write_rows(stmt, rows)

    def request_exits(self, model: str, start: datetime,
                      end: datetime) -> tuple[dict[int | None, int], int | None]:
        """Where the requests of ``model`` received in ``[start, end)`` and answered ok
        under the newest exit config version among them left the model: ``{exit: count}``
        (a ramp index, -1 or None for the final layer), and that version. A window a new
        config began in counts only the new config's requests: survival under two configs
        at once is a point of neither series."""
        r = Request
        where = (r.model == model, r.status == "ok", r.received_at >= naive_utc(start),
                 r.received_at < naive_utc(end))
        with self.engine.connect() as conn:
            version = conn.scalar(select(func.max(r.config_version)).where(*where))
            mine = r.config_version.is_(None) if version is None else r.config_version == version
            counts = {e: int(n) for e, n in conn.execute(
                select(r.exit, func.count()).where(*where, mine).group_by(r.exit))}
        return counts, None if version is None else int(version)

    def newest_drift(self, model: str) -> datetime | None:
        """Start of the newest batch-profile window of ``model`` that drifted, or None."""
        b = BatchProfile
        with self.engine.connect() as conn:
            return conn.scalar(select(func.max(b.window_start)).where(
                b.model == model, b.drifted.is_(True)))

    def _write_rows(self, stmt: Any, rows: list[dict[str, Any]]) -> int:
        if rows:
            with self._writer.begin() as conn:
                conn.execute(stmt, rows)
        return len(rows)

    def batch_profiles(self, model: str, since: datetime | None = None,
                       ramp: int | None = None) -> list[dict[str, Any]]:
        """Rows of ``model`` (windows starting at or after ``since``; one ramp or all), by
        window and ramp: window_start, window_end, ramp, config_version, samples, observed,
        forecast, forecast_naive, error, drifted."""
        b = BatchProfile
        q = select(b.window_start, b.window_end, b.ramp, b.config_version, b.samples,
                   b.observed, b.forecast, b.forecast_naive, b.error, b.drifted
                   ).where(b.model == model).order_by(b.window_start, b.ramp)
        if since is not None:
            q = q.where(b.window_start >= naive_utc(since))
        if ramp is not None:
            q = q.where(b.ramp == int(ramp))
        with self.engine.connect() as conn:
            return [row._asdict() for row in conn.execute(q)]

    # -- deployment plans -----------------------------------------------------------

    def save_plan(self, model: str, reason: str, feasible: bool, goodput_rps: float,
                  latency_ms: float, cost: float, plan: dict[str, Any],
                  inputs: dict[str, Any]) -> dict[str, Any]:
        """Store the next version (previous + 1, or 1) of ``model``'s deployment plan;
        returns the stored row. ``plan`` and ``inputs`` must be JSON-able; a ``version``
        key of ``plan`` is set to the version stored (the message names its own version)."""
        values = {"model": model, "reason": reason, "feasible": bool(feasible),
                  "goodput_rps": float(goodput_rps), "latency_ms": float(latency_ms),
                  "cost": float(cost), "plan": json.loads(json.dumps(plan)),
                  "inputs": json.loads(json.dumps(inputs))}

        def attempt() -> dict[str, Any]:
            with self._writer.begin() as conn:
                prev = conn.scalar(select(func.max(DeploymentPlanRecord.version))
                                   .where(DeploymentPlanRecord.model == model))
                version = (prev or 0) + 1
                row = {**values, "version": version, "created_at": utcnow(),
                       "plan": {**values["plan"], **({"version": version}
                                                    if "version" in values["plan"] else {})}}
                conn.execute(insert(DeploymentPlanRecord).values(**row))  # version is unique
            return row

        return retry_unique(attempt)

    def latest_plan(self, model: str, feasible: bool = False) -> dict[str, Any] | None:
        """``model``'s newest plan, or None; ``feasible``: its newest feasible plan, the
        one in force (workers keep their roles when no plan is feasible)."""
        rows = self._plans(model, newest=True, feasible=feasible)
        return rows[0] if rows else None

    def deployment_plans(self, model: str, since_version: int = 0) -> list[dict[str, Any]]:
        """``model``'s plans with a version above ``since_version``, oldest first."""
        return self._plans(model, since_version=since_version)

    def _plans(self, model: str, since_version: int = 0, newest: bool = False,
               feasible: bool = False) -> list[dict[str, Any]]:
        d = DeploymentPlanRecord
        q = select(*(getattr(d, c) for c in PLAN_COLUMNS)).where(d.model == model)
        if feasible:
            q = q.where(d.feasible.is_(True))
        q = q.order_by(d.version.desc()).limit(1) if newest else \
            q.where(d.version > since_version).order_by(d.version)
        with self.engine.connect() as conn:
            return [row._asdict() for row in conn.execute(q)]

    # -- worker marks ---------------------------------------------------------------

    def mark_straggler(self, worker_id: str, since: datetime | None) -> bool:
        """Mark ``worker_id`` a straggler from ``since`` (None clears the mark); False when
        no such worker is known. The mark only keeps it out of plans: nothing stops it."""
        with self._writer.begin() as conn:
            res = conn.execute(update(Worker).where(Worker.worker_id == worker_id).values(
                straggler_since=None if since is None else naive_utc(since)))
        return res.rowcount > 0

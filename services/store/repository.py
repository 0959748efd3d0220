"""Repository: every read and write of the store. Callers see plain Python values only.

Sync SQLAlchemy on purpose: services call these methods through `asyncio.to_thread`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any, Self

from sqlalchemy import Table, case, delete, func, insert, or_, select, text, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import IntegrityError

from services.common.stats import percentile
from services.store.db import IMMEDIATE, make_engine, naive_utc, retry_unique, utcnow
from services.store.pht import HeliosHistory
from services.store.plan_history import PlanHistory
from services.store.rows import (
    ExitConfigRow,
    artifact_rows,
    exit_config_row,
    latency_row,
    opt,
    profile_row,
    ramp_rows,
    request_row,
    utility_row,
)
from services.store.tables import (
    Artifact,
    ExitConfig,
    ExitProfile,
    IngestedBatch,
    LatencyProfile,
    Model,
    Ramp,
    RampHead,
    RampUtility,
    Request,
    TunerState,
    Worker,
)
from services.store.variant_profiles import VariantProfiles


class Store(PlanHistory, VariantProfiles, HeliosHistory):
    """The performance-history store at `url` (SQLite file or PostgreSQL).

    The schema must exist: run `services.store.migrate.upgrade(url)` first.
    """

    def __init__(self, url: str) -> None:
        self.url = url
        self.engine = make_engine(url)
        self._writer = self.engine.execution_options(**{IMMEDIATE: True})

    def close(self) -> None:
        self.engine.dispose()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    # -- models, artifacts, ramps -------------------------------------------------

    def register_model(self, manifest: dict[str, Any], path: str) -> int:
        """Upsert a prepared model by name; returns its id. Re-registering the same
        manifest and path changes nothing; anything else replaces artifacts and ramps."""
        manifest = json.loads(json.dumps(manifest))  # what the JSON column will hand back
        return retry_unique(lambda: self._register(manifest, str(path)))

    def _register(self, manifest: dict[str, Any], path: str) -> int:
        now = utcnow()
        fields = {
            "version": str(manifest["version"]),
            "kind": str(manifest.get("kind", "")),
            "manifest": manifest,
            "path": path,
            "classes": manifest.get("classes"),
            "updated_at": now,
        }
        with self._writer.begin() as conn:
            old = conn.execute(
                select(Model.id, Model.version, Model.manifest, Model.path)
                .where(Model.name == manifest["name"])
                .with_for_update()  # PostgreSQL: one registrant per model at a time
            ).one_or_none()
            if old is not None and (old.version, old.manifest, old.path) == (
                fields["version"],
                manifest,
                path,
            ):
                return old.id
            if old is None:
                res = conn.execute(
                    insert(Model).values(name=manifest["name"], created_at=now, **fields)
                )
                model_id = res.inserted_primary_key[0]
            else:
                model_id = old.id
                conn.execute(update(Model).where(Model.id == model_id).values(**fields))
                conn.execute(delete(Artifact).where(Artifact.model_id == model_id))
                conn.execute(delete(Ramp).where(Ramp.model_id == model_id))
            artifacts = artifact_rows(model_id, "block", manifest.get("blocks", []), path)
            artifacts += artifact_rows(model_id, "ramp", manifest.get("ramps", []), path)
            if artifacts:
                conn.execute(insert(Artifact), artifacts)
            ramps = ramp_rows(model_id, manifest.get("ramps", []))
            if ramps:
                conn.execute(insert(Ramp), ramps)
            return model_id

    def model_names(self) -> list[str]:
        with self.engine.connect() as conn:
            return list(conn.scalars(select(Model.name).order_by(Model.name)))

    def model(self, name: str) -> dict[str, Any] | None:
        """name, version, kind, path, manifest, classes, created_at, updated_at."""
        with self.engine.connect() as conn:
            row = conn.execute(select(Model).where(Model.name == name)).one_or_none()
        if row is None:
            return None
        return {k: v for k, v in row._asdict().items() if k != "id"}

    def ramps(self, model: str) -> list[dict[str, Any]]:
        """index, after_block, arch, params, agreement, cost_ms, tensor, cost_by_batch (batch
        size as a string -> ms), file, sha256; by index."""
        art = Artifact.__table__.alias("a")
        q = (
            select(
                Ramp.idx,
                Ramp.site,
                Ramp.arch,
                Ramp.params,
                Ramp.agreement,
                Ramp.cost_ms,
                Ramp.tensor,
                Ramp.cost_by_batch,
                art.c.file,
                art.c.sha256,
            )
            .join(Model, Model.id == Ramp.model_id)
            .outerjoin(
                art,
                (art.c.model_id == Ramp.model_id)
                & (art.c.kind == "ramp")
                & (art.c.idx == Ramp.idx),
            )
            .where(Model.name == model)
            .order_by(Ramp.idx)
        )
        keys = (
            "index",
            "after_block",
            "arch",
            "params",
            "agreement",
            "cost_ms",
            "tensor",
            "cost_by_batch",
            "file",
            "sha256",
        )
        with self.engine.connect() as conn:
            return [dict(zip(keys, row, strict=True)) for row in conn.execute(q)]

    # -- exit configs --------------------------------------------------------------

    def latest_exit_config(self, model: str) -> ExitConfigRow | None:
        with self.engine.connect() as conn:
            row = conn.execute(
                select(ExitConfig)
                .where(ExitConfig.model == model)
                .order_by(ExitConfig.version.desc())
                .limit(1)
            ).one_or_none()
        return None if row is None else exit_config_row(row)

    def exit_configs(self, model: str, since_version: int = 0) -> list[ExitConfigRow]:
        """``model``'s exit configs with a version above ``since_version``, oldest first."""
        with self.engine.connect() as conn:
            rows = conn.execute(
                select(ExitConfig)
                .where(ExitConfig.model == model, ExitConfig.version > since_version)
                .order_by(ExitConfig.version)
            ).all()
        return [exit_config_row(r) for r in rows]

    def save_exit_config(
        self, model: str, thresholds: dict[int, float], active: list[int], mode: str, reason: str,
        heads: dict[int, str] | None = None,
    ) -> ExitConfigRow:
        """Store the next version (previous + 1, or 1) of `model`'s exit config (``heads``:
        ramp -> the refitted head file it serves)."""
        values = {
            "model": model,
            "thresholds": {str(int(k)): float(v) for k, v in thresholds.items()},
            "active": [int(i) for i in active],
            "mode": mode,
            "reason": reason,
            "heads": {str(int(k)): str(v) for k, v in (heads or {}).items()} or None,
        }

        def attempt() -> ExitConfigRow:
            with self._writer.begin() as conn:
                prev = conn.scalar(
                    select(func.max(ExitConfig.version)).where(ExitConfig.model == model)
                )
                row = {**values, "version": (prev or 0) + 1, "created_at": utcnow()}
                conn.execute(insert(ExitConfig).values(**row))  # (model, version) is unique
            return exit_config_row(SimpleNamespace(**row))

        return retry_unique(attempt)

    def ensure_exit_mode(self, model: str, mode: str, reason: str) -> ExitConfigRow | None:
        """Make ``mode`` the exit mode in force for ``model``: a new config version (same
        thresholds, ramps and heads) when the one in force has another mode; the new row,
        or None when nothing changed (or the model has no config yet)."""
        latest = self.latest_exit_config(model)
        if latest is None or latest.mode == mode:
            return None
        return self.save_exit_config(model, dict(latest.thresholds), list(latest.active), mode,
                                     reason, dict(latest.heads))

    # -- telemetry history ---------------------------------------------------------

    def add_exit_profiles(self, rows: list[dict[str, Any]], ingest_key: str | None = None) -> int:
        """Insert window x ramp profiles in one transaction; returns rows inserted
        (0 when the batch `ingest_key` was stored before)."""
        return self._ingest(ExitProfile.__table__, [profile_row(r) for r in rows], ingest_key)

    def add_requests(self, rows: list[dict[str, Any]], ingest_key: str | None = None) -> int:
        """Insert request history in one transaction; returns rows inserted (0 on a redelivery).
        A request already stored keeps its row: a resend (same id) served twice, e.g. after
        a slow first answer, adds nothing, so each request has one row, its first answer's."""
        once = self._insert(Request.__table__).on_conflict_do_nothing(
            index_elements=["model", "request_id"], index_where=text("request_id <> ''"))
        return self._ingest(Request.__table__, [request_row(r) for r in rows], ingest_key, once)

    def _ingest(self, table: Table, rows: list[dict[str, Any]], ingest_key: str | None,
                statement: Any = None) -> int:
        if ingest_key is None and not rows:
            return 0
        # Keys are per table: one telemetry batch may feed requests and profiles alike.
        key = None if ingest_key is None else f"{table.name}:{ingest_key}"
        try:
            with self._writer.begin() as conn:
                if key is not None:
                    conn.execute(insert(IngestedBatch).values(key=key, at=utcnow()))
                if rows:
                    conn.execute(insert(table) if statement is None else statement, rows)
        except IntegrityError:
            if key is not None and self._ingested(key):
                return 0  # redelivered batch: the first delivery's rows are already in
            raise
        return len(rows)

    def _ingested(self, key: str) -> bool:
        with self.engine.connect() as conn:
            return (
                conn.scalar(select(IngestedBatch.key).where(IngestedBatch.key == key)) is not None
            )

    def prune_ingested(self, before: datetime) -> int:
        """Forget batch keys recorded before `before` (redeliveries come within minutes)."""
        with self._writer.begin() as conn:
            res = conn.execute(delete(IngestedBatch).where(IngestedBatch.at < naive_utc(before)))
        return res.rowcount

    def request_stats(self, model: str, since: datetime) -> dict[str, Any]:
        """count, errors (status != 'ok'), p50_ms / p95_ms over ok requests, early_share
        (early results / ok requests), first_at (the earliest received_at, naive UTC); None
        where there is nothing to measure."""
        where = (Request.model == model, Request.received_at >= naive_utc(since))
        ok = Request.status == "ok"
        with self.engine.connect() as conn:
            count, n_ok, n_early, first_at = conn.execute(
                select(
                    func.count(),
                    func.coalesce(func.sum(case((ok, 1), else_=0)), 0),
                    func.coalesce(func.sum(case((ok & Request.early.is_(True), 1), else_=0)), 0),
                    func.min(Request.received_at),
                ).where(*where)
            ).one()
            latencies = sorted(
                conn.scalars(
                    select(Request.latency_ms).where(*where, ok, Request.latency_ms.is_not(None))
                )
            )
        return {
            "count": int(count),
            "errors": int(count - n_ok),
            "p50_ms": percentile(latencies, 50),
            "p95_ms": percentile(latencies, 95),
            "early_share": n_early / n_ok if n_ok else None,
            "first_at": first_at,
        }

    def request_latencies(self, model: str, since: datetime) -> dict[str, float]:
        """request id -> the router's latency for the ok requests received since ``since``
        (from the router receiving the request to it learning the answer)."""
        with self.engine.connect() as conn:
            rows = conn.execute(select(Request.request_id, Request.latency_ms).where(
                Request.model == model, Request.received_at >= naive_utc(since),
                Request.status == "ok", Request.latency_ms.is_not(None)))
            return {rid: float(ms) for rid, ms in rows}

    def request_arrivals(self, model: str, since: datetime) -> dict[str, float]:
        """request id -> when the router received it (Unix seconds), for the requests
        received since ``since``: with the client's send times, the way in to the router."""
        with self.engine.connect() as conn:
            rows = conn.execute(select(Request.request_id, Request.received_at).where(
                Request.model == model, Request.received_at >= naive_utc(since)))
            return {rid: at.replace(tzinfo=UTC).timestamp() for rid, at in rows}

    def request_statuses(self, prefix: str, ids: Iterable[str] = ()) -> list[tuple[str, str]]:
        """(request id, status) of every stored request whose id starts with ``prefix`` or is
        one of ``ids``, one pair per row (an id stored twice comes twice): what a bench
        compares with the replies its client got."""
        unique = sorted(set(ids))
        chunks = [unique[i:i + 500] for i in range(0, len(unique), 500)]  # bound IN lists
        wanted = [Request.request_id.startswith(prefix, autoescape=True)] if prefix else []
        out: list[tuple[str, str]] = []
        seen: set[int] = set()  # a row matched by prefix and by id counts once
        with self.engine.connect() as conn:
            for where in [*wanted, *(Request.request_id.in_(c) for c in chunks)]:
                for pk, rid, status in conn.execute(
                        select(Request.id, Request.request_id, Request.status).where(where)):
                    if pk not in seen:
                        seen.add(pk)
                        out.append((rid, status))
        return out

    def exit_profile_summary(self, model: str, since: datetime) -> list[dict[str, Any]]:
        """Per ramp over windows ending at or after `since`: windows, samples, and the
        sample-weighted mean exit_rate and agreement (so tiny windows do not dominate)."""
        p = ExitProfile
        has_agr = p.agreement.is_not(None)
        q = (
            select(
                p.ramp,
                func.count(),
                func.sum(p.samples),
                func.sum(p.exit_rate * p.samples),
                func.avg(p.exit_rate),
                func.sum(p.agreement * p.samples),
                func.sum(case((has_agr, p.samples), else_=0)),
                func.avg(p.agreement),
            )
            .where(p.model == model, p.window_end >= naive_utc(since))
            .group_by(p.ramp)
            .order_by(p.ramp)
        )
        out = []
        with self.engine.connect() as conn:
            for ramp, windows, samples, rate_w, rate_avg, agr_w, agr_n, agr_avg in conn.execute(q):
                out.append(
                    {
                        "ramp": ramp,
                        "windows": int(windows),
                        "samples": int(samples or 0),
                        "exit_rate": float(rate_w / samples) if samples else opt(float, rate_avg),
                        "agreement": float(agr_w / agr_n) if agr_n else opt(float, agr_avg),
                    }
                )
        return out

    # -- workers -------------------------------------------------------------------

    def upsert_worker(
        self,
        worker_id: str,
        model: str,
        stage: int,
        first_block: int,
        last_block: int,
        host: str,
        pid: int,
        status: str,
        last_seen: datetime,
        device: str | None = None,
    ) -> None:
        """Insert or refresh a worker (heartbeat) on device class ``device``. started_at
        resets when the process changed."""
        seen = naive_utc(last_seen)
        stmt = self._insert(Worker).values(
            worker_id=worker_id,
            model=model,
            stage=int(stage),
            first_block=int(first_block),
            last_block=int(last_block),
            host=host,
            pid=int(pid),
            status=status,
            started_at=seen,
            last_seen=seen,
            device=device,
        )
        new = stmt.excluded
        restarted = or_(Worker.pid != new.pid, Worker.host != new.host)
        cols = ("model", "stage", "first_block", "last_block", "host", "pid", "status", "last_seen",
                "device")
        stmt = stmt.on_conflict_do_update(
            index_elements=[Worker.worker_id],
            set_={
                **{c: new[c] for c in cols},
                "started_at": case((restarted, new.started_at), else_=Worker.started_at),
            },
        )
        with self._writer.begin() as conn:
            conn.execute(stmt)

    def workers(self, model: str | None = None) -> list[dict[str, Any]]:
        q = select(Worker).order_by(Worker.model, Worker.stage, Worker.worker_id)
        if model is not None:
            q = q.where(Worker.model == model)
        with self.engine.connect() as conn:
            return [row._asdict() for row in conn.execute(q)]

    def _insert(self, table: Any) -> Any:
        """The dialect's INSERT, which has ON CONFLICT (both back ends spell it alike)."""
        return (postgresql.insert if self.engine.dialect.name == "postgresql" else sqlite.insert)(
            table
        )

    # -- latency profiles ----------------------------------------------------------

    def save_latency_profile(
        self, model: str, device: str, rows: list[dict[str, Any]], replace: bool = False
    ) -> int:
        """Upsert rows {kind, idx, batch_size, ms, runs[, measured_at]} of `model` on device
        class `device`; returns rows written. `replace` first forgets the rest of that
        profile (a new model version may have other blocks and ramps)."""
        now = utcnow()
        keyed = {}
        for r in rows:  # last wins: one statement may not update a row twice (PostgreSQL)
            row = latency_row(model, device, r, now)
            keyed[(row["kind"], row["idx"], row["batch_size"])] = row
        stmt = self._insert(LatencyProfile)
        stmt = stmt.on_conflict_do_update(
            index_elements=["model", "device", "kind", "idx", "batch_size"],
            set_={c: stmt.excluded[c] for c in ("ms", "runs", "measured_at")},
        )
        where = (LatencyProfile.model == model, LatencyProfile.device == device)
        with self._writer.begin() as conn:
            if replace:
                conn.execute(delete(LatencyProfile).where(*where))
            if keyed:
                conn.execute(stmt, list(keyed.values()))
        return len(keyed)

    def latency_profile(self, model: str, device: str) -> list[dict[str, Any]]:
        """kind, idx, batch_size, ms, runs, measured_at; by kind, idx and batch size."""
        p = LatencyProfile
        q = (
            select(p.kind, p.idx, p.batch_size, p.ms, p.runs, p.measured_at)
            .where(p.model == model, p.device == device)
            .order_by(p.kind, p.idx, p.batch_size)
        )
        with self.engine.connect() as conn:
            return [row._asdict() for row in conn.execute(q)]

    # -- ramp adjustment -----------------------------------------------------------

    def add_ramp_utilities(self, rows: list[dict[str, Any]]) -> int:
        """Insert per-ramp utilities of adjustment rounds {model, round, ramp, exits,
        saved_ms, added_ms, utility_ms, action[, config_version, at]}; returns rows inserted."""
        now = utcnow()
        values = [utility_row(r, now) for r in rows]
        if values:
            with self._writer.begin() as conn:
                conn.execute(insert(RampUtility), values)
        return len(values)

    def save_tuner_state(self, model: str, state: dict[str, Any], config_version: int) -> None:
        """Insert or replace the tuner's serialised state of `model` (must be JSON-able)."""
        state = json.loads(json.dumps(state))  # fail here, not halfway through a commit
        stmt = self._insert(TunerState).values(
            model=model, state=state, config_version=int(config_version), updated_at=utcnow()
        )
        stmt = stmt.on_conflict_do_update(
            index_elements=[TunerState.model],
            set_={c: stmt.excluded[c] for c in ("state", "config_version", "updated_at")},
        )
        with self._writer.begin() as conn:
            conn.execute(stmt)

    def tuner_state(self, model: str) -> dict[str, Any] | None:
        """{model, state, config_version, updated_at}, or None when never saved."""
        with self.engine.connect() as conn:
            row = conn.execute(select(TunerState).where(TunerState.model == model)).one_or_none()
        return None if row is None else row._asdict()

    def save_ramp_head(self, model: str, ramp: int, version: int, file: str, sha256: str,
                       trained_on: int, judged_on: int, verdict: dict[str, float],
                       prepared: str | None = None) -> None:
        """Record version ``version`` of ``ramp``'s head (its file next to the model's) with
        the validation it passed: ``verdict`` holds serving_agreement, agreement,
        serving_calibration and calibration; ``prepared``, the manifest version of the
        preparation it was fitted to. The same version twice is one row."""
        stmt = self._insert(RampHead).values(
            model=model, ramp=int(ramp), version=int(version), file=file, sha256=sha256,
            trained_on=int(trained_on), judged_on=int(judged_on), created_at=utcnow(),
            prepared=prepared,
            **{k: float(verdict[k]) for k in ("serving_agreement", "agreement",
                                                 "serving_calibration", "calibration")})
        stmt = stmt.on_conflict_do_nothing(
            index_elements=[RampHead.model, RampHead.ramp, RampHead.version])
        with self._writer.begin() as conn:
            conn.execute(stmt)

    def ramp_heads(self, model: str) -> list[dict[str, Any]]:
        """Every refitted head of ``model``, by ramp and version."""
        with self.engine.connect() as conn:
            rows = conn.execute(select(RampHead).where(RampHead.model == model)
                                .order_by(RampHead.ramp, RampHead.version)).all()
        return [r._asdict() for r in rows]

    def latest_ramp_heads(self, model: str) -> dict[int, dict[str, Any]]:
        """Per ramp, its newest refitted head (ramps still on the prepared head are absent):
        what a restarted worker or tuner resumes from."""
        return {r["ramp"]: r for r in self.ramp_heads(model)}

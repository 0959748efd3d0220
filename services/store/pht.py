"""The store's HELIOS history: the model repository (candidate early-exit LLMs with their
offline profiles), the generation streams LLM workers ended (which candidate and depth
served each, for which assessment, and how it went), the Performance History Table built
from them (how each candidate did per served model, assessment and loaded depth) and
HELIOS's decisions (which candidate and depth served a model from when on, and why). A mixin
of :class:`services.store.repository.Store`, which supplies the engine, the serialised
writer, the dialect's INSERT and the idempotent telemetry ingest.

Rows go in and come out as plain dicts whose keys are the fields of
``services.optimizer.helios``'s ``Candidate``, ``PhtRow`` and ``Decision`` (the store does
not import the optimizer), and for generation streams the ``generations`` columns; exit
distributions and a stream's exits come back keyed by int layer.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import DateTime, bindparam, false, func, insert, select, text

from services.store.db import naive_utc, utcnow
from services.store.tables import Generation, HeliosDecision, PhtEntry, RepositoryCandidate

REPOSITORY_COLUMNS = ("name", "family", "n_layers", "exit_layers", "layer_bytes",
                      "fixed_bytes", "kv_bytes_per_token_layer", "tokens_per_s", "perplexity",
                      "exit_distribution", "benchmarks", "path", "updated_at")
PHT_COLUMNS = ("model", "at", "assessment", "candidate", "loaded_depth", "tokens_per_s",
               "ttft_ms", "tpot_ms", "perplexity", "exit_distribution", "memory_bytes", "tokens")
DECISION_COLUMNS = ("model", "at", "kind", "candidate", "depth", "assessment", "reason",
                    "batch", "load_bytes", "load_ms", "cost_ms")
DECISION_KINDS = ("evaluate", "load", "unload", "switch", "stay")
GENERATION_COLUMNS = ("id", "request_id", "model", "worker", "received_at", "candidate",
                      "depth", "assessment", "prompt_tokens", "tokens", "ttft_ms", "tpot_ms",
                      "duration_ms", "logprob", "exits", "breaches", "memory_bytes", "checked",
                      "agreed", "first_deviation", "judged_logprob", "judging", "decode_ms")

# Which candidate and depth served each request of a model, and why: the decision in force
# when the request arrived (the newest one at or before it). One query on both back ends.
SERVED_BY_SQL = """
SELECT r.request_id, r.received_at, r.status,
       d.candidate, d.depth, d.kind, d.assessment, d.reason, d.at AS decided_at
FROM requests r
LEFT JOIN helios_decisions d ON d.id = (
    SELECT d2.id FROM helios_decisions d2
    WHERE d2.model = r.model AND d2.at <= r.received_at
    ORDER BY d2.at DESC, d2.id DESC LIMIT 1)
WHERE r.model = :model AND r.received_at >= :since AND r.received_at < :until
ORDER BY r.received_at, r.id
"""


def _layers_out(dist: Mapping[str, float] | None) -> dict[int, float]:
    return {int(k): float(v) for k, v in (dist or {}).items()}


def _layers_in(dist: Mapping[Any, float] | None) -> dict[str, float] | None:
    return None if dist is None else {str(int(k)): float(v) for k, v in dist.items()}


def _opt(kind: Callable[[Any], Any], value: Any) -> Any:
    return None if value is None else kind(value)


def _pht_row(model: str, at: datetime, r: Mapping[str, Any]) -> dict[str, Any]:
    return {"model": model, "at": at, "assessment": int(r["assessment"]),
            "candidate": str(r["candidate"]), "loaded_depth": int(r["loaded_depth"]),
            "tokens_per_s": float(r["tokens_per_s"]), "ttft_ms": float(r["ttft_ms"]),
            "tpot_ms": float(r["tpot_ms"]), "perplexity": float(r["perplexity"]),
            "exit_distribution": _layers_in(r["exit_distribution"]) or {},
            "memory_bytes": int(r["memory_bytes"]), "tokens": int(r["tokens"])}


def _generation_row(r: Mapping[str, Any]) -> dict[str, Any]:
    return {"request_id": str(r["request_id"]), "model": str(r["model"]),
            "worker": str(r["worker"]), "received_at": naive_utc(r["received_at"]),
            "candidate": str(r["candidate"]), "depth": int(r["depth"]),
            "assessment": _opt(int, r.get("assessment")),
            "prompt_tokens": int(r["prompt_tokens"]), "tokens": int(r["tokens"]),
            "ttft_ms": float(r["ttft_ms"]), "tpot_ms": float(r["tpot_ms"]),
            "duration_ms": float(r["duration_ms"]), "logprob": float(r["logprob"]),
            "exits": {str(int(k)): int(v) for k, v in r["exits"].items()},
            "breaches": int(r["breaches"]), "memory_bytes": int(r["memory_bytes"]),
            "checked": int(r.get("checked", 0)), "agreed": int(r.get("agreed", 0)),
            "first_deviation": _opt(int, r.get("first_deviation")),
            "judged_logprob": _opt(float, r.get("judged_logprob")),
            "judging": bool(r.get("judging", False)),
            "decode_ms": _opt(float, r.get("decode_ms"))}


class HeliosHistory:
    """Model repository, PHT and HELIOS decisions (see the module docstring)."""

    # supplied by Store: the engine, the serialised writer, the dialect's INSERT and the
    # ingest of telemetry rows under a batch key (a redelivered batch adds nothing)
    engine: Any
    _writer: Any
    _insert: Callable[[Any], Any]
    _ingest: Callable[..., int]

    # -- model repository -------------------------------------------------------------

    def save_repository_candidates(self, rows: Sequence[Mapping[str, Any]]) -> int:
        """Insert or replace (by name) candidates: ``name``, ``family``, ``n_layers``,
        ``exit_layers``, ``layer_bytes``, ``fixed_bytes``, ``kv_bytes_per_token_layer``,
        ``tokens_per_s``, ``perplexity`` and optionally ``exit_distribution`` ({layer:
        fraction}), ``benchmarks`` (JSON-able), ``path``. Returns the rows written."""
        now = utcnow()
        keyed = {str(r["name"]): {
            "name": str(r["name"]), "family": str(r["family"]), "n_layers": int(r["n_layers"]),
            "exit_layers": [int(x) for x in r["exit_layers"]],
            "layer_bytes": int(r["layer_bytes"]), "fixed_bytes": int(r["fixed_bytes"]),
            "kv_bytes_per_token_layer": int(r["kv_bytes_per_token_layer"]),
            "tokens_per_s": float(r["tokens_per_s"]), "perplexity": float(r["perplexity"]),
            "exit_distribution": _layers_in(r.get("exit_distribution") or None),
            "benchmarks": r.get("benchmarks"), "path": _opt(str, r.get("path")),
            "updated_at": now} for r in rows}  # last wins: PostgreSQL updates a row once
        stmt = self._insert(RepositoryCandidate)
        stmt = stmt.on_conflict_do_update(
            index_elements=["name"],
            set_={c: stmt.excluded[c] for c in REPOSITORY_COLUMNS if c != "name"})
        if keyed:
            with self._writer.begin() as conn:
                conn.execute(stmt, list(keyed.values()))
        return len(keyed)

    def repository_candidates(self, family: str | None = None) -> list[dict[str, Any]]:
        """The repository's candidates (of one ``family``, or all), by name."""
        m = RepositoryCandidate
        q = select(*(getattr(m, c) for c in REPOSITORY_COLUMNS)).order_by(m.name)
        if family is not None:
            q = q.where(m.family == family)
        with self.engine.connect() as conn:
            rows = [row._asdict() for row in conn.execute(q)]
        for r in rows:
            r["exit_distribution"] = _layers_out(r["exit_distribution"])
        return rows

    # -- generation streams -------------------------------------------------------------

    def add_generations(self, rows: Sequence[Mapping[str, Any]],
                        ingest_key: str | None = None) -> int:
        """Insert generation streams in one transaction: ``request_id``, ``model``,
        ``worker``, ``received_at``, ``candidate``, ``depth``, ``assessment`` (None: outside
        any), ``prompt_tokens``, ``tokens``, ``ttft_ms``, ``tpot_ms``, ``duration_ms``,
        ``logprob``, ``exits`` ({layer: tokens}), ``breaches``, ``memory_bytes``. Returns the
        rows offered, 0 when the batch ``ingest_key`` was stored before. A stream already
        stored (same model and request id) keeps its row, except that a ``judging`` row takes
        the ``judged_logprob`` of the record that completes it (``judging`` false)."""
        table = Generation.__table__
        ins = self._insert(table)
        once = ins.on_conflict_do_update(
            index_elements=["model", "request_id"], index_where=text("request_id <> ''"),
            set_={"judged_logprob": ins.excluded.judged_logprob, "judging": false()},
            where=table.c.judging.is_(True) & ins.excluded.judging.is_(False))
        return self._ingest(table, [_generation_row(r) for r in rows], ingest_key, once)

    def generations(self, model: str, assessment: int) -> list[dict[str, Any]]:
        """The streams of ``model`` that counted toward ``assessment``, in the order stored,
        with every column (``GENERATION_COLUMNS``); not those still being judged."""
        g = Generation
        q = (select(*(getattr(g, c) for c in GENERATION_COLUMNS))
             .where(g.model == model, g.assessment == int(assessment), g.judging.is_(False))
             .order_by(g.id))
        with self.engine.connect() as conn:
            rows = [row._asdict() for row in conn.execute(q)]
        for r in rows:
            r["exits"] = {int(k): int(v) for k, v in r["exits"].items()}
        return rows

    def generation_assessments(self, after_id: int = 0) -> list[dict[str, Any]]:
        """Per (model, assessment) with streams stored under an id above ``after_id``:
        ``model``, ``assessment``, ``last_id`` (the newest such id); streams outside any
        assessment are left out. By model and assessment."""
        g = Generation
        q = (select(g.model, g.assessment, func.max(g.id).label("last_id"))
             .where(g.id > int(after_id), g.assessment.is_not(None))
             .group_by(g.model, g.assessment).order_by(g.model, g.assessment))
        with self.engine.connect() as conn:
            return [row._asdict() for row in conn.execute(q)]

    def assessment_progress(self, model: str, assessment: int) -> list[dict[str, Any]]:
        """What ``assessment`` of ``model`` has served so far, per candidate and depth:
        ``candidate``, ``depth``, ``requests`` (streams), ``tokens`` and ``last_at`` (the
        newest stream's arrival). Its PHT row has caught up when its ``tokens`` are these.
        Streams still being judged are not counted yet: the PHT leaves them out too."""
        g = Generation
        q = (select(g.candidate, g.depth, func.count().label("requests"),
                    func.sum(g.tokens).label("tokens"), func.max(g.received_at).label("last_at"))
             .where(g.model == model, g.assessment == int(assessment), g.judging.is_(False))
             .group_by(g.candidate, g.depth).order_by(g.candidate, g.depth))
        with self.engine.connect() as conn:
            return [row._asdict() for row in conn.execute(q)]

    # -- performance history table ----------------------------------------------------

    def record_pht(self, model: str, rows: Sequence[Mapping[str, Any]],
                   at: datetime | None = None) -> int:
        """Insert PHT rows of served model ``model`` (each with the ``PhtRow`` fields),
        stamped ``at`` (default now). A row of the same (assessment, candidate, loaded
        depth) replaces the one stored. Returns the rows written."""
        stamp = utcnow() if at is None else naive_utc(at)
        keyed = {}
        for r in rows:
            row = _pht_row(model, stamp, r)
            keyed[(row["assessment"], row["candidate"], row["loaded_depth"])] = row
        stmt = self._insert(PhtEntry)
        stmt = stmt.on_conflict_do_update(
            index_elements=["model", "assessment", "candidate", "loaded_depth"],
            set_={c: stmt.excluded[c] for c in PHT_COLUMNS
                  if c not in ("model", "assessment", "candidate", "loaded_depth")})
        if keyed:
            with self._writer.begin() as conn:
                conn.execute(stmt, list(keyed.values()))
        return len(keyed)

    def pht_rows(self, model: str, assessment: int | None = None,
                 since: datetime | None = None) -> list[dict[str, Any]]:
        """``model``'s PHT rows (of one assessment, and/or stamped at or after ``since``), by
        assessment, candidate and depth."""
        p = PhtEntry
        q = select(*(getattr(p, c) for c in PHT_COLUMNS)).where(p.model == model)
        if assessment is not None:
            q = q.where(p.assessment == int(assessment))
        if since is not None:
            q = q.where(p.at >= naive_utc(since))
        with self.engine.connect() as conn:
            rows = [row._asdict() for row in conn.execute(
                q.order_by(p.assessment, p.candidate, p.loaded_depth))]
        for r in rows:
            r["exit_distribution"] = _layers_out(r["exit_distribution"])
        return rows

    def latest_assessment(self, model: str) -> int | None:
        """The newest assessment of ``model`` with PHT rows, or None."""
        with self.engine.connect() as conn:
            return conn.scalar(select(func.max(PhtEntry.assessment))
                               .where(PhtEntry.model == model))

    # -- decisions --------------------------------------------------------------------

    def record_helios_decision(self, model: str, decision: Mapping[str, Any],
                               at: datetime | None = None) -> dict[str, Any]:
        """Store what serves ``model`` from ``at`` (default now) on: ``kind`` (one of
        ``DECISION_KINDS``), ``candidate``, ``depth``, ``reason`` and optionally
        ``assessment``, ``batch``, ``load_bytes``, ``load_ms``, ``cost_ms``. Returns the row,
        with its ``id`` (increasing: what the HELIOS decision message carries)."""
        if decision["kind"] not in DECISION_KINDS:
            raise ValueError(f"decision kind {decision['kind']!r} not in {DECISION_KINDS}")
        get = decision.get
        row = {"model": model, "at": utcnow() if at is None else naive_utc(at),
               "kind": str(decision["kind"]), "candidate": str(decision["candidate"]),
               "depth": int(decision["depth"]), "reason": str(decision["reason"]),
               "assessment": _opt(int, get("assessment")), "batch": _opt(int, get("batch")),
               "load_bytes": _opt(int, get("load_bytes")), "load_ms": _opt(float, get("load_ms")),
               "cost_ms": _opt(float, get("cost_ms"))}
        with self._writer.begin() as conn:
            res = conn.execute(insert(HeliosDecision).values(**row))
        return {"id": res.inserted_primary_key[0], **row}

    def helios_decisions(self, model: str, since: datetime | None = None) -> list[dict[str, Any]]:
        """``model``'s decisions (at or after ``since``), with their ``id``, oldest first."""
        d = HeliosDecision
        q = select(d.id, *(getattr(d, c) for c in DECISION_COLUMNS)).where(d.model == model)
        if since is not None:
            q = q.where(d.at >= naive_utc(since))
        with self.engine.connect() as conn:
            return [row._asdict() for row in conn.execute(q.order_by(d.at, d.id))]

    def latest_helios_decision(self, model: str) -> dict[str, Any] | None:
        """The decision in force for ``model`` (its newest, as ``SERVED_BY_SQL`` orders them),
        with its ``id``; None before the first."""
        d = HeliosDecision
        q = (select(d.id, *(getattr(d, c) for c in DECISION_COLUMNS)).where(d.model == model)
             .order_by(d.at.desc(), d.id.desc()).limit(1))
        with self.engine.connect() as conn:
            row = conn.execute(q).one_or_none()
        return None if row is None else row._asdict()

    def generation_totals(self) -> dict[str, dict[str, int]]:
        """Per served model with generation streams: ``streams``, ``tokens``, ``checked``
        (early tokens the full model checked) and ``agreed``."""
        g = Generation
        q = select(g.model, func.count(), func.sum(g.tokens), func.sum(g.checked),
                   func.sum(g.agreed)).group_by(g.model)
        with self.engine.connect() as conn:
            return {m: {"streams": int(n), "tokens": int(t or 0), "checked": int(c or 0),
                        "agreed": int(a or 0)} for m, n, t, c, a in conn.execute(q)}

    def requests_served_by(self, model: str, since: datetime,
                           until: datetime | None = None) -> list[dict[str, Any]]:
        """Per request of ``model`` received in ``[since, until)``: request_id, received_at,
        status and the candidate, depth, kind, assessment, reason and decided_at of the
        decision in force when it arrived (None before the first decision);
        ``SERVED_BY_SQL``, the query a user would type."""
        stmt = text(SERVED_BY_SQL).bindparams(
            bindparam("since", type_=DateTime()), bindparam("until", type_=DateTime())
        ).columns(received_at=DateTime(), decided_at=DateTime())
        end = datetime.max if until is None else naive_utc(until)
        with self.engine.connect() as conn:
            rows = conn.execute(stmt, {"model": model, "since": naive_utc(since), "until": end})
            return [dict(r._mapping) for r in rows]

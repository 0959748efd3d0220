"""The store's variant profiles (SuperServe): what each variant of a model (a supernet's
subnet, an early-exit model's depth cap) answers and how fast, per device class. A mixin
of :class:`services.store.repository.Store`, which supplies the engine and the
serialised writer.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import delete, func, insert, select

from services.store.db import naive_utc, utcnow
from services.store.tables import ExitProfile, SubnetProfile

PROFILE_COLUMNS = ("model", "device", "variant", "created_at", "accuracy",
                   "labelled_accuracy", "latency_ms", "pareto", "source")


class VariantProfiles:
    engine: Any
    _writer: Any

    def save_subnet_profiles(self, model: str, device: str, rows: Sequence[dict[str, Any]],
                             source: str, replaces: Sequence[str] = ()) -> int:
        """Replace ``model``'s profiles of ``source`` on ``device`` with ``rows`` (each:
        ``variant``, ``accuracy``, ``labelled_accuracy`` (or None), ``latency_ms`` as
        ``{batch: ms}``, ``pareto``), in one transaction: a reader sees the old table or
        the new one, never a mix. ``replaces``: sources whose rows of ``model`` (on any
        device) the new ones supersede, e.g. estimates made before measurements. Returns
        the rows written."""
        now = utcnow()
        values = [{"model": model, "device": device, "variant": str(r["variant"]),
                   "created_at": now, "accuracy": float(r["accuracy"]),
                   "labelled_accuracy": (None if r.get("labelled_accuracy") is None
                                         else float(r["labelled_accuracy"])),
                   "latency_ms": {str(b): float(ms) for b, ms in
                                  json.loads(json.dumps(r.get("latency_ms") or {})).items()},
                   "pareto": bool(r["pareto"]), "source": source} for r in rows]
        s = SubnetProfile
        with self._writer.begin() as conn:
            conn.execute(delete(s).where(s.model == model, s.device == device,
                                         s.source == source))
            if replaces:
                conn.execute(delete(s).where(s.model == model, s.source.in_(list(replaces))))
            if values:
                conn.execute(insert(s), values)
        return len(values)

    def subnet_profiles(self, model: str, device: str | None = None,
                        pareto: bool = True) -> list[dict[str, Any]]:
        """``model``'s variant profiles (the frontier only, unless ``pareto`` is False),
        fastest first by batch-1 latency where known, each with ``latency_ms`` keyed by
        int batch size."""
        s = SubnetProfile
        q = select(*(getattr(s, c) for c in PROFILE_COLUMNS)).where(s.model == model)
        if device is not None:
            q = q.where(s.device == device)
        if pareto:
            q = q.where(s.pareto.is_(True))
        with self.engine.connect() as conn:
            rows = [dict(r._mapping) for r in conn.execute(q.order_by(s.variant))]
        for r in rows:
            r["latency_ms"] = {int(b): float(ms) for b, ms in (r["latency_ms"] or {}).items()}
        return sorted(rows, key=lambda r: (r["latency_ms"].get(1, float("inf")), r["variant"]))

    def cap_agreements(self, model: str, config_version: int,
                       since: datetime) -> dict[int | None, tuple[int, float]]:
        """Per ramp (None: the whole config), over the exit-profile windows of
        ``config_version`` that ended at or after ``since``: the samples seen and their
        sample-weighted depth-cap agreement."""
        p = ExitProfile
        q = (select(p.ramp, func.sum(p.samples), func.sum(p.cap_agreement * p.samples))
             .where(p.model == model, p.config_version == config_version,
                    p.window_end >= naive_utc(since), p.cap_agreement.is_not(None))
             .group_by(p.ramp))
        with self.engine.connect() as conn:
            return {(None if ramp < 0 else int(ramp)): (int(n), float(agree) / n)
                    for ramp, n, agree in conn.execute(q) if n}

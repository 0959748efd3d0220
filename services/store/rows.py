"""Plain-value conversions between callers' dicts and table rows (no I/O but a stat)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

from schemas.messages import ExitConfig
from services.store.db import naive_utc

T = TypeVar("T")


@dataclass(frozen=True)
class ExitConfigRow:
    model: str
    version: int
    thresholds: dict[int, float]  # ramp index -> threshold
    active: list[int]
    mode: str
    reason: str
    created_at: datetime  # naive UTC
    heads: dict[int, str] = field(default_factory=dict)  # ramp -> refitted head file

    def message(self) -> ExitConfig:
        """This config as the bus broadcasts it."""
        return ExitConfig(self.model, self.version, self.mode, dict(self.thresholds),
                          list(self.active), heads=dict(self.heads))


def opt(kind: Callable[[Any], T], value: Any) -> T | None:
    # Casting also turns numpy scalars from telemetry into types every driver adapts.
    return None if value is None else kind(value)


def request_row(r: dict[str, Any]) -> dict[str, Any]:
    return {
        "request_id": str(r["request_id"]),
        "model": r["model"],
        "received_at": naive_utc(r["received_at"]),
        "latency_ms": opt(float, r.get("latency_ms")),
        "status": r.get("status") or "ok",
        "exit": opt(int, r.get("exit")),
        "early": opt(bool, r.get("early")),
        "label": opt(int, r.get("label")),
        "config_version": opt(int, r.get("config_version")),
        "variant": opt(str, r.get("variant")),
    }


def profile_row(r: dict[str, Any]) -> dict[str, Any]:
    return {
        "model": r["model"],
        "config_version": opt(int, r.get("config_version")),
        "window_start": naive_utc(r["window_start"]),
        "window_end": naive_utc(r["window_end"]),
        "ramp": int(r["ramp"]),
        "samples": int(r["samples"]),
        "exit_rate": float(r["exit_rate"]),
        "agreement": opt(float, r.get("agreement")),
        "cap_agreement": opt(float, r.get("cap_agreement")),
    }


def exit_config_row(row: Any) -> ExitConfigRow:
    return ExitConfigRow(
        model=row.model,
        version=row.version,
        thresholds={
            int(k): float(v) for k, v in sorted(row.thresholds.items(), key=lambda kv: int(kv[0]))
        },
        active=[int(i) for i in row.active],
        mode=row.mode,
        reason=row.reason,
        created_at=row.created_at,
        heads={int(k): str(v) for k, v in (getattr(row, "heads", None) or {}).items()},
    )


def artifact_rows(
    model_id: int, kind: str, entries: Iterable[dict[str, Any]], path: str
) -> list[dict[str, Any]]:
    rows = []
    for e in entries:
        if "file" not in e:
            continue
        size = e.get("bytes")
        if size is None and (f := Path(path) / e["file"]).is_file():
            size = f.stat().st_size
        rows.append(
            {
                "model_id": model_id,
                "kind": kind,
                "idx": int(e["index"]),
                "file": e["file"],
                "sha256": e.get("sha256"),
                "bytes": opt(int, size),
            }
        )
    return rows


def ramp_rows(model_id: int, ramps: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        {
            "model_id": model_id,
            "idx": int(r["index"]),
            "site": int(r["after_block"]),
            "arch": r.get("arch"),
            "params": opt(int, r.get("params")),
            "agreement": opt(float, r.get("agreement")),
            "cost_ms": opt(float, r.get("cost_ms")),
            # The manifest calls the graph tensor a ramp reads its "site"; older ones lack it.
            "tensor": r.get("site") or None,
            "cost_by_batch": _costs(r.get("cost_by_batch")),
        }
        for r in ramps
    ]


def _costs(by_batch: dict[Any, Any] | None) -> dict[str, float] | None:
    """Batch size -> ms with string keys (what a JSON column hands back anyway)."""
    if not by_batch:
        return None
    return {str(int(b)): float(ms) for b, ms in sorted(by_batch.items(), key=lambda kv: int(kv[0]))}


LATENCY_KINDS = ("block", "ramp", "full")


def latency_row(model: str, device: str, r: dict[str, Any], now: datetime) -> dict[str, Any]:
    kind = str(r["kind"])
    if kind not in LATENCY_KINDS:
        raise ValueError(f"latency profile kind must be one of {LATENCY_KINDS}, got {kind!r}")
    return {
        "model": model,
        "device": device,
        "kind": kind,
        "idx": -1 if kind == "full" else int(r["idx"]),
        "batch_size": int(r["batch_size"]),
        "ms": float(r["ms"]),
        "runs": int(r["runs"]),
        "measured_at": naive_utc(r["measured_at"]) if r.get("measured_at") else now,
    }


def utility_row(r: dict[str, Any], now: datetime) -> dict[str, Any]:
    return {
        "model": r["model"],
        "round": int(r["round"]),
        "config_version": opt(int, r.get("config_version")),
        "ramp": int(r["ramp"]),
        "exits": int(r["exits"]),
        "saved_ms": float(r["saved_ms"]),
        "added_ms": float(r["added_ms"]),
        "utility_ms": float(r["utility_ms"]),
        "action": str(r["action"]),
        "at": naive_utc(r["at"]) if r.get("at") else now,
    }

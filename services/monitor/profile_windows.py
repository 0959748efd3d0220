"""Sliding windows over sample telemetry (pure): agreement of the deployed exit config with
the final model, and per-ramp exit rates and agreement.

Windows close at telemetry-message boundaries once they hold at least ``size`` samples,
so every message belongs to exactly one window: a window rebuilt from redelivered
messages after a restart is identical and its store key deduplicates it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime

import numpy as np

from schemas.telemetry import SampleTelemetry
from services.exits.depth_caps import cap_agreement


@dataclass(slots=True)
class SampleBatch:
    """One telemetry message from a last-stage worker."""

    key: str                 # stable identity (stream sequence)
    model: str
    config_version: int
    t: float                 # unix seconds
    ramp_ids: list[int]
    ramp_pred: np.ndarray    # R x N
    exit_at: np.ndarray      # N, ramp index or -1
    final_pred: np.ndarray   # N

    @classmethod
    def of(cls, key: str, telemetry: SampleTelemetry) -> SampleBatch:
        return cls(key=key, model=telemetry.model, config_version=telemetry.config_version,
                   t=telemetry.t, ramp_ids=list(telemetry.ramp_ids),
                   ramp_pred=telemetry.ramp_pred, exit_at=telemetry.exit_at,
                   final_pred=telemetry.final_pred)

    def answers(self) -> np.ndarray:
        """What each sample was answered with: its exit ramp's top-1, else the final top-1."""
        out = self.final_pred.copy()
        for row, ramp in enumerate(self.ramp_ids):
            mask = self.exit_at == ramp
            out[mask] = self.ramp_pred[row][mask]
        return out


@dataclass
class ProfileWindow:
    model: str
    config_version: int
    first_key: str
    start: float
    end: float = 0.0
    samples: int = 0
    agree: int = 0
    exits: dict[int, int] = field(default_factory=dict)
    ramp_agree: dict[int, int] = field(default_factory=dict)
    ramp_seen: dict[int, int] = field(default_factory=dict)
    cap_agree: dict[int, int] = field(default_factory=dict)  # answered at this ramp at the latest
    keys: list[str] = field(default_factory=list)

    @property
    def agreement(self) -> float:
        return self.agree / self.samples if self.samples else 1.0

    @property
    def exit_rate(self) -> float:
        return sum(self.exits.values()) / self.samples if self.samples else 0.0

    def add(self, b: SampleBatch) -> None:
        n = len(b.final_pred)
        self.samples += n
        self.end = max(self.end, b.t)
        self.agree += int((b.answers() == b.final_pred).sum())
        for row, ramp in enumerate(b.ramp_ids):
            self.ramp_seen[ramp] = self.ramp_seen.get(ramp, 0) + n
            self.ramp_agree[ramp] = self.ramp_agree.get(ramp, 0) + int((b.ramp_pred[row] == b.final_pred).sum())
            self.exits[ramp] = self.exits.get(ramp, 0) + int((b.exit_at == ramp).sum())
        for ramp, agree in cap_agreement(b.ramp_ids, b.ramp_pred, b.exit_at,
                                         b.final_pred).items():
            self.cap_agree[ramp] = self.cap_agree.get(ramp, 0) + agree
        self.keys.append(b.key)

    def rows(self) -> list[dict]:
        """Exit-profile rows: one for the whole config (ramp -1), one per ramp seen; each
        with the agreement of a depth cap there (the whole config's: no cap)."""
        start = utc_datetime(self.start)
        end = utc_datetime(self.end)
        base = {"model": self.model, "config_version": self.config_version,
                "window_start": start, "window_end": end}
        rows = [dict(base, ramp=-1, samples=self.samples, exit_rate=self.exit_rate,
                     agreement=self.agreement, cap_agreement=self.agreement)]
        for ramp in sorted(self.ramp_seen):
            seen = self.ramp_seen[ramp]
            rows.append(dict(base, ramp=ramp, samples=seen, exit_rate=self.exits.get(ramp, 0) / seen,
                             agreement=self.ramp_agree[ramp] / seen,
                             cap_agreement=self.cap_agree[ramp] / seen))
        return rows


def utc_datetime(t: float) -> datetime:
    """Unix seconds as the naive UTC datetime the store keeps."""
    return datetime.fromtimestamp(t, tz=UTC).replace(tzinfo=None)


class WindowTracker:
    """Per-model windows; ``add`` returns the windows it closed."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.open: dict[str, ProfileWindow] = {}
        self.latest: dict[str, ProfileWindow] = {}

    def add(self, b: SampleBatch) -> list[ProfileWindow]:
        closed = []
        win = self.open.get(b.model)
        if win is not None and win.config_version != b.config_version:
            closed.append(self._close(b.model))   # a window measures one config only
            win = None
        if win is None:
            win = self.open[b.model] = ProfileWindow(b.model, b.config_version, b.key, b.t)
        win.add(b)
        if win.samples >= self.size:
            closed.append(self._close(b.model))
        return closed

    def flush(self) -> list[ProfileWindow]:
        """Close every partial window (the stream went idle)."""
        return [self._close(m) for m in list(self.open)]

    def _close(self, model: str) -> ProfileWindow:
        win = self.open.pop(model)
        self.latest[model] = win
        return win

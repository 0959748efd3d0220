"""The profiler's depth-cap role: keeps each early-exit model's depth-cap variants
(:mod:`services.exits.depth_caps`) in ``subnet_profiles`` as the stream goes on, so a
router serving them by variant (``OFFRAMP_ROUTER_POLICY``) decides on what the caps
really answer now.

Latency comes from the model's latency profile on this device class, as soon as the
latency role has measured it: the estimates written at registration come from the
preparing machine, often with other threads and an idle machine. Accuracy comes from the
monitor's feedback: the depth-cap agreement of the exit-profile windows of the model's
current exit config over the last ``horizon_s``; a cap with fewer than ``MIN_SAMPLES``
behind it keeps its held-out estimate. The rows replace the registration's estimates.
Synchronous: run it in a thread.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from services.exits.depth_caps import (
    SOURCE_MEASURED,
    SOURCE_PREPARED,
    cap_accuracy,
    cap_profile,
)

HORIZON_S = 120.0  # feedback this recent sets a cap's accuracy (thresholds move over time)
MIN_SAMPLES = 50   # fewer feedback samples at a cap than this: its estimate stands


class CapProfiler:
    def __init__(self, store: Any, log: Any, device: str, horizon_s: float = HORIZON_S) -> None:
        self.store = store
        self.log = log
        self.device = device
        self.horizon_s = horizon_s
        self.written: dict[str, tuple[int, tuple]] = {}  # model -> (config version, rows key)

    def poll(self, now: datetime) -> int:
        """Refresh every early-exit model's caps; returns how many models changed."""
        return sum(self.refresh(name, now) for name in self.store.model_names())

    def refresh(self, name: str, now: datetime) -> int:
        model = self.store.model(name)
        if model is None or model["manifest"].get("kind") == "supernet":
            return 0
        config = self.store.latest_exit_config(name)
        if config is None:
            return 0
        latency = self.store.latency_profile(name, self.device)
        if not latency:  # the latency role measures it first
            return 0
        since = now - timedelta(seconds=self.horizon_s)
        feedback = {ramp: agree for ramp, (n, agree) in
                    self.store.cap_agreements(name, config.version, since).items()
                    if n >= MIN_SAMPLES}
        rows = cap_profile(model["manifest"], latency, config.active,
                           cap_accuracy(model["manifest"], feedback))
        key = tuple((r["variant"], round(r["accuracy"], 4),
                     tuple(round(v, 3) for v in r["latency_ms"].values())) for r in rows)
        if not rows or self.written.get(name) == (config.version, key):
            return 0
        self.store.save_subnet_profiles(name, self.device, rows, SOURCE_MEASURED,
                                        replaces=(SOURCE_PREPARED,))
        self.written[name] = (config.version, key)
        self.log.info("depth caps profiled %s (%d measured by feedback) %s", name,
                      len(feedback), " ".join(
                          f"{r['variant']}={r['accuracy']:.4f}@{max(r['latency_ms'].values()):.1f}ms"
                          f"{'' if r['pareto'] else '(off)'}" for r in rows))
        return 1

"""Depth caps as variants in the store: estimated when a model is registered, measured
by the profiler from the monitor's windows and the latency profile, superseding the
estimates; the router reads them as a variant table."""

from __future__ import annotations

import logging
from datetime import timedelta

import pytest

from services.exits.depth_caps import SOURCE_MEASURED, SOURCE_PREPARED
from services.launcher.supervisor import register_prepared
from services.profiler.cap_profiles import MIN_SAMPLES, CapProfiler
from services.profiler.latency import from_manifest
from services.router.variant_table import VariantProfile
from services.runtime.manifest import Manifest
from services.store.db import utcnow

LOG = logging.getLogger("test")


def _window(version: int, end, caps: dict[int, float], samples: int) -> list[dict]:
    base = {"model": "tiny", "config_version": version, "window_start": end - timedelta(
        seconds=5), "window_end": end, "samples": samples, "exit_rate": 0.0}
    return [dict(base, ramp=r, agreement=a, cap_agreement=a) for r, a in caps.items()]


def test_registration_estimates_caps_of_the_active_ramps(store, tiny_dir) -> None:
    register_prepared(store, tiny_dir, 100.0)
    manifest = Manifest.load(tiny_dir)
    active = store.latest_exit_config("tiny").active
    rows = store.subnet_profiles("tiny", pareto=False)
    assert {r["variant"] for r in rows} == {f"depth<={r}" for r in active} | {"depth<=final"}
    assert {r["source"] for r in rows} == {SOURCE_PREPARED}
    by = {r["variant"]: r for r in rows}
    assert by["depth<=final"]["accuracy"] == 1.0
    for r in manifest.ramps:
        if r.index in active:
            assert by[f"depth<={r.index}"]["accuracy"] == r.agreement
    # deeper caps take longer at every batch size; the router can build a table of them
    final = by["depth<=final"]["latency_ms"]
    assert all(by[f"depth<={r}"]["latency_ms"][b] < final[b] for r in active for b in final)
    VariantProfile.from_table("depth<=final", 1.0, final)
    register_prepared(store, tiny_dir, 100.0)  # idempotent
    assert len(store.subnet_profiles("tiny", pareto=False)) == len(rows)


def test_the_profiler_replaces_estimates_with_measured_caps(store, tiny_dir) -> None:
    register_prepared(store, tiny_dir, 100.0)
    manifest = Manifest.load(tiny_dir)
    config = store.latest_exit_config("tiny")
    active = sorted(config.active)
    caps = CapProfiler(store, LOG, "cpu-test")
    now = utcnow()
    assert caps.poll(now) == 0  # no latency profile on this device yet: estimates stand
    # measured latency (here: twice the preparation's) replaces the estimates at once
    slow = [dict(r, ms=2 * r["ms"]) for r in from_manifest(manifest)]
    store.save_latency_profile("tiny", "cpu-test", slow, True)
    estimated = {r["variant"]: r for r in store.subnet_profiles("tiny", pareto=False)}
    assert caps.poll(now) == 1
    rows = {r["variant"]: r for r in store.subnet_profiles("tiny", pareto=False)}
    assert {r["source"] for r in rows.values()} == {SOURCE_MEASURED}
    assert {r["device"] for r in rows.values()} == {"cpu-test"}
    for k, r in rows.items():
        assert r["accuracy"] == estimated[k]["accuracy"]
        assert r["latency_ms"] == {b: pytest.approx(2 * ms)
                                   for b, ms in estimated[k]["latency_ms"].items()}
    assert caps.poll(now) == 0  # unchanged: not rewritten
    # too few feedback samples at a cap: its estimate stands
    store.add_exit_profiles(_window(config.version, now, {-1: 0.9, active[0]: 0.5},
                                    MIN_SAMPLES - 1))
    assert caps.poll(now) == 0
    store.add_exit_profiles(_window(config.version, now, {-1: 0.95, active[0]: 0.61},
                                    MIN_SAMPLES * 4))
    assert caps.poll(now) == 1
    rows = {r["variant"]: r for r in store.subnet_profiles("tiny", pareto=False)}
    # sample-weighted over the windows of the current config
    want = (0.5 * (MIN_SAMPLES - 1) + 0.61 * 4 * MIN_SAMPLES) / (5 * MIN_SAMPLES - 1)
    assert rows[f"depth<={active[0]}"]["accuracy"] == pytest.approx(want)
    assert rows["depth<=final"]["accuracy"] == pytest.approx(
        (0.9 * (MIN_SAMPLES - 1) + 0.95 * 4 * MIN_SAMPLES) / (5 * MIN_SAMPLES - 1))
    # windows of an older config, or older than the horizon, do not count
    assert store.cap_agreements("tiny", config.version + 1, now - timedelta(seconds=60)) == {}
    assert store.cap_agreements("tiny", config.version, now + timedelta(seconds=1)) == {}
    # a restarted stack keeps the measured caps rather than its estimates
    register_prepared(store, tiny_dir, 100.0)
    assert {r["source"] for r in store.subnet_profiles("tiny", pareto=False)} == {
        SOURCE_MEASURED}

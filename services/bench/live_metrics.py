"""What a live run of ``offramp bench apparate --live`` measured, from the client's
outcomes (no I/O): latency percentiles (end to end at the client, and serving: the
router's record of each request), agreement with the final model's answers, the worst
window, early exits, the oracle's latency in latency mode, one run's policy summaries and
their medians over repeated runs."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from services.common.stats import percentile
from services.loadgen.drive import Outcome, way_back_ms
from services.sim.replay import window_agreements


def run_summary(outcomes: Sequence[Outcome], reference: np.ndarray, window: int = 16
                ) -> dict[str, Any]:
    """p25/p50/p95 latency of the answered requests; agreement of their labels with
    ``reference`` (the final model's label per stream index, -1 where unknown: those
    requests are not counted), overall and over the worst ``window`` consecutive counted
    requests in stream order; the early-exit share and the exit configs seen. ``serving_*``:
    the same percentiles of the router's latencies (``Outcome.serving_ms``), where known."""
    ok = sorted((o for o in outcomes if o.ok), key=lambda o: o.index)
    lat = np.array([o.latency_ms for o in ok], np.float64)
    serving = np.array([o.serving_ms for o in ok if o.serving_ms is not None], np.float64)
    known = [o for o in ok if 0 <= o.index < reference.size and reference[o.index] >= 0]
    agree = np.array([o.label == reference[o.index] for o in known], np.float64)
    out: dict[str, Any] = {"requests": len(outcomes), "ok": len(ok),
                           "errors": len(outcomes) - len(ok)}
    if lat.size:
        p25, p50, p95 = np.percentile(lat, [25, 50, 95])
        out.update(p25_ms=float(p25), p50_ms=float(p50), p95_ms=float(p95),
                   mean_ms=float(lat.mean()))
    else:
        out.update(p25_ms=None, p50_ms=None, p95_ms=None, mean_ms=None)
    out.update(_percentiles(serving, "serving_"), serving_known=int(serving.size))
    out.update(hops(ok))
    out["agreement"] = float(agree.mean()) if agree.size else None
    out["worst_window_agreement"] = (float(window_agreements(agree, window).min())
                                     if agree.size else None)
    out["compared"] = int(agree.size)
    out["exit_rate"] = float(np.mean([o.early for o in ok])) if ok else None
    out["config_versions"] = sorted({o.config_version for o in ok})
    out["by_exit"] = by_exit(ok)
    return out


def by_exit(ok: Sequence[Outcome]) -> dict[str, dict[str, Any]]:
    """Answers grouped by where they came from (ramp index, "final"): how many, and their
    p50 / p75 latency end to end and served. Shows whether early answers are early: before
    runs gave way, EfficientNet's answers at ramp 3 had a p75 near the final answers' p50."""
    groups: dict[str, list[Outcome]] = {}
    for o in ok:
        groups.setdefault(str(o.exit) if o.early else "final", []).append(o)
    out: dict[str, dict[str, Any]] = {}
    for key in sorted(groups, key=lambda k: (k == "final", int(k) if k != "final" else 0)):
        g = groups[key]
        lat = np.array([o.latency_ms for o in g], np.float64)
        srv = np.array([o.serving_ms for o in g if o.serving_ms is not None], np.float64)
        out[key] = {"n": len(g), "p50_ms": percentile(lat, 50), "p75_ms": percentile(lat, 75),
                    "serving_p50_ms": percentile(srv, 50), "serving_p75_ms": percentile(srv, 75)}
    return out


def hops(ok: Sequence[Outcome]) -> dict[str, float | None]:
    """The client's two hops around the router's serving time (``drive.attach_hops``): the
    way in at p50 / p75 and the way back at p50. On a fast machine they weigh as much as the
    model, and they are what separates a served saving from the client's."""
    way_in = [o.way_in_ms for o in ok if o.way_in_ms is not None]
    way_back = [b for o in ok if (b := way_back_ms(o)) is not None]
    return {"way_in_p50_ms": percentile(way_in, 50), "way_in_p75_ms": percentile(way_in, 75),
            "way_back_p50_ms": percentile(way_back, 50)}


def _percentiles(ms: np.ndarray, prefix: str) -> dict[str, float | None]:
    return {f"{prefix}p{q}_ms": percentile(ms, q) for q in (25, 50, 95)}


def labels_by_index(outcomes: Sequence[Outcome], n: int) -> np.ndarray:
    """The label each stream index got (-1: no answer)."""
    out = np.full(n, -1, np.int64)
    for o in outcomes:
        if o.ok and 0 <= o.index < n:
            out[o.index] = o.label
    return out


def oracle_latency(vanilla: Sequence[Outcome], ramp_pred: np.ndarray, final_pred: np.ndarray,
                   prefix_ms: np.ndarray, serving: bool = False) -> np.ndarray:
    """Per answered vanilla request, in stream order: its live latency (``serving``: the
    router's, where known) minus the model time the oracle skips (each input answers at its
    earliest correct ramp, ramps free). In latency mode every input still runs to the end,
    so the worker's queue, and with it everything else in the request's latency, is the
    vanilla run's."""
    right = ramp_pred == final_pred
    first = np.where(right.any(axis=0), right.argmax(axis=0), -1)
    full = float(prefix_ms[-1])
    ok = sorted((o for o in vanilla if o.ok and 0 <= o.index < first.size
                 and (not serving or o.serving_ms is not None)), key=lambda o: o.index)
    saved = np.array([full - float(prefix_ms[first[o.index]]) if first[o.index] >= 0 else 0.0
                      for o in ok], np.float64)
    lat = np.array([o.serving_ms if serving else o.latency_ms for o in ok], np.float64)
    return np.maximum(lat - saved, 0.0)


def active_over_time(outcomes: Sequence[Outcome], active_by_version: dict[int, list[int]]
                     ) -> list[list[int]]:
    """[stream index, active ramps] at every change of the config the answers carried."""
    out: list[list[int]] = []
    last = None
    for o in sorted((o for o in outcomes if o.ok), key=lambda o: o.index):
        n = len(active_by_version.get(o.config_version, []))
        if n != last:
            out.append([o.index, n])
            last = n
    return out


REFIT = "offramp+refit"
ADAPTIVE = ("offramp", REFIT)  # the tuner's runs, without and with online ramp refits
POLICIES = ("vanilla", "static", "offramp", REFIT, "oracle")
SUMMED = ("p25_ms", "p50_ms", "p95_ms", "mean_ms", "serving_p25_ms", "serving_p50_ms",
          "serving_p95_ms", "way_in_p50_ms", "way_in_p75_ms", "way_back_p50_ms", "agreement",
          "worst_window_agreement", "exit_rate")  # what the median over repeats covers


def policy_docs(outcomes: dict[str, list], deployed: dict[str, Any], trace,
                static_t: float) -> dict[str, dict[str, Any]]:
    """One run's ``vanilla``, ``static``, ``offramp`` and ``oracle`` summaries."""
    ref = labels_by_index(outcomes["vanilla"], trace.n_samples)
    doc = {name: run_summary(outcomes[name], ref) for name in ("vanilla", "static", *ADAPTIVE)}
    doc["static"]["threshold"] = static_t
    doc["vanilla"]["agreement_with_in_process_model"] = float(
        np.mean(ref[ref >= 0] == trace.final_pred[ref >= 0])) if (ref >= 0).any() else None
    for name in ADAPTIVE:
        dep = deployed[name]
        doc[name].update(
            initial_active=dep["initial_active"], configs=len(dep["configs"]),
            active_ramps_over_time=active_over_time(outcomes[name], dep["active_by_version"]),
            timeline=dep["configs"], refits=dep.get("refits", []))
    lat = oracle_latency(outcomes["vanilla"], trace.ramp_pred, trace.final_pred, trace.prefix_ms)
    right = trace.ramp_pred == trace.final_pred
    serving = oracle_latency(outcomes["vanilla"], trace.ramp_pred, trace.final_pred,
                             trace.prefix_ms, serving=True)
    doc["oracle"] = {**_percentiles(lat, ""), **_percentiles(serving, "serving_"),
                     "mean_ms": float(lat.mean()) if lat.size else None, "agreement": 1.0,
                     "exit_rate": float(right.any(axis=0).mean()),
                     "source": "estimated: the vanilla run's latency minus the model time "
                               "skipped by exiting at the earliest correct ramp (ramps free)"}
    return doc


def median_of(values: list) -> float | None:
    """The median of the values that are not None (None when there are none)."""
    got = [v for v in values if v is not None]
    return float(np.median(got)) if got else None


def aggregate(runs: list[dict[str, dict[str, Any]]]) -> dict[str, Any]:
    """The policies over repeated runs: each figure the median over the runs (one run: that
    run), and per policy each run's p50 and p95 change against that run's vanilla."""
    out: dict[str, Any] = {}
    for name in POLICIES:
        first = runs[0][name]
        agg = dict(first) if len(runs) == 1 else {
            k: v for k, v in first.items() if k not in SUMMED and k not in
            ("requests", "ok", "errors", "compared", "config_versions", "timeline",
             "active_ramps_over_time", "configs", "by_exit", "refits")}  # per run: see ``runs``
        if len(runs) > 1:
            for k in SUMMED:
                if k in first:
                    agg[k] = median_of([r[name].get(k) for r in runs])
            for k in ("requests", "ok", "errors", "serving_known"):
                if k in first:
                    agg[k] = int(sum(r[name][k] for r in runs))
        for k in ("p50", "p95", "serving_p50", "serving_p95"):
            agg[f"{k}_change_by_run"] = [_rel(r[name].get(f"{k}_ms"), r["vanilla"].get(f"{k}_ms"))
                                         for r in runs]
        out[name] = agg
    return out


def _rel(v: float | None, base: float | None) -> float | None:
    return (v - base) / base if v is not None and base else None


def live_series(outcomes: dict[str, Sequence[Outcome]], configs: list[dict[str, Any]],
                n_sites: int, n: int, roll: int) -> tuple[dict[str, np.ndarray], np.ndarray,
                                                          np.ndarray]:
    """What the plot draws for one live run: per policy the rolling median (``roll``
    samples) of latency in stream order; offramp's thresholds per site and sample (NaN where
    the ramp was not active) and active-ramp count per sample, from the config each answer
    carried (``configs``: version, active, thresholds by ramp)."""
    rolled = {}
    for name, outs in outcomes.items():
        lat = np.array([o.latency_ms for o in sorted(outs, key=lambda o: o.index) if o.ok])
        if lat.size:
            k = min(roll, lat.size)
            rolled[name] = np.median(np.lib.stride_tricks.sliding_window_view(lat, k), axis=1)
    by_version = {int(c["version"]): c for c in configs}
    th = np.full((n_sites, n), np.nan)
    active = np.zeros(n)
    for o in outcomes.get(REFIT, outcomes.get("offramp", [])):
        c = by_version.get(o.config_version)
        if not o.ok or c is None or not 0 <= o.index < n:
            continue
        active[o.index] = len(c["active"])
        for r in c["active"]:
            if 0 <= int(r) < n_sites:
                th[int(r), o.index] = float(c["thresholds"].get(str(r), 0.0))
    return rolled, th, active

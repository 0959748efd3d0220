"""``offramp bench apparate``: the Apparate policies replayed on a recorded trace (``--live``:
run on the embedded stack instead, see ``services.bench.apparate_live``).

A replay simulation (not a live run): the trace holds every candidate ramp's top-1 and
score for each input of a stream (``offramp trace record``), and ``services.sim.replay``
serves it through one FIFO worker at batch size 1 under four policies (vanilla, static,
offramp, oracle). offramp is the very ``ExitController`` the live tuner runs. Prints a
table, writes JSON and optionally a plot (matplotlib if installed, else a plain SVG).
"""

from __future__ import annotations

import argparse
import json
import sys
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np

from services.bench import apparate_live
from services.bench.plot import ROLL, draw
from services.bench.report import machine
from services.common import config
from services.common.stats import percentile
from services.sim import head_ceiling
from services.sim.fixed_ceiling import OBJECTIVES, best_fixed, held_out
from services.sim.replay import (
    DECISION_DELAY_S,
    FEEDBACK_BACKLOG,
    HEAD_DELAY_S,
    MODE,
    POLICIES,
    REFIT,
    PolicyResult,
    arrivals_for,
    refit_plan,
    run_replay,
)
from services.sim.trace import Trace, TraceError
from services.tuner import climb_native
from services.tuner.controller import DEFAULT_TUNE_SHARE
from services.workloads.answer_changes import AnswerChanges, answer_changes
from services.workloads.arrivals import LIGHT_LOAD, light_load


def report(results: dict[str, Any], trace_path: str, meta: dict[str, Any],
           arrivals: str, params: dict[str, Any]) -> dict[str, Any]:
    """The JSON document: one summary per policy plus offramp's controller statistics."""
    out: dict[str, Any] = {"mode": MODE, "trace": trace_path, "trace_meta": meta,
                           "arrivals": arrivals, **params}
    for name in POLICIES:
        if name in results:
            res: PolicyResult = results[name]
            out[name] = res.summary()
            if name == "static":
                out[name]["threshold"] = res.extra["threshold"]
    off = results.get("offramp")
    if off is not None:
        wall, dec = off.extra["wall_ms"], off.extra["decisions"]
        grid = off.extra.get("grid", {})
        out.update({
            "tuning_ms_p50": percentile(wall["tune"], 50), "tuning_ms_p95": percentile(wall["tune"], 95),
            "adjust_ms_p50": percentile(wall["adjust"], 50), "adjust_ms_p95": percentile(wall["adjust"], 95),
            "record_ms_p50": percentile(wall["record"], 50),
            "timing_passes": off.extra.get("timing_passes", 1),
            "grid_gap": grid.get("grid_gap"), "grid": grid,
            "counts": off.extra["counts"], "tunes": len(wall["tune"]),
            "adjusts": len(wall["adjust"]),
            "active_ramps_mean": float(off.extra["n_active"].mean()),
            "offramp_timeline": [d for d in dec if d["changed"]],
        })
    refit = results.get(REFIT)
    if refit is not None:
        out["refit"] = refit_summary(refit)
    out["machine"] = machine()
    return out


def segments(results: dict[str, PolicyResult], final: np.ndarray, k: int
             ) -> dict[str, list[dict[str, Any]]]:
    """Each policy against vanilla over ``k`` consecutive equal parts of the stream: how its
    savings change as it learns (a cold start, a drifting stream)."""
    n, van = len(final), results["vanilla"].latency_ms
    edges = np.linspace(0, n, k + 1).astype(int)
    out: dict[str, list[dict[str, Any]]] = {}
    for name, res in results.items():
        if name == "vanilla" or not isinstance(res, PolicyResult):
            continue
        out[name] = [{"from": int(a), "to": int(b),
                      "p50_change": float(np.median(res.latency_ms[a:b]) / np.median(van[a:b]) - 1),
                      "mean_change": float(res.latency_ms[a:b].mean() / van[a:b].mean() - 1),
                      "agreement": float((res.answer[a:b] == final[a:b]).mean()),
                      "exit_rate": float((res.exit_site[a:b] >= 0).mean())}
                     for a, b in pairwise(edges) if b > a]
    return out


def segments_table(doc: dict[str, Any]) -> list[str]:
    lines = []
    for name, parts in doc.get("segments", {}).items():
        lines.append(f"{name} by part of the stream (vs vanilla): " + "; ".join(
            f"{p['from']}-{p['to']}: p50 {p['p50_change']:+.1%}, mean {p['mean_change']:+.1%}, "
            f"agreement {p['agreement']:.2%}" for p in parts))
    return lines


def add_views(doc: dict[str, Any], args: argparse.Namespace, results: dict[str, Any],
              trace: Trace) -> None:
    """The optional views of a replay: per part of the stream, and the fixed-config ceiling."""
    if getattr(args, "segments", 1) > 1 and "vanilla" in results:
        doc["segments"] = segments(results, trace.final_pred, args.segments)
    if getattr(args, "ceiling", False):
        print("searching the best fixed configs in hindsight ...", file=sys.stderr, flush=True)
        doc["ceiling"] = ceilings(trace, args.constraint, args.budget)
        if trace.features is not None:
            print("refitting every head in hindsight ...", file=sys.stderr, flush=True)
            doc["learned_ceiling"] = learned_ceilings(trace, args.constraint, args.budget)


def ceilings(trace: Trace, constraint: float, budget: float) -> dict[str, dict]:
    """The best fixed configs in hindsight (``sim/fixed_ceiling.py``): median- and
    mean-optimal, at the constraint and at the share of it the live tuner aims for. Each
    carries ``held_out``: the same search on the first half of the trace, judged on the
    second."""
    trained = trace.meta.get("trained") or [True] * trace.n_sites  # --no-bootstrap: untrained
    sites = tuple(s for s in range(trace.n_sites) if trained[s])
    window, half = trace.window(sites), trace.n_samples // 2
    halves = (trace.window(sites, 0, half), trace.window(sites, half)) if half else None
    profile = trace.profile()
    out = {}
    for label, c in (("constraint", constraint), ("headroom", DEFAULT_TUNE_SHARE * constraint)):
        for objective in OBJECTIVES:
            best = best_fixed(window, profile, c, budget, objective).as_dict()
            if halves is not None:  # a one-sample trace has no first half
                best["held_out"] = held_out(*halves, profile, c, budget, objective).as_dict()
            out[f"{objective}@{label}"] = best
    return out


def learned_ceilings(trace: Trace, constraint: float, budget: float) -> dict[str, dict]:
    """The best fixed configs over heads refitted in hindsight (``sim/head_ceiling.py``):
    by an ideal online learner (``causal``) and cross-fitted on both sides (``crossfit``),
    each with its heads' agreement per site."""
    out = {}
    for name, refitted in (("causal", head_ceiling.causal(trace)),
                           ("crossfit", head_ceiling.crossfit(trace))):
        window, profile = refitted.window(tuple(range(refitted.n_sites))), refitted.profile()
        out[name] = {"agreement_by_site": refitted.agreement_by_site(),
                     **{f"{o}@constraint": best_fixed(window, profile, constraint, budget,
                                                      o).as_dict() for o in OBJECTIVES}}
    out["causal"]["learner"] = {"window": head_ceiling.WINDOW, "delay": head_ceiling.DELAY,
                                "every": head_ceiling.EVERY}
    out["crossfit"]["block"] = head_ceiling.BLOCK
    return out


def learned_ceiling_table(doc: dict[str, Any]) -> list[str]:
    if "learned_ceiling" not in doc:
        return []
    lc = doc["learned_ceiling"]
    c, x = lc["causal"]["learner"], lc["crossfit"]["block"]
    lines = [("the same over heads refitted in hindsight: causal = an ideal online learner "
              f"(every label {c['delay']} samples late, a refit every {c['every']} on the newest "
              f"{c['window']}, free); crossfit = heads that learned the {x}-sample blocks on "
              "both sides of each sample's:")]
    for name in ("causal", "crossfit"):
        agree = " ".join(f"{a:.2f}" for a in lc[name]["agreement_by_site"])
        lines.append(f"  {name:<9} agreement per site {agree}")
        for objective in OBJECTIVES:
            b = lc[name][f"{objective}@constraint"]
            lines.append(f"  {'':<9} {objective + '-optimal':<13} at {b['constraint']:.2%}: "
                         f"active {list(b['active'])}, p50 {b['p50_change']:+.1%}, mean "
                         f"{b['mean_change']:+.1%}, agreement {b['agreement']:.4f}, exits "
                         f"{b['exit_rate']:.2f}")
    return lines


def ceiling_table(doc: dict[str, Any]) -> list[str]:
    if "ceiling" not in doc:
        return []
    lines = [("best fixed config in hindsight (the whole trace; model time of one sample, no "
              "queueing; change vs the full model alone); held out: chosen on the first half, "
              "served on the second:")]
    for key, c in doc["ceiling"].items():
        objective, label = key.split("@")
        lines.append(f"  {objective + '-optimal':<13} at {c['constraint']:.2%} ({label}): active "
                     f"{list(c['active'])}, p50 {c['p50_change']:+.1%}, mean "
                     f"{c['mean_change']:+.1%}, agreement {c['agreement']:.4f}, exits "
                     f"{c['exit_rate']:.2f}")
        if h := c.get("held_out"):
            lines.append(f"  {'':<13}    held out: active {list(h['active'])}, p50 "
                         f"{h['p50_change']:+.1%}, mean {h['mean_change']:+.1%}, agreement "
                         f"{h['agreement']:.4f}, exits {h['exit_rate']:.2f}")
    return lines


def refit_summary(res: PolicyResult) -> dict[str, Any]:
    """What the online refits did: rounds judged, heads deployed per site, their cost."""
    rounds = [e for e in res.extra["refits"] if "accepted" in e]
    deployed = [e for e in res.extra["refits"] if "deployed_version" in e]
    return {"rounds": len(rounds), "accepted": sum(e["accepted"] for e in rounds),
            "deployed": [{"sample": e["sample"], "site": e["site"],
                          "version": e["deployed_version"]} for e in deployed],
            "head_versions": res.extra["head_versions"],
            "refit_ms_p50": percentile(res.extra["refit_ms"], 50),
            "refit_ms_max": max(res.extra["refit_ms"], default=None),
            "counts": res.extra["counts"],
            "feature_ms": res.extra["feature_ms"], "sampled": res.extra["sampled"],
            "timeline": [d for d in res.extra["decisions"] if d["changed"]]}


def table(doc: dict[str, Any]) -> str:
    n = doc["trace_meta"].get("n_samples", "?")
    lines = [(f"offramp bench apparate: {MODE} of {doc['trace']} ({n} samples; arrivals "
             f"{doc['arrivals']}; one worker, FIFO, batch 1, feedback backlog "
             f"{doc.get('feedback_backlog', 0)}; decisions reach it "
             f"{doc.get('decision_delay_ms', 0):g} ms late, refitted heads "
             f"{doc.get('head_delay_ms', 0):g} ms; constraint {doc['constraint']:.1%})"),
             (f"{'policy':<13} {'p25 ms':>7} {'p50 ms':>7} {'p95 ms':>7} {'mean ms':>7} "
             f"{'agreement':>9} {'worst win':>9} {'exits':>6}")]
    for name in POLICIES:
        s = doc.get(name)
        if s is not None:
            lines.append(f"{name:<13} {s['p25_ms']:>7.2f} {s['p50_ms']:>7.2f} {s['p95_ms']:>7.2f} "
                         f"{s['mean_ms']:>7.2f} {s['agreement']:>9.4f} "
                         f"{s['worst_window_agreement']:>9.3f} {s['exit_rate']:>6.2f}")
    for name in ("offramp", REFIT):
        if "vanilla" in doc and name in doc:
            v, o = doc["vanilla"], doc[name]
            lines.append(f"{name} vs vanilla: p25 {o['p25_ms'] / v['p25_ms'] - 1:+.1%}, p50 "
                         f"{o['p50_ms'] / v['p50_ms'] - 1:+.1%}, p95 "
                         f"{o['p95_ms'] / v['p95_ms'] - 1:+.1%}, mean "
                         f"{o['mean_ms'] / v['mean_ms'] - 1:+.1%}")
    if (ch := doc.get("answer_changes")) is not None:
        lines.append(f"stream: {AnswerChanges.from_dict(ch).describe()}")
    if "refit" in doc:
        r = doc["refit"]
        ms = "n/a" if r["refit_ms_p50"] is None else \
            f"{r['refit_ms_p50']:.1f} ms p50, {r['refit_ms_max']:.1f} ms max"
        lines.append(f"{REFIT}: {r['accepted']} of {r['rounds']} ramp refits accepted, head "
                     f"versions per site {r['head_versions']}; a refit costs {ms}; "
                     f"{r['counts'].get('guard_caps', 0)} exit-guard caps")
        fed = (f"{r['sampled']} samples fed features back, each run paying "
               f"{r['feature_ms']:.3f} ms more for them (the trace's feature_share)")
        lines.append(f"{REFIT}: {fed}" if r["feature_ms"] > 0 else
                     f"{REFIT}: {r['sampled']} samples fed features back; their cost is not "
                     "charged (the trace has no feature_share: record it again)")
    lines += segments_table(doc)
    lines += ceiling_table(doc)
    lines += learned_ceiling_table(doc)
    if "static" in doc:
        lines.append(f"static: one threshold {doc['static']['threshold']:.4f} for all ramps, "
                     "tuned on the first 10% of the stream")
    if "tuning_ms_p50" in doc:
        c, g = doc["counts"], doc.get("grid") or {}
        def fmt(x: float | None) -> str:
            return "n/a" if x is None else f"{x:.3f}"

        gap = "n/a" if g.get("grid_gap") is None else (
            f"{g['grid_gap']:+.1%} over {g['rounds']} tune rounds (median "
            f"{g['grid_gap_median']:+.1%}, worst {g['grid_gap_max']:+.1%}; <= {g['max_ramps']} "
            "ramps, grid step 0.01-0.05)")
        lines.append(f"offramp controller: {doc['tunes']} tunes ({c['alerts']} alerts), "
                     f"{doc['adjusts']} adjust rounds, {c['changes']} config changes, "
                     f"{c.get('guard_caps', 0)} exit-guard caps, "
                     f"{doc['active_ramps_mean']:.2f} active ramps on average")
        lines.append(f"  wall time per call (fastest of {doc.get('timing_passes', 1)} identical "
                     f"passes): tuning p50 {fmt(doc['tuning_ms_p50'])} ms, "
                     f"adjust p50 {fmt(doc['adjust_ms_p50'])} ms ({doc.get('climb', 'python')} "
                     f"climb); grid gap {gap}")
    return "\n".join(lines)


def _series(results: dict[str, PolicyResult], n_sites: int
            ) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
    """(rolling medians per policy, offramp thresholds S x N with NaN where inactive, active
    count per sample)."""
    roll = {}
    for name, r in results.items():
        lat = r.latency_ms
        k = min(ROLL, lat.size)
        roll[name] = np.median(np.lib.stride_tricks.sliding_window_view(lat, k), axis=1)
    off = results.get("offramp")
    if off is None:
        return roll, np.zeros((0, 0)), np.zeros(0)
    n = off.latency_ms.size
    th = np.full((n_sites, n), np.nan)
    cur: dict[int, float] = {}
    at = 0
    for d in off.extra["decisions"]:
        if not d["changed"]:
            continue
        stop = min(n, d["sample"] + 1)
        for s, t in cur.items():
            th[s, at:stop] = t
        cur, at = dict(zip(d["active"], d["thresholds"])), stop
    for s, t in cur.items():
        th[s, at:] = t
    return roll, th, off.extra["n_active"]


def plot(results: dict[str, PolicyResult], n_sites: int, path: Path) -> Path:
    roll, th, active = _series(results, n_sites)
    return draw(roll, th, active, path, MODE)


def _bad_args(args: argparse.Namespace) -> str | None:
    """What is wrong with the options, if anything (the replay and live benches share them)."""
    if (getattr(args, "feedback_backlog", None) or 0) < 0:
        return "--feedback-backlog must be >= 0"
    if getattr(args, "segments", 1) < 1:
        return "--segments must be >= 1"
    delays = {f"--{k.replace('_', '-')}": getattr(args, k) for k in ("delay_ms", "head_delay_ms")
              if getattr(args, k, None) is not None}
    for flag, ms in delays.items():
        if not ms >= 0:
            return f"{flag} must be >= 0"
    if getattr(args, "live", False):
        if delays:
            return (f"{next(iter(delays))} sets a delay of the replay; live decisions take "
                    "the time they take")
        if getattr(args, "trace", None):
            return "bench apparate takes --trace FILE (replay) or --live (not both)"
    elif not getattr(args, "trace", None):
        return "bench apparate needs --trace FILE (replay) or --live --model M --workload W"
    return None


def delays_ms(args: argparse.Namespace) -> tuple[float, float]:
    """How late decisions and refitted heads reach the worker in the replay (ms)."""
    delay, head = getattr(args, "delay_ms", None), getattr(args, "head_delay_ms", None)
    return (DECISION_DELAY_S * 1e3 if delay is None else delay,
            HEAD_DELAY_S * 1e3 if head is None else head)


def run(args: argparse.Namespace) -> int:
    if (bad := _bad_args(args)) is not None:
        print(f"error: {bad}", file=sys.stderr)
        return 2
    if getattr(args, "live", False):
        args.requests = 2000 if getattr(args, "requests", None) is None else args.requests
        args.model = getattr(args, "model", None) or "efficientnet-lite0"
        return apparate_live.run(args)
    try:
        trace = Trace.load(args.trace)
        if args.arrivals is None and trace.arrival_s is None:
            args.arrivals = light_load(float(trace.prefix_ms[-1]))
            print(f"the trace has no arrival_s: replaying light load {args.arrivals} "
                  f"({LIGHT_LOAD:.0%} of the full model's capacity; --arrivals to choose)",
                  file=sys.stderr)
        arrivals = arrivals_for(trace, args.arrivals, args.seed)
    except (TraceError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    ctl = {k: v for k, v in (("tune_window", args.tune_window),
                             ("slack_windows", args.slack_windows)) if v is not None}
    cfg = config.load()
    native = cfg.tuner_native
    backlog = FEEDBACK_BACKLOG if args.feedback_backlog is None else args.feedback_backlog
    delay_ms, head_ms = delays_ms(args)
    print(f"replaying {trace.n_samples} samples x {trace.n_sites} ramps, decisions reaching "
          f"the worker {delay_ms:g} ms late ...", file=sys.stderr, flush=True)
    results = run_replay(trace, arrivals, constraint=args.constraint, budget=args.budget,
                         delay_s=delay_ms / 1e3, head_delay_s=head_ms / 1e3,
                         grid_rounds=args.grid_rounds,
                         controller=ctl, feedback_backlog=backlog,
                         climb=climb_native.best_climb(native),  # as the live tuner climbs
                         refit=refit_plan(trace, cfg.ramp_feature_rate, cfg.ramp_feature_boost),
                         exit_guard=cfg.exit_guard)  # OFFRAMP_EXIT_GUARD, as live
    meta = {**trace.meta, "n_samples": trace.n_samples, "n_sites": trace.n_sites,
            "full_ms": float(trace.prefix_ms[-1])}
    params = {"constraint": args.constraint, "budget": args.budget,
              "decision_delay_ms": delay_ms, "head_delay_ms": head_ms,
              "worker": "single, FIFO, batch size 1",
              "feedback_backlog": backlog, "climb": climb_native.engine(native),
              "controller": results["offramp"].extra["params"], "exit_guard": cfg.exit_guard}
    doc = report(results, str(args.trace), meta, args.arrivals or "trace arrival_s", params)
    doc["answer_changes"] = answer_changes(trace.final_pred).to_dict()  # as the live bench's
    add_views(doc, args, results, trace)
    print(table(doc))
    Path(args.json).write_text(json.dumps(doc, indent=1, default=float) + "\n")
    if getattr(args, "plot", None):
        try:
            print(f"plot: {plot(results, trace.n_sites, Path(args.plot))}", file=sys.stderr)
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    return 0

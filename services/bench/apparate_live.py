"""``offramp bench apparate --live --model M --workload W``: the Apparate policies live.

The embedded stack (router, worker, monitor; NATS; the store) serves the same stream at the
same arrival times three times: vanilla (no ramps), static early exits (every ramp active,
one threshold tuned once on the first 10 % of the stream, BranchyNet/DeeBERT style) and
offramp (the initial deployment within the ramp budget, the tuner adapting it live). The
main latency is the client's, end to end; the serving latency beside it is the router's
record of the same request (from receiving it to learning its answer, queueing included:
the paper's "per-request response latency"), joined by request id from the store.
Agreement compares each answer with the label the vanilla run gave the same input (the
final model as served).

Two columns are not live runs, and the output says so: the oracle (each input answers at
its earliest correct ramp, ramps free) is the vanilla run's latency minus the model time it
skips (a close estimate in latency mode: every input still runs to the end, so the queue
is the vanilla run's); and the tuner's per-round wall times and grid gap come
from replaying the same stream (``offramp trace record`` of these inputs, run in process
first: it also gives the static threshold and the oracle's exits) through the same
controller code.

The three policies run one after another, so the machine's drift lands in the comparison:
``--repeat K`` runs the whole sequence K times and reports medians (``live_metrics.aggregate``).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from services.bench.live_metrics import (
    ADAPTIVE,
    REFIT,
    aggregate,
    live_series,
    median_of,
    policy_docs,
)
from services.bench.plot import ROLL, draw
from services.bench.report import machine
from services.common import config as config_mod
from services.common.stats import percentile
from services.exits.latency_profile import LatencyProfile
from services.launcher.exit_config import set_exit_config
from services.launcher.supervisor import prepare_state
from services.loadgen.live import adaptive_run, running_stack, stream_live
from services.runtime.manifest import Manifest
from services.sim.replay import refit_plan, run_replay
from services.sim.trace import Trace, TraceError, record_trace
from services.sim.workload_inputs import workload_chunks
from services.store.repository import Store
from services.tuner.climb_native import best_climb
from services.tuner.climb_native import engine as climb_engine
from services.workloads.answer_changes import AnswerChanges, answer_changes
from services.workloads.arrivals import light_load, stream_arrivals


def run(args: argparse.Namespace) -> int:
    say = lambda m: print(m, file=sys.stderr, flush=True)
    bad = _bad_args(args)
    if bad:
        print(f"error: {bad}", file=sys.stderr)
        return 2
    # the tuner and the initial deployment take the budget, the workers the backlog
    cfg = replace(config_mod.load(), models=(args.model,), ramp_budget=args.budget)
    if getattr(args, "feedback_backlog", None) is not None:  # checked by apparate.run
        cfg = replace(cfg, feedback_backlog=args.feedback_backlog)
    try:
        prepare_state(cfg, say=say)
        manifest, inputs, trace, arrival_s, spec = _record_stream(cfg, args, say)
    except (ValueError, TraceError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    replay = _replay(trace, arrival_s, args, cfg)
    static_t = replay["static"].extra["threshold"]
    ids = [int(i) for i in trace.meta["ramp_ids"]]

    runs = []
    for k in range(args.repeat):
        if args.repeat > 1:
            say(f"run {k + 1} of {args.repeat}")
        outcomes, deployed = _live_runs(cfg, args.model, manifest, inputs, arrival_s,
                                        static_t, ids, say)
        runs.append(policy_docs(outcomes, deployed, trace, static_t))
    doc = report(runs, trace, replay, args, spec)
    doc["feedback_backlog"] = cfg.feedback_backlog
    doc["machine"] = machine()
    print(table(doc))
    Path(args.json).write_text(json.dumps(doc, indent=1, default=float) + "\n")
    if getattr(args, "plot", None):
        try:
            say(f"plot: {_plot(outcomes, deployed, trace, args)}")
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    return 0 if all(doc[k]["errors"] == 0 for k in ("vanilla", "static", *ADAPTIVE)) else 1


def _bad_args(args: argparse.Namespace) -> str | None:
    """What is wrong with the live bench's flags, before anything starts."""
    if not args.workload:
        return "bench apparate --live needs --workload video|text (and --model M)"
    if args.requests <= 0 or args.repeat <= 0:
        return "--requests and --repeat must be positive"
    if getattr(args, "plot", None) and Path(args.plot).suffix.lower() != ".svg" \
            and importlib.util.find_spec("matplotlib") is None:
        return f"{Path(args.plot).suffix} plots need matplotlib (not installed): use .svg"
    return None


def _record_stream(cfg: config_mod.Config, args: argparse.Namespace, say
                   ) -> tuple[Manifest, list[dict[str, np.ndarray]], Trace, np.ndarray, str]:
    """The stream's inputs and arrivals, and its trace recorded in process with every ramp
    active (the replay's input: static's threshold, the oracle, the tuner's timings)."""
    n = args.requests
    manifest = Manifest.load(cfg.models_dir / args.model)
    chunks, about = workload_chunks(manifest, args.workload, n, args.seed, args.scene_frames)
    blocks = list(chunks)
    spec = args.arrivals or light_load(_full_ms(manifest))
    arrival_s = stream_arrivals(spec, n, args.seed)
    say(f"recording the stream's trace in process ({n} samples, every ramp active) ...")
    trace = record_trace(cfg.models_dir / args.model, iter(blocks), arrivals=arrival_s,
                         total=n, meta={**about, "seed": args.seed, "arrivals": spec},
                         progress=say, features=True)
    inputs = [{k: v[i] for k, v in b.items()}
              for b in blocks for i in range(len(next(iter(b.values()))))]
    return manifest, inputs, trace, arrival_s, spec


def _plot(outcomes: dict[str, list], deployed: dict[str, Any], trace,
          args: argparse.Namespace) -> Path:
    """The last run's latency, thresholds and active ramps over the stream."""
    roll, th, active = live_series(outcomes, deployed[REFIT]["configs"], trace.n_sites,
                                   trace.n_samples, ROLL)
    title = "live" if args.repeat == 1 else f"live, the last of {args.repeat} runs"
    return draw(roll, th, active, Path(args.plot), title)


def _full_ms(manifest) -> float:
    return LatencyProfile.from_manifest(manifest).full_ms


def _replay(trace, arrival_s: np.ndarray, args: argparse.Namespace, cfg: config_mod.Config
            ) -> dict:
    """Static's threshold and the tuner's timings, replayed like the workers serve."""
    ctl = {k: v for k, v in (("tune_window", args.tune_window),
                             ("slack_windows", args.slack_windows)) if v is not None}
    return run_replay(trace, arrival_s, constraint=args.constraint, budget=args.budget,
                      grid_rounds=args.grid_rounds, controller=ctl,
                      policies=("static", "offramp", REFIT),
                      feedback_backlog=cfg.feedback_backlog, climb=best_climb(),
                      refit=refit_plan(trace, cfg.ramp_feature_rate, cfg.ramp_feature_boost))


def _live_runs(cfg, model: str, manifest, inputs: list, arrival_s: np.ndarray,
               static_t: float, ids: list[int], say) -> tuple[dict[str, list], dict[str, Any]]:
    """vanilla, static and offramp one after the other on a stack whose workers publish no
    ramp features, then offramp+refit on one whose workers do; every ramp on its prepared
    head until a refit replaces it."""
    prepared = [f"{r}=0" for r in ids]
    out: dict[str, list] = {}
    deployed = {}
    with running_stack(cfg, model, say, features=False) as (sup, url):
        def run(label: str) -> list:
            return asyncio.run(stream_live(cfg, url, model, inputs, arrival_s, label))[1]

        set_exit_config(cfg, url, model, 0.0, [], "none", "bench apparate --live: vanilla",
                        prepared)
        out["vanilla"] = run("vanilla")
        set_exit_config(cfg, url, model, static_t, [], ",".join(map(str, ids)),
                        f"bench apparate --live: static, every ramp at {static_t:.4g} "
                        "(tuned once on the first 10 % of the stream)", prepared)
        out["static"] = run("static")
        out["offramp"], deployed["offramp"] = _adaptive(cfg, sup, url, manifest, inputs,
                                                        arrival_s, "offramp", say)
    with running_stack(cfg, model, say, features=True) as (sup, url):
        out[REFIT], deployed[REFIT] = _adaptive(cfg, sup, url, manifest, inputs, arrival_s,
                                                REFIT, say)
    return out, deployed


def _adaptive(cfg, sup, url: str, manifest, inputs: list, arrival_s: np.ndarray, name: str,
              say) -> tuple[list, dict[str, Any]]:
    """One run of the tuner's loop (``offramp+refit``: refitting ramp heads too) and what it
    deployed: configs, and the head versions refits stored."""
    model = manifest.name
    with Store(cfg.database_url) as store:
        before = store.latest_exit_config(model)
        heads_before = {(h["ramp"], h["version"]) for h in store.ramp_heads(model)}
    _, outcomes, active = adaptive_run(cfg, sup, url, manifest, inputs, arrival_s, "bench",
                                       refit=name == REFIT, label=name)
    with Store(cfg.database_url) as store:
        rows = store.exit_configs(model, before.version if before else 0)
        refits = [{"ramp": h["ramp"], "version": h["version"], "trained_on": h["trained_on"],
                   "serving_agreement": h["serving_agreement"], "agreement": h["agreement"]}
                  for h in store.ramp_heads(model) if (h["ramp"], h["version"]) not in heads_before]
    say(f"{name}: initial deployment {active or 'none'}; {len(rows)} configs, "
        f"{len(refits)} refitted heads deployed")
    return outcomes, {"initial_active": active, "refits": refits,
                      "active_by_version": {r.version: list(r.active) for r in rows},
                      "configs": [{"version": r.version, "active": list(r.active),
                                   "thresholds": {str(k): v for k, v in r.thresholds.items()
                                                  if k in r.active},
                                   "heads": {str(k): v for k, v in r.heads.items()},
                                   "reason": r.reason} for r in rows]}


def report(runs: list[dict[str, dict[str, Any]]], trace, replay: dict,
           args: argparse.Namespace, arrivals: str) -> dict[str, Any]:
    """The JSON document (see the module docstring for what is live and what is not)."""
    doc: dict[str, Any] = {
        "mode": "live", "model": args.model, "workload": trace.meta.get("workload"),
        "scene_frames": trace.meta.get("scene_frames"), "requests": trace.n_samples,
        "arrivals": arrivals, "constraint": args.constraint, "budget": args.budget,
        "repeats": len(runs),
        "aggregate": "one run" if len(runs) == 1 else
                     f"median over {len(runs)} runs of the whole sequence",
        "agreement_reference": "the vanilla run's label for the same input",
        **aggregate(runs),
    }
    if len(runs) > 1:
        doc["runs"] = runs
    off = replay["offramp"]
    wall = off.extra["wall_ms"]
    refit_ms = replay[REFIT].extra.get("refit_ms", []) if REFIT in replay else []
    doc.update({
        "tuning_ms_p50": percentile(wall["tune"], 50), "adjust_ms_p50": percentile(wall["adjust"], 50),
        "climb": climb_engine(),
        "refit_ms_p50": percentile(refit_ms, 50), "refit_ms_max": max(refit_ms, default=None),
        "grid_gap": off.extra.get("grid", {}).get("grid_gap"),
        "timing_passes": off.extra.get("timing_passes", 1),
        "tuning_source": "replay of the same stream through the same controller code "
                         "(wall time per call on this machine, the fastest of "
                         f"{off.extra.get('timing_passes', 1)} identical replays)",
        "replay": {k: v.summary() for k, v in replay.items() if hasattr(v, "summary")},
        "trace_meta": {k: v for k, v in trace.meta.items() if k != "ramp_ids"},
        "answer_changes": answer_changes(trace.final_pred).to_dict(),
    })
    return doc


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.2f}%"


def _change(xs: list) -> str:
    m = median_of(xs)
    return "" if m is None else f"{100 * m:+.1f}%"


def _latency_rows(doc: dict[str, Any]) -> list[str]:
    """End-to-end latency per policy, then the router's serving latency of the same requests."""
    lines = [(f"  {'policy':<13} {'p25 ms':>8} {'p50 ms':>8} {'p95 ms':>8} {'p50 vs van':>10} "
              f"{'p95 vs van':>10} {'agreement':>9} {'worst 16':>9} {'exits':>7}")]
    for name in ("vanilla", "static", *ADAPTIVE, "oracle"):
        r = doc[name]
        lines.append(f"  {name:<13} {_ms(r['p25_ms']):>8} {_ms(r['p50_ms']):>8} "
                     f"{_ms(r['p95_ms']):>8} {_change(r['p50_change_by_run']):>10} "
                     f"{_change(r['p95_change_by_run']):>10} {_pct(r['agreement']):>9} "
                     f"{_pct(r.get('worst_window_agreement')):>9} {_pct(r.get('exit_rate')):>7}")
    lines.append("  serving latency (the router's record of each request: from receiving it "
                 "to learning its answer, queueing included; the client's two hops excluded)")
    lines.append(f"  {'policy':<13} {'p25 ms':>8} {'p50 ms':>8} {'p95 ms':>8} {'p50 vs van':>10} "
                 f"{'p95 vs van':>10} {'known':>9}")
    for name in ("vanilla", "static", *ADAPTIVE, "oracle"):
        r = doc[name]
        known = r.get("serving_known")
        lines.append(f"  {name:<13} {_ms(r.get('serving_p25_ms')):>8} "
                     f"{_ms(r.get('serving_p50_ms')):>8} {_ms(r.get('serving_p95_ms')):>8} "
                     f"{_change(r.get('serving_p50_change_by_run', [])):>10} "
                     f"{_change(r.get('serving_p95_change_by_run', [])):>10} "
                     f"{'-' if known is None else known:>9}")
    lines.append("  the client's hops (its send to the router's receipt, and from the router "
                 "learning the answer to the client holding it; one host's clock)")
    lines.append(f"  {'policy':<13} {'in p50':>8} {'in p75':>8} {'back p50':>8}")
    for name in ("vanilla", "static", *ADAPTIVE):
        r = doc[name]
        lines.append(f"  {name:<13} {_ms(r.get('way_in_p50_ms')):>8} "
                     f"{_ms(r.get('way_in_p75_ms')):>8} {_ms(r.get('way_back_p50_ms')):>8}")
    return lines


def _offramp_rows(doc: dict[str, Any]) -> list[str]:
    """Run-by-run changes, what the loop deployed, where its answers came from, its timings."""
    lines = []
    if doc["repeats"] > 1:
        for name in ("static", *ADAPTIVE, "oracle"):
            per = ", ".join(f"{100 * a:+.1f}/{100 * b:+.1f}%" for a, b in zip(
                doc[name]["p50_change_by_run"], doc[name]["p95_change_by_run"], strict=True)
                if a is not None and b is not None)
            lines.append(f"  {name} p50/p95 vs vanilla, run by run: {per}")
    runs = doc.get("runs") or [{name: doc[name] for name in ADAPTIVE}]
    lines.append(f"  static: every ramp at threshold {doc['static']['threshold']:.4g}")
    for name in ADAPTIVE:
        o = runs[-1][name]
        lines.append(f"  {name}: initial ramps {o['initial_active'] or 'none'}, configs per run "
                     f"{[r[name]['configs'] for r in runs]}, active ramps over time (last run) "
                     f"{o['active_ramps_over_time']}")
        if o.get("by_exit"):
            lines.append(f"  {name} answers by where they came from (last run; n, p50 / p75 ms "
                         "end to end, served): " + "; ".join(
                             f"{'ramp ' + k if k != 'final' else k} {g['n']}, "
                             f"{_ms(g['p50_ms'])} / {_ms(g['p75_ms'])}, "
                             f"{_ms(g['serving_p50_ms'])} / {_ms(g['serving_p75_ms'])}"
                             for k, g in o["by_exit"].items()))
    fits = runs[-1][REFIT].get("refits", [])
    lines.append(f"  {REFIT}: refitted heads deployed per run "
                 f"{[len(r[REFIT].get('refits', [])) for r in runs]}; last run (ramp vN: "
                 "agreement serving -> new on held-back samples) " + (", ".join(
                     f"{f['ramp']} v{f['version']}: {f['serving_agreement']:.3f} -> "
                     f"{f['agreement']:.3f}" for f in fits) or "none")
                 + f"; refit p50 {_ms(doc.get('refit_ms_p50'))} ms, max "
                 f"{_ms(doc.get('refit_ms_max'))} ms per ramp (replay of the same stream)")
    lines.append(f"  oracle: {doc['oracle']['source']}")
    if (ch := doc.get("answer_changes")) is not None:
        lines.append(f"  stream: {AnswerChanges.from_dict(ch).describe()}")
    lines.append(f"  tuning p50 {_ms(doc['tuning_ms_p50'])} ms, ramp adjustment p50 "
                 f"{_ms(doc['adjust_ms_p50'])} ms ({doc.get('climb', 'python')} climb), grid gap "
                 + ("-" if doc["grid_gap"] is None else f"{100 * doc['grid_gap']:+.1f}%")
                 + f" ({doc['tuning_source']})")
    return lines


def table(doc: dict[str, Any]) -> str:
    scenes = f", scenes {doc['scene_frames']}" if doc.get("scene_frames") else ""
    head = (f"offramp bench apparate --live: {doc['model']}, {doc['requests']} "
            f"{doc['workload']} samples{scenes}, arrivals {doc['arrivals']} (live, open loop; "
            f"budget {doc['budget']:.0%}, constraint {doc['constraint']:.0%}, feedback backlog "
            f"{doc.get('feedback_backlog', 0)}; {doc['aggregate']})")
    return "\n".join([head, *_latency_rows(doc), *_offramp_rows(doc)])

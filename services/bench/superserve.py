"""``offramp bench superserve --sim``: SlackFit against fixed-variant serving on bursty,
accelerating and MAF-like traces, replayed (SuperServe §6).

    offramp bench superserve --sim --json OUT [--workers 8] [--seconds 30] [--seed 0]
        [--profile FILE] [--model M] [--slo-ms MS]

A replay simulation (``services.sim.variant_sim``), not a live run: the router's own
variant policies decide, and each batch takes its variant's profiled time.

Variant tables (device classes):
- ``a40-modeled``: the six OFA-ResNet50 subnets of ``../shared/data`` with their published
  A40 forward times and ImageNet top-1. **Modeled**: measured elsewhere.
- ``--profile FILE``: a profile this machine measured, e.g. the manifest that
  ``offramp prepare supernet-cnn`` writes (its frontier), labelled with its device class.
- ``--model M``: exit depth as the variant, for a prepared early-exit model: the model cut
  at each ramp (every sample answers there, at the ramp's held-out agreement) and the full
  model, timed from its measured block profile.

Traces, scaled to each class: ``K`` is what ``--workers`` workers serve with the most
accurate variant at the largest batch, per second.
- bursty: base 25 % evenly spaced + 75 % gamma arrivals, mean 0.7, 1.0 and 1.3 x K, CV²
  2, 4 and 8 (SuperServe fig. 9);
- accel: 0.5 K -> 1.3 K from t = 5 s at 0.04, 0.08 and 0.8 x K per second (fig. 10), CV² 8;
- maf: 0.9 K mean, diurnal over the run, 2 s spikes at 3x every 10 s;
- faults: bursty 0.9 K, CV² 2, one worker lost every 12 s down to half (fig. 11a).

Policies: SlackFit, MaxAcc, MaxBatch, INFaaS-like (the cheapest variant: no accuracy floor,
as §6.1 runs it) and Clipper+ at six variants evenly spread over the frontier's accuracy.
SLO: ``--slo-ms``, else 1.8 x the slowest variant's batch time at the largest batch (36 ms
on the A40 class, the paper's SLO). Metrics as §6.1: SLO attainment over all requests,
mean serving accuracy over those that attained it.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from services.bench.e3_inputs import GPU_CURVES
from services.bench.report import machine
from services.router.policy import QueueView
from services.router.variant_policies import (
    FixedVariant,
    MaxAcc,
    MaxBatch,
    SlackFit,
    infaas_like,
)
from services.router.variant_table import VariantProfile, pareto
from services.sim.variant_sim import simulate, timeline
from services.workloads import arrivals as arr

MAX_BATCH = 16
SLO_FACTOR = 1.8
CLIPPER_POINTS = 6
LOADS = (0.7, 1.0, 1.3)
CV2S = (2.0, 4.0, 8.0)
ACCELS = (0.04, 0.08, 0.8)
BASE_SHARE = 0.25


def a40_variants(path: Path = GPU_CURVES) -> list[VariantProfile]:
    """The published A40 subnets (modeled): top-1 as accuracy, forward time per batch."""
    doc = json.loads(path.read_text())
    return [VariantProfile.from_table(f"ofa-subnet{s['id']}", s["imagenet_top1"] / 100.0,
                                      s["forward_ms"]) for s in doc["subnets"]]


def file_variants(path: Path) -> tuple[str, list[VariantProfile]]:
    """(device class, frontier variants) of a measured profile: a prepared supernet's
    manifest (its ``meta``), or ``{"device": ..., "subnets": [{"subnet", "agreement",
    "latency_ms": {batch: ms}, "pareto"}, ...]}``."""
    doc = json.loads(path.read_text())
    doc = doc.get("meta", doc)
    rows = [r for r in doc.get("subnets", []) if r.get("pareto") and r.get("latency_ms")]
    if not rows:
        raise ValueError(f"{path}: no frontier subnet with a latency profile")
    return str(doc.get("device", "measured")), [
        VariantProfile.from_table(r["subnet"], r["agreement"], r["latency_ms"]) for r in rows]


def supernet_costs(manifest_path: Path, say) -> dict[str, Any]:
    """Measured on a prepared supernet: memory of one copy of the weights (plus every served
    subnet's statistics) against the frontier as separate models, and what switching a
    batch to a subnet costs in place against loading it as a separate model (its state
    dict from memory into a fresh module: no disk, the cheapest a load can be)."""
    import io

    import torch

    from services.runtime.manifest import Manifest
    from services.runtime.supernet import SupernetRuntime
    from services.supernet.conv_supernet import module_bytes
    from services.supernet.operators import stats_bytes

    manifest = Manifest.load(manifest_path.parent)
    rt = SupernetRuntime(manifest_path.parent, manifest, threads=1)
    keys = rt.variants
    separate, loads, switches = 0, [], []
    for key in keys:
        alone = rt.net.extract(rt.subnet(key))
        separate += module_bytes(alone)
        buf = io.BytesIO()
        torch.save(alone.state_dict(), buf)
        t0 = time.perf_counter()
        fresh = rt.net.extract(rt.subnet(key))   # the module a separate model needs
        fresh.load_state_dict(torch.load(io.BytesIO(buf.getvalue()), weights_only=True))
        loads.append((time.perf_counter() - t0) * 1e3)
        switches.append(rt.actuation_ms(key, repeats=2000))
    shared = module_bytes(rt.net) + stats_bytes(rt.net, keys)
    say(f"supernet: {len(keys)} served subnets, {shared / 1e6:.2f} MB shared vs "
        f"{separate / 1e6:.2f} MB as separate models")
    return {"served_subnets": len(keys), "shared_bytes": shared,
            "stats_bytes": stats_bytes(rt.net, keys), "separate_bytes": separate,
            "memory_ratio": separate / shared,
            "actuation_ms_median": float(np.median(switches)),
            "actuation_ms_max": float(np.max(switches)),
            "load_ms_median": float(np.median(loads)), "load_ms_max": float(np.max(loads))}


def depth_variants(manifest) -> list[VariantProfile]:
    """Exit depth as the variant, for an early-exit model (measured CPU profile): the model
    cut at each trained ramp, every sample answering there (the ramp's held-out agreement
    with the final layer), plus the full model. A cut's batch time is its blocks' measured
    time at that batch, scaled as the unsplit model runs faster than its blocks chained,
    plus the ramp head's."""
    blocks = manifest.blocks
    batches = sorted({int(b) for b in blocks[0].cost_by_batch})
    full = {b: float(manifest.meta["unsplit_by_batch"][str(b)]) for b in batches}
    chained = {b: sum(k.cost_by_batch[str(b)] for k in blocks) for b in batches}

    def prefix(last: int, b: int) -> float:
        return sum(k.cost_by_batch[str(b)] for k in blocks[:last + 1]) * full[b] / chained[b]

    out = [VariantProfile(f"depth<={r.index}", float(r.agreement), tuple(batches),
                          tuple(prefix(r.after_block, b) + r.cost_by_batch[str(b)]
                                for b in batches))
           for r in manifest.ramps if r.trained and r.agreement is not None]
    out.append(VariantProfile("depth<=final", 1.0, tuple(batches),
                              tuple(full[b] for b in batches)))
    return out


def capacity(variants: list[VariantProfile], workers: int) -> float:
    best = max(variants, key=lambda v: v.accuracy)
    return workers * MAX_BATCH / (best.latency(MAX_BATCH) / 1e3)


def traces(k: float, seconds: float) -> dict[str, tuple[str, bool]]:
    """name -> (arrival spec, whether workers fail during it); ``k`` in req/s."""
    out: dict[str, tuple[str, bool]] = {}
    for load in LOADS:
        for cv2 in CV2S:
            total = load * k
            out[f"bursty {load:g}K cv2={cv2:g}"] = (bursty_spec(total, cv2), False)
    for a in ACCELS:
        out[f"accel 0.5K->1.3K tau={a:g}K/s"] = (
            f"accel:{0.5 * k:.6g}:to={1.3 * k:.6g},tau={a * k:.6g},at=5,cv2=8", False)
    out["maf 0.9K"] = (f"maf:{0.9 * k:.6g}:day={seconds:g},every=10,width=2,x=3,amp=0.5",
                       False)
    out["faults bursty 0.9K cv2=2"] = (bursty_spec(0.9 * k, 2.0), True)
    return out


def bursty_spec(total: float, cv2: float) -> str:
    """``total`` req/s: ``BASE_SHARE`` evenly spaced, the rest gamma with squared CV ``cv2``."""
    base, variant = BASE_SHARE * total, (1 - BASE_SHARE) * total
    return f"bursty:{base:.6g}:variant={variant:.6g},cv2={cv2:g}"


def policies(variants: list[VariantProfile]) -> dict[str, Any]:
    front = sorted(pareto(variants, MAX_BATCH), key=lambda v: v.accuracy)
    picks = sorted({round(i * (len(front) - 1) / (CLIPPER_POINTS - 1))
                    for i in range(CLIPPER_POINTS)}) if len(front) > 1 else [0]
    out: dict[str, Any] = {"slackfit": SlackFit(variants, MAX_BATCH),
                           "maxacc": MaxAcc(variants, MAX_BATCH),
                           "maxbatch": MaxBatch(variants, MAX_BATCH),
                           "infaas": infaas_like(variants, None, MAX_BATCH)}
    for i in picks:
        v = front[i]
        out[f"clipper+ {v.accuracy * 100:.2f}"] = FixedVariant(variants, v.key, MAX_BATCH)
    return out


def fault_schedule(workers: int, seconds: float) -> list[tuple[float, int]]:
    """One worker lost every 12 s, down to half of them."""
    return [(12.0 * (i + 1), workers - i - 1) for i in range(workers // 2)
            if 12.0 * (i + 1) < seconds]


def decision_us(policy, rng: np.random.Generator, n: int = 20000) -> dict[str, float]:
    """Per-call time of ``decide`` over random queue views (median, p99), in µs: 64
    requests on 2 workers, the most urgent 16 due over the next 0-20 ms after the head,
    as the router shows them."""
    thetas = rng.uniform(0.0, 200.0, n)
    spread = np.sort(rng.uniform(0.0, 20.0, (n, MAX_BATCH)), axis=1)
    spread[:, 0] = 0.0   # the head
    times = np.empty(n)
    for i, th in enumerate(thetas):
        view = QueueView(64, 0.0, th, th, workers=2,
                         deadlines_ms=tuple(float(th + d) for d in spread[i]))
        t0 = time.perf_counter_ns()
        policy.decide(view)
        times[i] = (time.perf_counter_ns() - t0) / 1e3
    return {"p50": float(np.median(times)), "p99": float(np.percentile(times, 99))}


def run_class(name: str, variants: list[VariantProfile], opt: dict[str, Any],
              say) -> dict[str, Any]:
    table = {v.key: v for v in variants}
    slo = opt["slo_ms"] or SLO_FACTOR * max(v.latency(MAX_BATCH) for v in variants)
    k = capacity(variants, opt["workers"])
    pols = policies(variants)
    results: dict[str, dict[str, Any]] = {p: {} for p in pols}
    timelines: dict[str, Any] = {}
    shapes = traces(k, opt["seconds"])
    for tname, (spec, failing) in shapes.items():
        faults = fault_schedule(opt["workers"], opt["seconds"]) if failing else []
        times = arr.make_arrivals(spec, duration_s=opt["seconds"], seed=opt["seed"])
        for pname, pol in pols.items():
            log = simulate(pol, table, times, slo, opt["workers"], faults)
            results[pname][tname] = {"attainment": log.attainment,
                                     "accuracy": log.mean_accuracy,
                                     "mean_batch": float(log.batch_size.mean())}
            if pname == "slackfit":
                timelines[tname] = timeline(log, 1.0)
        say(f"{name}: {tname}: {len(times)} requests, slackfit "
            f"{results['slackfit'][tname]['attainment']:.5f}")
    rng = np.random.default_rng(opt["seed"])
    return {"device_class": name, "modeled": name.endswith("modeled"), "slo_ms": slo,
            "capacity_rps": k, "workers": opt["workers"], "seconds": opt["seconds"],
            "variants": [{"variant": v.key, "accuracy": v.accuracy,
                          "latency_ms": {b: v.latency(b) for b in (1, 4, 8, 16)}}
                         for v in variants],
            "traces": {t: s for t, (s, _) in shapes.items()},
            "results": results, "slackfit_timeline": timelines,
            "decision_us": {p: decision_us(pol, rng) for p, pol in pols.items()},
            "checks": checks(results)}


def checks(results: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Per bursty trace where the most accurate Clipper+ attains < 0.99: SlackFit's
    attainment, and its accuracy gain over the best fixed variant reaching at least its
    attainment and over INFaaS-like (None: no fixed variant reached it)."""
    clippers = {p: r for p, r in results.items() if p.startswith("clipper+")}
    top = max(clippers, key=lambda p: float(p.split()[1]))
    out = {}
    for t in results["slackfit"]:
        if not t.startswith("bursty") or clippers[top][t]["attainment"] >= 0.99:
            continue
        sf = results["slackfit"][t]
        reach = [r[t]["accuracy"] for r in clippers.values()
                 if r[t]["attainment"] >= sf["attainment"] and r[t]["accuracy"] is not None]
        inf = results["infaas"][t]
        out[t] = {"slackfit_attainment": sf["attainment"],
                  "gain_vs_best_fixed_points": (None if not reach else
                                                100 * (sf["accuracy"] - max(reach))),
                  "gain_vs_infaas_points": (None if inf["accuracy"] is None else
                                            100 * (sf["accuracy"] - inf["accuracy"])),
                  "infaas_attainment": inf["attainment"]}
    return out


PLOT_TRACES = ("bursty 1.3K cv2=8", "faults bursty 0.9K cv2=2")


def plot(doc: dict[str, Any], path: Path) -> Path:
    """SlackFit over time on the bursty and fault traces of every table: offered rate,
    attainment, the mean accuracy of the variants it chose, and its mean batch (SVG)."""
    from services.bench.plot import svg_panels

    def series(key: str, scale: float = 1.0) -> list[tuple[str, np.ndarray, np.ndarray]]:
        out = []
        for c in doc["classes"]:
            for t in PLOT_TRACES:
                tl = c["slackfit_timeline"].get(t)
                if tl:
                    ys = np.array([np.nan if v is None else v * scale for v in tl[key]])
                    out.append((f"{c['device_class'][:24]}: {t}", np.array(tl["t"]), ys))
        return out

    def top(ss) -> float:
        return max((float(np.nanmax(y)) for _, _, y in ss if np.isfinite(y).any()),
                   default=1.0) * 1.05

    def span(ss) -> tuple[float, float]:
        finite = [y[np.isfinite(y)] for _, _, y in ss]
        values = np.concatenate(finite) if finite else np.zeros(0)
        if not values.size:
            return (0.0, 100.0)
        return (float(values.min()) - 0.5, float(values.max()) + 0.5)

    rate, att, acc, batch = (series("rate"), series("attainment"), series("accuracy", 100),
                             series("batch"))
    x_max = max((float(x[-1]) + 1 for _, x, _ in rate if x.size), default=1.0)
    path.write_text(svg_panels("SlackFit over time (replay; faults: a worker lost every 12 s)", [
        ("offered req/s (per second of arrivals)", rate, top(rate)),
        ("SLO attainment", att, 1.0),
        ("mean accuracy of the chosen variants, %", acc, span(acc)),
        ("mean batch size", batch, top(batch))], "seconds", x_max))
    return path


def report(doc: dict[str, Any]) -> str:
    lines = []
    sn = doc.get("supernet")
    if sn:
        lines.append(f"supernet (measured here): {sn['served_subnets']} served subnets in "
                     f"{sn['shared_bytes'] / 1e6:.2f} MB, as separate models "
                     f"{sn['separate_bytes'] / 1e6:.2f} MB ({sn['memory_ratio']:.2f}x); "
                     f"switching in place {sn['actuation_ms_median'] * 1e3:.1f} us, loading "
                     f"as a separate model {sn['load_ms_median']:.2f} ms (medians)")
    for c in doc["classes"]:
        pols = list(c["results"])
        lines.append(f"\n{c['device_class']} ({'modeled' if c['modeled'] else 'measured'}), "
                     f"{c['workers']} workers, SLO {c['slo_ms']:.1f} ms, K = "
                     f"{c['capacity_rps']:.0f} req/s; attainment / mean accuracy %")
        lines.append("| trace | " + " | ".join(pols) + " |")
        lines.append("|---" * (len(pols) + 1) + "|")
        for t in c["traces"]:
            cells = []
            for p in pols:
                r = c["results"][p][t]
                acc = "-" if r["accuracy"] is None else f"{100 * r['accuracy']:.2f}"
                cells.append(f"{r['attainment']:.4f} / {acc}")
            lines.append(f"| {t} | " + " | ".join(cells) + " |")
        p99 = ", ".join(f"{p} {v['p99']:.1f}" for p, v in c["decision_us"].items())
        lines.append(f"decision time p99 (us): {p99}")
    return "\n".join(lines)


def say(m: str) -> None:
    print(m, file=sys.stderr, flush=True)


def run_live(args) -> int:
    """The live half: a prepared supernet, or an early-exit model's depth caps, served by
    each policy (``superserve_live``)."""
    from services.bench.superserve_live import live_table
    from services.bench.superserve_live import run_live as live

    try:
        doc = live(args, say)
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    doc |= {p: {t: {k: r[k] for k in ("attainment", "accuracy")} for t, r in per.items()}
            for p, per in doc["results"].items()}
    Path(args.json).write_text(json.dumps(doc, indent=1) + "\n")
    print(live_table(doc))
    if getattr(args, "plot", None) and doc.get("faults"):
        from services.bench.superserve_faults import plot as faults_plot

        say(f"plot: {faults_plot(doc, Path(args.plot))}")
    return 0


def run_superserve(args) -> int:
    if not getattr(args, "sim", False):
        return run_live(args)
    opt = {"workers": args.workers or 8, "seconds": args.seconds or 30.0,
           "seed": args.seed, "slo_ms": args.slo_ms}

    classes = [("a40-modeled", a40_variants())]
    if getattr(args, "model", None):
        from services.common import config as config_mod
        from services.runtime.manifest import Manifest

        manifest = Manifest.load(config_mod.load().models_dir / args.model)
        classes.append((f"{args.model} depth caps ({manifest.meta.get('device_class', 'cpu')})",
                        depth_variants(manifest)))
    costs = None
    if getattr(args, "profile", None):
        classes.append(file_variants(Path(args.profile)))
        if json.loads(Path(args.profile).read_text()).get("kind") == "supernet":
            costs = supernet_costs(Path(args.profile), say)
    doc: dict[str, Any] = {"mode": "replay simulation", "machine": machine(), "options": opt,
                           "classes": [run_class(n, v, opt, say) for n, v in classes],
                           "supernet": costs}
    head = doc["classes"][0]
    doc |= {p: {t: {k: r[k] for k in ("attainment", "accuracy")} for t, r in per.items()}
            for p, per in head["results"].items()}
    doc["decision_us_p99"] = max(v["p99"] for v in head["decision_us"].values())
    # measured on the prepared supernet (in place), beside loading it as a separate model
    doc["actuation_ms"] = None if costs is None else {
        "in_place": costs["actuation_ms_median"], "load": costs["load_ms_median"]}
    Path(args.json).write_text(json.dumps(doc, indent=1) + "\n")
    print(report(doc))
    if getattr(args, "plot", None):
        say(f"plot: {plot(doc, Path(args.plot))}")
    return 0

"""``offramp bench superserve`` live: variant policies serving a prepared supernet, or an
early-exit model's depth caps, on this machine, on the same bursty arrivals (SuperServe
§6.3 on a small scale).

    offramp bench superserve --json OUT [--model supernet-cnn|efficientnet-lite0|...]
        [--workers 2] [--seconds 20] [--seed 0] [--slo-ms MS] [--rate R]
        [--policies slackfit,maxacc,maxbatch,infaas,clipper+,variant=KEY] [--caps R,...|budget]

An early-exit model runs in compute mode with depth caps as the variants
(:mod:`services.bench.superserve_depth`): by default the cheapest trained ramp and two
spread over the model's cost, made the active ramps of its exit config; its accuracy is
measured per answer against the full model. The rest of this docstring says "subnet" for either.

Live, not simulated. Each policy gets a private stack (``offramp up``'s supervisor: its own
state folder and nats-server) serving the model with ``--workers`` workers of one torch
thread and worker credit 1, its router running that policy (``OFFRAMP_ROUTER_POLICY``):
SlackFit, MaxAcc, MaxBatch, INFaaS-like (the cheapest subnet) and Clipper+ at the most
accurate, the middle and the fastest frontier subnet. Every stack serves the same traces,
one after the other, after ``WARM_S`` of Poisson warm-up at the traces' mean rate (the
router learns the live slowdown at the load it serves; a cold start is not what the
traces measure): bursty (a quarter evenly spaced,
the rest gamma) with CV² 2 and 8, at ``LOAD`` x ``K``, where ``K`` is what the workers
serve per second with the most accurate subnet at batch 16 by its profile (capped at
``MAX_RATE``, what one Python client sends here beside the workers), or ``--rate``.

Per policy and trace: SLO attainment (answered within the SLO, over every request sent),
mean serving accuracy (the profiled agreement of the subnet that answered, over the
requests that attained the SLO), the subnets used and the end-to-end p50/p99.
"""

from __future__ import annotations

import asyncio
import re
import shutil
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from services.bench import superserve_depth
from services.bench import superserve_faults as faults
from services.bench.report import machine
from services.common import bus
from services.common import config as config_mod
from services.common.credentials import login_for
from services.launcher.supervisor import Deployment, Supervisor, prepare_state
from services.loadgen.drive import drive_open
from services.runtime.manifest import Manifest
from services.store.repository import Store
from services.workloads import arrivals as arr
from services.zoo import chain_cnn

LOAD = 0.8        # offered mean rate: x the most accurate subnet's profiled capacity
MAX_RATE = 500.0  # req/s: one Python client and the router beside the workers on 2 cores
WARM_S = 5.0
CV2S = (2.0, 8.0)
SLO_FACTOR = 3.0  # default SLO: x the slowest frontier subnet's batch-16 time
MIN_SLO_MS = 50.0  # ... at least this: bus hops and the client's own scheduling
FAULT_FACTOR = 2.0  # the faults trace runs this many times --seconds


def frontier(manifest: Manifest) -> list[dict[str, Any]]:
    rows = [r for r in manifest.meta["subnets"] if r["pareto"]]
    return sorted(rows, key=lambda r: r["agreement"])


def live_policies(front: list[dict[str, Any]]) -> dict[str, str]:
    """name -> OFFRAMP_ROUTER_POLICY value."""
    picks = {"fastest": front[0], "middle": front[len(front) // 2], "most accurate": front[-1]}
    out = {p: p for p in ("slackfit", "maxacc", "maxbatch", "infaas")}
    for label, r in picks.items():
        out[f"clipper+ {label} ({100 * r['agreement']:.2f})"] = f"variant={r['subnet']}"
    return out


def stack_config(home: Path, base, model: str, policy: str, slo_ms: float):
    return replace(base, home=home, models=(model,), database_url=f"sqlite:///{home}/offramp.db",
                   nats_url=None, ort_threads=1, worker_credit=1, max_batch=16,
                   default_slo_ms=slo_ms, queue_limit=100_000, router_policy=policy,
                   adapt=False)


async def _send(cfg, url: str, model: str, inputs: list[dict], times: np.ndarray,
                slo_ms: float) -> list:
    nc = await bus.connect(url, "offramp-bench-superserve", login=login_for(cfg, "client"))
    try:
        return await drive_open(nc, model, inputs, times,
                                slo_ms=slo_ms, timeout=slo_ms / 1e3 + 10)
    finally:
        await nc.close()


def figures(outs: list, score, slo_ms: float) -> dict[str, Any]:
    """``score(outcome)``: the accuracy credited to one answer."""
    ok = [o for o in outs if o.ok and o.latency_ms <= slo_ms]
    lat = np.array([o.latency_ms for o in outs if o.ok])
    return {"requests": len(outs), "attainment": len(ok) / len(outs) if outs else None,
            "accuracy": float(np.mean([score(o) for o in ok])) if ok else None,
            "errors": dict(Counter(o.code for o in outs if not o.ok)),
            "variants": dict(Counter(o.variant for o in outs if o.ok)),
            "p50_ms": float(np.percentile(lat, 50)) if lat.size else None,
            "p99_ms": float(np.percentile(lat, 99)) if lat.size else None}


@dataclass
class Load:
    """What every policy's stack serves: the traces, their inputs, the score of an answer,
    the SLO; and the faults trace (None: not run) with its length."""

    traces: dict[str, np.ndarray]
    inputs: list[dict]
    score: Any
    slo_ms: float
    workers: int
    faults: np.ndarray | None = None
    fault_s: float = 0.0
    warm_rps: float = 50.0
    caps: list[int] = field(default_factory=list)  # an early-exit model's depth caps


def run_policy(cfg, model: str, load: Load, say, depth: bool) -> dict:
    cfg.home.mkdir(parents=True, exist_ok=True)
    prepare_state(cfg, say=lambda m: None)
    if depth:  # caps stop the batch only in compute mode
        with Store(cfg.database_url) as store:
            superserve_depth.serve_caps(store, Manifest.load(cfg.models_dir / model),
                                        load.caps)
    sup = Supervisor(cfg, Deployment((model,), replicas=load.workers),
                     log_dir=cfg.home / "logs")
    out = {}
    try:
        url = sup.start()
        sup.wait_ready(300)
        if depth:
            superserve_depth.await_measured_caps(cfg, model)

        def send(times: np.ndarray) -> list:
            return asyncio.run(_send(cfg, url, model, load.inputs[:len(times)], times,
                                     load.slo_ms))

        send(arr.poisson(min(load.warm_rps, 0.5 * len(load.inputs) / WARM_S), duration_s=WARM_S,
                         seed=99))
        for name, times in load.traces.items():
            out[name] = figures(send(times), load.score, load.slo_ms)
            say(f"{cfg.router_policy}: {name}: attainment {out[name]['attainment']:.4f}, "
                f"accuracy {out[name]['accuracy']}, errors {out[name]['errors']}")
        if load.faults is not None:
            outs, info = faults.run_faults(sup, send, load.faults, model, load.workers,
                                           load.fault_s, say)
            out[faults.TRACE] = figures(outs, load.score, load.slo_ms) | info | {
                "timeline": faults.over_time(outs, load.faults, load.score, load.slo_ms)}
            say(f"{cfg.router_policy}: {faults.TRACE}: attainment "
                f"{out[faults.TRACE]['attainment']:.4f}")
    finally:
        sup.stop()
    return out


def inputs_and_score(base, manifest: Manifest, seed: int, n: int):
    """The inputs of ``n`` requests and the accuracy credited to an answer: a supernet's
    profiled agreement of the subnet that answered, or for an early-exit model's depth
    caps whether the answer is the full model's (measured here on the same inputs)."""
    if manifest.kind == "supernet":
        accuracy = {r["subnet"]: r["agreement"] for r in manifest.meta["subnets"]}
        if manifest.meta.get("family", "conv") == "conv":  # chain-cnn's data it trained on
            inputs = [{"image": x} for x in chain_cnn.sample_inputs(n, seed)["image"]]
        else:  # its model inputs' workload, e.g. the text stream of minilm-topics
            inputs = superserve_depth.bench_inputs(manifest, n, seed)
        return inputs, lambda o: accuracy.get(o.variant, np.nan)
    inputs = superserve_depth.bench_inputs(manifest, n, seed)
    ref = superserve_depth.full_labels(base.models_dir / manifest.name, manifest, inputs)
    return inputs, lambda o: float(o.label == ref[o.index])


def policy_names(wanted: str) -> list[str]:
    """``--policies`` split at its commas, except those inside a subnet key: a conv
    supernet's ``D=2,1,2,1;W=1,0.75,0.5,0.5`` has them, and no policy name starts with a
    digit, so a part that does continues the ``variant=`` before it."""
    out: list[str] = []
    for part in (p.strip() for p in wanted.split(",")):
        if out and part[:1].isdigit() and out[-1].startswith("variant="):
            out[-1] += "," + part
        elif part:
            out.append(part)
    return out


def chosen_policies(front: list[dict[str, Any]], wanted: str | None) -> dict[str, str]:
    """The policies ``--policies`` names (name prefixes, or ``variant=KEY`` for Clipper+ on
    any frontier subnet); all of them without it."""
    chosen = live_policies(front)
    if not wanted:
        return chosen
    agreement = {r["subnet"]: r["agreement"] for r in front}
    out: dict[str, str] = {}
    for w in policy_names(wanted):
        if w.startswith("variant="):
            key = w.removeprefix("variant=")
            if key not in agreement:
                raise ValueError(f"--policies: {w}: not on the frontier; it holds "
                                 f"{', '.join(agreement)}")
            out[f"clipper+ {key} ({100 * agreement[key]:.2f})"] = w
            continue
        hits = {n: p for n, p in chosen.items() if n.startswith(w)}
        if not hits:
            raise ValueError(f"--policies: unknown {w!r}; known: slackfit, maxacc, maxbatch, "
                             "infaas, clipper+, variant=KEY")
        out.update(hits)
    return out


def describe_variants(front: list[dict[str, Any]], caps_from: str | None) -> str:
    """One line on the variants served; depth caps (``caps_from`` says whence) say where
    they come from, since the fastest cap bounds what the workers can take on in a burst
    or when one of them dies."""
    rows = ", ".join(f"{r['subnet']} ({r['latency_ms']['16']:.1f} ms)" for r in front)
    if caps_from is None:
        return f"{len(front)} frontier subnets, batch 16: {rows}"
    return f"depth caps, batch 16: {rows}; the caps: {caps_from}"


def run_live(args, say) -> dict[str, Any]:
    base = config_mod.load()
    model = getattr(args, "model", None) or "supernet-cnn"
    manifest = Manifest.load(base.models_dir / model)
    depth = manifest.kind != "supernet"
    workers = args.workers or 2
    seconds = args.seconds or 20.0
    caps, caps_from = (superserve_depth.chosen_caps(manifest, getattr(args, "caps", None),
                                                    base.ramp_budget) if depth else ([], None))
    front = superserve_depth.cap_frontier(manifest, caps) if depth else frontier(manifest)
    top = front[-1]["latency_ms"]["16"]
    slo = args.slo_ms or max(MIN_SLO_MS, SLO_FACTOR * top)
    k = workers * 16 / (top / 1e3)
    rate = getattr(args, "rate", None) or min(LOAD * k, MAX_RATE)
    traces = {f"bursty {rate:.0f}/s cv2={c:g}": arr.make_arrivals(
        f"bursty:{0.25 * rate:.6g}:variant={0.75 * rate:.6g},cv2={c:g}", duration_s=seconds,
        seed=args.seed) for c in CV2S}
    fault_s = FAULT_FACTOR * seconds
    fault_times = arr.make_arrivals(
        f"bursty:{0.25 * rate:.6g}:variant={0.75 * rate:.6g},cv2={CV2S[0]:g}",
        duration_s=fault_s, seed=args.seed + 1) if getattr(args, "faults", False) else None
    n = max([len(t) for t in traces.values()]
            + ([len(fault_times)] if fault_times is not None else []))
    say(f"{model}: {n} inputs" + (" and the full model's answers to them" if depth else ""))
    say(describe_variants(front, caps_from) + f"; SLO {slo:.1f} ms, offered "
        f"{rate:.0f} req/s ({rate / k:.2f} K, K = {k:.0f} req/s by profile)")
    inputs, score = inputs_and_score(base, manifest, args.seed, n)
    load = Load(traces, inputs, score, slo, workers, fault_times, fault_s, warm_rps=rate,
                caps=caps)
    root = base.home / "bench-superserve" / model
    shutil.rmtree(root, ignore_errors=True)
    results = {}
    for name, policy in chosen_policies(front, getattr(args, "policies", None)).items():
        say(f"{name}: a stack with {workers} workers, router policy {policy}")
        cfg = stack_config(root / re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-"),
                           base, model, policy, slo)
        results[name] = run_policy(cfg, model, load, say, depth)
    return {"mode": "live", "machine": machine(), "model": model, "workers": workers,
            "variants": "depth caps (compute mode)" if depth else "subnets",
            "caps": caps if depth else None,
            "seconds": seconds, "slo_ms": slo, "rate_rps": rate, "capacity_rps": k,
            "traces": {n: len(t) for n, t in traces.items()},
            "faults": None if fault_times is None else {
                "requests": len(fault_times), "seconds": fault_s,
                "kill_plan": faults.kill_plan(model, workers, fault_s)},
            "frontier": [{"subnet": r["subnet"], "agreement": r["agreement"],
                          "latency_ms": r["latency_ms"]} for r in front],
            "results": results}


def live_table(doc: dict[str, Any]) -> str:
    traces = list(doc["traces"]) + ([faults.TRACE] if doc.get("faults") else [])
    lines = [(f"live, {doc['model']}, {doc['workers']} workers, SLO {doc['slo_ms']:.1f} ms, "
             f"offered {doc['rate_rps']:.0f} req/s; attainment / mean accuracy %"),
             "| policy | " + " | ".join(traces) + " |", "|---" * (len(traces) + 1) + "|"]
    for p, per in doc["results"].items():
        cells = []
        for t in traces:
            r = per.get(t) or {}
            acc = "-" if r.get("accuracy") is None else f"{100 * r['accuracy']:.2f}"
            att = "-" if r.get("attainment") is None else f"{r['attainment']:.4f}"
            cells.append(f"{att} / {acc}")
        lines.append(f"| {p} | " + " | ".join(cells) + " |")
    return "\n".join(lines)

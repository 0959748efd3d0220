"""``offramp bench e3`` live: vanilla, naive early exit and E3 served by real workers on
this machine, on the same requests at the same arrival times (E3 §5.1 on a small scale).

    offramp bench e3 --json OUT [--model minilm-topics|chain-cnn] [--workers 2]
        [--batches 16] [--mixes 80/20] [--seconds 40] [--seed N] [--slo-ms MS]

Live, not simulated. The requests come from the model's workload as in the simulation
(``services.bench.e3``'s setup: the recorded trace of the workload's inputs, the exit
config tuned on it to the accuracy constraint, and its easy/hard pools; the inputs are the
trace's own, regenerated from its seed). Each policy gets a private stack with ``--workers``
worker processes, each with one ONNX Runtime thread:

- **vanilla**: one stage, the workers as replicas, no ramp (the full model, batches up to
  the batch size as the router fills them);
- **naive early exit**: the same layout in compute mode with every useful ramp active:
  exited samples leave the batch, which shrinks;
- **E3**: ``offramp up --workers N --plan auto``: pool workers take the optimizer's plan
  (split, replicas, fusion) in compute mode, with the same thresholds.

Each runs two phases on one stream: a saturated phase (Poisson arrivals at ``LOAD`` x the
vanilla deployment's expected capacity, from its measured batch time) whose goodput is
what it sustains, then a common phase at ``COMMON_LOAD`` x the lowest saturated goodput,
where p50/p99 and cost are compared at equal goodput. A stack's phases start once its
profiler has measured the model (``await_latency_profile``), and are measured after
``WARM_S`` seconds of the same stream (sessions warm, batch profiles and plans made). Figures:

- goodput: answers within the SLO per second of arrivals;
- p50/p99: end to end at the client, from each request's scheduled arrival;
- agreement: each answer's label against the vanilla run's label for the same request;
- cost: worker-seconds per 1,000 answers (workers holding a role x the phase's duration);
- mean batch per stage: from the workers' own batch-size histograms;
- the tuner's path in each compute-mode phase (warm-up included): its alerts (cuts on a
  window below the constraint) and savings tunes, from the store's exit configs;
- E3's plans (versions, reasons, optimizer time) and the forecast MAPE of its batch
  profiles (ARIMA and naive against what each window observed).

With ``--adapt`` the tuner runs beside the compute-mode policies: it starts from thresholds
tuned on the trace with its own headroom (half the constraint, ``Setup.start``), as a tuner
that deployed them would, and adapts them on the shadow feedback, under the constraint; a
policy's common phase then starts from the thresholds its tuner reached in the saturated
phase, as a deployment that keeps running would (a fresh start from the trace's thresholds
would measure the first minute of tuning again). Without ``--adapt`` the thresholds stay
as tuned on the trace (static).
"""

from __future__ import annotations

import asyncio
import math
import re
import time
from collections.abc import Iterable
from contextlib import contextmanager
from dataclasses import replace
from datetime import UTC
from pathlib import Path
from typing import Any

import numpy as np

from services.bench import e3_inputs as inputs
from services.bench.metrics_scrape import histogram_sum_count
from services.common import bus
from services.common.credentials import login_for
from services.common.stats import percentile
from services.launcher.exit_config import set_exit_config
from services.launcher.supervisor import Deployment, Supervisor, prepare_state
from services.loadgen.drive import await_config, drive_open
from services.profiler.batch_profile import mape, sampling_mape, wape
from services.sim import e3_policies as pol
from services.store.repository import Store
from services.workloads.arrivals import poisson

LOAD = 1.5          # saturated phase: x vanilla's expected capacity ...
MAX_RATE = 800.0    # ... at most: one Python client and the router share this machine
COMMON_LOAD = 0.6   # common phase: x the lowest saturated goodput
WARM_S = 20.0       # seconds of the stream before a phase is measured
PROFILE_WINDOW_S = 4.0
PLAN_INTERVAL_S = 30.0
MIN_WINDOW_SAMPLES = 200
PROFILE_WAIT_S = 300.0  # a stack's profiler measures the model before any phase starts
POLICIES = ("vanilla", "naive_ee", "e3")


def trace_inputs(manifest, n: int, seed: int) -> list[dict[str, np.ndarray]]:
    """The inputs the trace was recorded on (its workload ``seed``), one dict per sample,
    in order."""
    chunks, _ = inputs.model_inputs(manifest, n, seed)
    out: list[dict[str, np.ndarray]] = []
    for chunk in chunks:
        rows = len(next(iter(chunk.values())))
        out += [{k: np.ascontiguousarray(v[i]) for k, v in chunk.items()} for i in range(rows)]
    return out[:n]


def bench_config(home: Path, models_dir: Path, model: str, batch: int, slo_ms: float,
                 adapt: bool, shadow_rate: float):
    from services.common import config

    return replace(config.load(), home=home, models_dir=models_dir, models=(model,),
                   database_url=f"sqlite:///{home / 'offramp.db'}", nats_url=None,
                   max_batch=batch, default_slo_ms=slo_ms, ort_threads=1,
                   queue_limit=100_000, ramp_feature_rate=0.0,
                   profile_window_s=PROFILE_WINDOW_S, plan_interval_s=PLAN_INTERVAL_S,
                   adapt=adapt, shadow_rate=shadow_rate)


@contextmanager
def policy_stack(cfg, model: str, policy: str, workers: int, say):
    """A private stack serving ``model`` as ``policy`` with ``workers`` worker processes."""
    cfg.home.mkdir(parents=True, exist_ok=True)
    prepare_state(cfg, say=lambda m: None)
    pool = workers if policy == "e3" else 0
    if pool:
        with Store(cfg.database_url) as store:
            store.ensure_exit_mode(model, "compute", "compute mode: bench e3")
    dep = Deployment((model,), replicas=1 if pool else workers, pool_workers=pool)
    sup = Supervisor(cfg, dep, log_dir=cfg.home / "logs")
    try:
        url = sup.start()
        say(f"{policy}: stack up ({workers} workers; logs in {cfg.home / 'logs'})")
        sup.wait_ready(300)
        await_latency_profile(cfg, model, PROFILE_WAIT_S)
        yield sup, url
    finally:
        sup.stop()


def await_latency_profile(cfg, model: str, timeout_s: float) -> None:
    """Wait until the stack's profiler has measured ``model`` on the workers' device class.
    The profiler measures a new stack's model on the machine's cores; under load that takes
    cores from the workers and leaves a backlog, so every policy starts after it (E3's
    optimizer needs the profile anyway; the fixed layouts would otherwise pay for it)."""
    from services.runtime.devices import device_class

    device = device_class(cfg.device, threads=cfg.ort_threads)
    deadline = time.monotonic() + timeout_s
    with Store(cfg.database_url) as store:
        while not store.latency_profile(model, device):
            if time.monotonic() > deadline:
                raise RuntimeError(f"no latency profile of {model} on {device} after "
                                   f"{timeout_s:.0f} s: see the profiler's log")
            time.sleep(0.5)


def set_policy(cfg, url: str, model: str, policy: str, ramp_ids: list[int],
               thresholds: dict[int, float]) -> None:
    """vanilla: no ramp, latency mode; the others: the tuned thresholds, compute mode."""
    said: list[str] = []
    if policy == "vanilla":
        code = set_exit_config(cfg, url, model, None, [], "none", "bench e3: vanilla",
                               mode="latency", say=said.append)
    else:
        code = set_exit_config(cfg, url, model, None,
                               [f"{r}={t}" for r, t in thresholds.items()],
                               ",".join(map(str, ramp_ids)), f"bench e3: {policy}",
                               mode="compute", say=said.append)
    if code != 0:
        raise RuntimeError(f"could not set the exit config of {policy}: {' '.join(said)}")


def worker_metrics(sup: Supervisor) -> list[str]:
    from services.launcher import metrics_ports

    return [metrics_ports.url(sup.cfg.metrics_bind, c.metrics_port) for c in sup.children
            if c.name.startswith("worker") and c.metrics_port is not None]


def batch_means(before: dict[str, tuple[float, float]],
                after: dict[str, tuple[float, float]]) -> dict[str, float]:
    """Mean samples per batch of each stage between two scrapes."""
    out = {}
    for stage, (s1, c1) in after.items():
        s0, c0 = before.get(stage, (0.0, 0.0))
        if c1 > c0:
            out[stage] = (s1 - s0) / (c1 - c0)
    return out


async def _phase(cfg, sup: Supervisor, url: str, model: str, xs: list,
                 arrivals: np.ndarray, slo_ms: float,
                 warm_s: float) -> tuple[list, dict[str, float]]:
    """Send the phase's stream; the batch means of its measured part (after ``warm_s``)."""
    nc = await bus.connect(url, "offramp-bench-e3", login=login_for(cfg, "client"))
    with Store(cfg.database_url) as store:
        latest = store.latest_exit_config(model)
    await await_config(nc, model, latest.version, xs[0], timeout_s=120)
    urls = worker_metrics(sup)
    scrape = lambda: histogram_sum_count(urls, "offramp_batch_size", "stage")
    snap: dict[str, Any] = {}

    async def at_warm_end() -> None:
        await asyncio.sleep(warm_s)
        snap["before"] = await asyncio.to_thread(scrape)

    marker = asyncio.ensure_future(at_warm_end())
    outs = await drive_open(nc, model, xs, arrivals, slo_ms=slo_ms,
                            timeout=slo_ms / 1e3 + 10)
    await marker
    after = await asyncio.to_thread(scrape)
    await nc.close()
    return outs, batch_means(snap.get("before", {}), after)


def phase_figures(outs: list, labels_ref: dict[int, int] | None, t0: float, t1: float,
                  slo_ms: float, workers_used: float) -> dict[str, Any]:
    """Figures of the measured part (arrivals in [t0, t1) seconds) of a phase."""
    dur = t1 - t0
    ok = [o for o in outs if o.ok and o.latency_ms <= slo_ms]
    lat = [o.latency_ms for o in ok]
    agree = None
    if labels_ref is not None:
        pairs = [(o.label, labels_ref[o.index]) for o in ok if o.index in labels_ref]
        agree = sum(a == b for a, b in pairs) / len(pairs) if pairs else None
    codes: dict[str, int] = {}
    for o in outs:
        codes[o.code] = codes.get(o.code, 0) + 1
    return {"requests": len(outs), "answered_in_slo": len(ok), "codes": codes,
            "goodput_rps": len(ok) / dur, "p50_ms": percentile(lat, 50),
            "p99_ms": percentile(lat, 99), "agreement": agree,
            "early_share": sum(o.early for o in ok) / len(ok) if ok else None,
            "workers_used": workers_used,
            "cost": 1000.0 * workers_used * dur / len(ok) if ok else None}


def plans_of(cfg, model: str, since: float) -> list[dict[str, Any]]:
    with Store(cfg.database_url) as store:
        rows = store.deployment_plans(model)
    return [{"version": r["version"], "reason": r["reason"], "feasible": r["feasible"],
             "made_at": r["inputs"].get("made_at"), "optimizer_ms": r["inputs"].get("optimizer_ms"),
             "stages": [{"blocks": [s["first_block"], s["last_block"]], "replicas": len(s["workers"]),
                         "batch": s["batch"], "active_ramps": s["active_ramps"]}
                        for s in r["plan"].get("stages", [])],
             "expected_goodput_rps": r["goodput_rps"]}
            for r in rows if (r["inputs"].get("made_at") or 0) >= since]


def tuner_moves(cfg, model: str, since: float) -> dict[str, int]:
    """The tuner's decisions that changed the exit config since ``since`` (unix s)."""
    with Store(cfg.database_url) as store:
        rows = store.exit_configs(model)
    return count_moves(r.reason for r in rows
                       if r.created_at.replace(tzinfo=UTC).timestamp() >= since)


def count_moves(reasons: Iterable[str]) -> dict[str, int]:
    """Tuner configs by trigger: the tuner stores its reason as ``tuner <trigger>/<action>:
    ...`` (alert: cut on a window below the constraint; slack: a tune for savings)."""
    out = {"alert": 0, "slack": 0}
    for reason in reasons:
        if m := re.match(r"tuner (\w+)/", reason):
            out[m.group(1)] = out.get(m.group(1), 0) + 1
    return out


def workers_in_plan(cfg, model: str) -> int | None:
    with Store(cfg.database_url) as store:
        row = store.latest_plan(model, feasible=True)
    if row is None:
        return None
    return sum(len(s["workers"]) for s in row["plan"]["stages"])


def forecast_errors(cfg, model: str) -> dict[str, Any]:
    """MAPE (and WAPE) of the E3 run's batch-profile forecasts (ARIMA, naive) against what
    each window observed, over the windows the profiler judged (forecast under the same
    exit config and ramps) with at least ``MIN_WINDOW_SAMPLES`` samples (a window of a few
    dozen is mostly binomial noise). ``sampling_mape`` is what a forecaster that knew each
    window's true survival would score: the windows' sampling noise alone."""
    with Store(cfg.database_url) as store:
        rows = [r for r in store.batch_profiles(model) if r["observed"] is not None]
    both = [r for r in rows if r["forecast"] is not None and r["forecast_naive"] is not None
            and r["drifted"] is not None and (r["samples"] or 0) >= MIN_WINDOW_SAMPLES]
    obs = [[r["observed"]] for r in both]
    arima, naive = [[r["forecast"]] for r in both], [[r["forecast_naive"]] for r in both]
    return {"windows": len({r["window_start"] for r in both}), "pairs": len(both),
            "arima_mape": mape(arima, obs), "naive_mape": mape(naive, obs),
            "arima_wape": wape(arima, obs), "naive_wape": wape(naive, obs),
            "sampling_mape": sampling_mape([r["observed"] for r in both],
                                           [r["samples"] for r in both]),
            "window_s": PROFILE_WINDOW_S, "min_window_samples": MIN_WINDOW_SAMPLES}


def live_options(args) -> dict[str, Any]:
    """The simulation's options (model, mixes, batches, seed, SLO, constraint) read for one
    live configuration: the first mix and batch, ``--workers`` and ``--seconds``."""
    from services.bench.e3 import options

    args.model = getattr(args, "model", None) or "minilm-topics"
    opt = options(args)
    workers = getattr(args, "workers", None) or 2
    seconds = getattr(args, "seconds", None) or 40.0
    if workers < 1 or not seconds > 0:
        raise ValueError("--workers must be >= 1 and --seconds > 0")
    warm = getattr(args, "warm_s", None)
    warm = WARM_S if warm is None else float(warm)
    return {**opt, "batch": opt["batches"][-1] if getattr(args, "batches", None) is None
            else opt["batches"][0], "mix": opt["mixes"][0], "workers": int(workers),
            "seconds": float(seconds), "warm_s": warm,
            "adapt": bool(getattr(args, "adapt", False)),
            "shadow_rate": shadow_rate_of(args)}


def shadow_rate_of(args) -> float:
    """``--shadow-rate``, else the configured ``OFFRAMP_SHADOW_RATE``."""
    from services.common import config

    rate = getattr(args, "shadow_rate", None)
    rate = config.load().shadow_rate if rate is None else float(rate)
    if not 0.0 <= rate <= 1.0:
        raise ValueError(f"--shadow-rate must lie in [0, 1], got {rate}")
    return rate


def run_policy(cfg, setup, model: str, policy: str, rate: float, opt: dict[str, Any],
               xs: list, samples: np.ndarray, slo_ms: float, ids: list[int],
               thresholds: dict[int, float], say) -> dict[str, Any]:
    """One phase of one policy on its own stack: its figures over the measured part."""
    n = math.ceil(rate * (opt["warm_s"] + opt["seconds"]))
    arrivals = poisson(rate, n=n, seed=opt["seed"])
    req = [xs[int(s)] for s in samples[:n]]
    started = time.time()
    with policy_stack(cfg, model, policy, opt["workers"], say) as (sup, url):
        set_policy(cfg, url, model, policy, ids, thresholds)
        outs, batches = asyncio.run(_phase(cfg, sup, url, model, req, arrivals, slo_ms,
                                           opt["warm_s"]))
        used = workers_in_plan(cfg, model) if policy == "e3" else opt["workers"]
    measured = [o for o in outs if arrivals[o.index] >= opt["warm_s"]]
    final = setup.trace.final_pred[samples[:n]]
    fig = phase_figures(measured, {i: int(final[i]) for i in range(n)}, opt["warm_s"],
                        float(arrivals[-1]), slo_ms, float(used or opt["workers"]))
    fig.update({"rate_rps": rate, "mean_batch_by_stage": batches})
    if policy == "e3":
        fig["plans"] = plans_of(cfg, model, started)
    if policy != "vanilla":
        fig["tuner"] = tuner_moves(cfg, model, started)
    say(f"{policy} at {rate:.1f} req/s: goodput {fig['goodput_rps']:.1f}/s, p50 "
        f"{fig['p50_ms']} ms, agreement {fig['agreement']}, batches {batches}")
    return fig


def adapted_thresholds(cfg, model: str, start: dict[int, float]) -> dict[int, float]:
    """The thresholds of ``start``'s ramps in the newest exit config of a finished phase
    (what its tuner reached); a ramp the config does not hold keeps its start value."""
    with Store(cfg.database_url) as store:
        latest = store.latest_exit_config(model)
    have = {} if latest is None else {int(k): float(v) for k, v in latest.thresholds.items()}
    return {r: have.get(r, t) for r, t in start.items()}


def run_live(args) -> dict[str, Any]:
    """Both phases of the three policies (see the module docstring); the JSON document."""
    import shutil

    from services.bench.e3 import build_setup
    from services.common import config
    from services.runtime.manifest import Manifest

    say = inputs.say_stderr
    opt = live_options(args)
    setup = build_setup(opt, say)
    base = config.load()
    model = opt["model"]
    manifest = Manifest.load(base.models_dir / model)
    ramp_ids = sorted(r.index for r in manifest.ramps)
    useful = [ramp_ids[s] for s in setup.useful]
    tuned = setup.start if opt["adapt"] else setup.thresholds
    thresholds = {ramp_ids[s]: float(tuned[s]) for s in setup.useful}
    cpu = setup.classes[-1]
    b = opt["batch"]
    batch_ms = float(cpu.table.blocks_at(b).sum())
    slo_ms = opt["slo_ms"] or 10.0 * float(cpu.table.blocks_at(16).sum())
    # the profile ran one process on every core: what vanilla gets from this machine, however
    # many workers share it
    capacity = b / (batch_ms / 1e3)
    say(f"{model}: {len(useful)} useful ramps {useful}; batch {b} takes {batch_ms:.2f} ms "
        f"(measured on all cores): vanilla ~{capacity:.0f} req/s on this machine; SLO "
        f"{slo_ms:.0f} ms{'; the tuner adapts compute-mode runs' if opt['adapt'] else ''}")
    xs = trace_inputs(manifest, setup.trace.n_samples, opt["trace_seed"])
    n_max = math.ceil(min(LOAD * capacity, MAX_RATE) * (opt["warm_s"] + opt["seconds"])) + 1
    samples = pol.mix_stream(setup.easy, setup.hard, pol.parse_mix(opt["mix"]), n_max,
                             opt["seed"])
    root = base.home / "bench-e3" / model

    def home(policy: str):
        d = root / policy
        return bench_config(d, base.models_dir, model, b, slo_ms,
                            opt["adapt"] and policy != "vanilla", opt["shadow_rate"])

    shutil.rmtree(root, ignore_errors=True)
    rate = min(LOAD * capacity, MAX_RATE)
    saturated = {p: run_policy(home(p), setup, model, p, rate, opt, xs, samples,
                               slo_ms, useful, thresholds, say) for p in POLICIES}
    common_rate = COMMON_LOAD * min(f["goodput_rps"] for f in saturated.values())
    start = {p: adapted_thresholds(home(p), model, thresholds)
             if opt["adapt"] and p != "vanilla" else thresholds for p in POLICIES}
    common = {p: run_policy(home(p), setup, model, p, common_rate, opt, xs, samples, slo_ms,
                            useful, start[p], say) for p in POLICIES}
    for p in POLICIES:
        common[p]["start_thresholds"] = {str(k): v for k, v in start[p].items()}
    return assemble(opt, model, slo_ms, useful, thresholds, saturated, common, home("e3"),
                    setup.info)


def assemble(opt: dict[str, Any], model: str, slo_ms: float, useful: list[int],
             thresholds: dict[int, float], saturated: dict[str, Any], common: dict[str, Any],
             e3_cfg, info: dict[str, Any]) -> dict[str, Any]:
    """The JSON document: both phases, and per policy the keys the issue names (the
    saturated goodput and agreement, the common phase's latency and cost)."""
    from services.bench.report import machine

    plans = [p for f in (saturated["e3"], common["e3"]) for p in f.get("plans", [])]
    doc: dict[str, Any] = {
        "mode": "live", "model": model, "machine": machine(), "workers": opt["workers"],
        "batch": opt["batch"], "mix": opt["mix"], "seed": opt["seed"], "slo_ms": slo_ms,
        "seconds": opt["seconds"], "warm_s": opt["warm_s"], "adapt": opt["adapt"],
        "shadow_rate": opt["shadow_rate"],
        "useful_ramps": useful, "thresholds": {str(k): v for k, v in thresholds.items()},
        "saturated": saturated, "common": common,
        "forecast_mape": forecast_errors(e3_cfg, model),
        "optimizer_ms": percentile([p["optimizer_ms"] for p in plans
                                    if p["optimizer_ms"] is not None], 50),
        "setup": info}
    for p in POLICIES:
        doc[p] = {"goodput_rps": saturated[p]["goodput_rps"], "p50_ms": common[p]["p50_ms"],
                  "p99_ms": common[p]["p99_ms"], "agreement": saturated[p]["agreement"],
                  "cost": common[p]["cost"]}
    return doc


def _f(x: Any, fmt: str = ".1f") -> str:
    return "-" if x is None else format(x, fmt)


def table_row(p: str, s: dict[str, Any], c: dict[str, Any]) -> str:
    """One policy: saturated (``s``) and common (``c``) phase figures."""
    batches = ", ".join(f"{k}: {v:.1f}" for k, v in sorted(s["mean_batch_by_stage"].items()))
    moves = " / ".join(f"{x['tuner']['alert']}+{x['tuner']['slack']}" if "tuner" in x else "-"
                       for x in (s, c))
    return (f"| {p} | {_f(s['goodput_rps'])} req/s at {_f(s['rate_rps'])} | "
            f"{_f(s['agreement'], '.4f')} / {_f(c['agreement'], '.4f')} | "
            f"{_f(100 * s['early_share'] if s.get('early_share') is not None else None, '.0f')} % | "
            f"{_f(c['p50_ms'])} / {_f(c['p99_ms'])} ms | {_f(c['cost'], '.2f')} | "
            f"{batches or '-'} | {moves} |")


def table(doc: dict[str, Any]) -> str:
    lines = [(f"bench e3 (live, {doc['model']}, {doc['workers']} workers, batch {doc['batch']}, "
             f"mix {doc['mix']}, SLO {doc['slo_ms']:.0f} ms, thresholds "
             f"{'adapted by the tuner' if doc.get('adapt') else 'static'}, shadow feedback "
             f"{100 * doc.get('shadow_rate', 0.0):g} %)"),
             ("| policy | goodput (saturated) | agreement (saturated / common) | answered "
              "early (saturated) | p50 / p99 (common rate) | cost (worker-s / 1000, common) "
              "| mean batch by stage (saturated) | tuner alerts + savings tunes (saturated "
              "/ common) |"),
             "|---|---|---|---|---|---|---|---|"]
    lines += [table_row(p, doc["saturated"][p], doc["common"][p]) for p in POLICIES]
    v, n, e = (doc["saturated"][p]["goodput_rps"] for p in POLICIES)
    lines.append(f"E3 / vanilla {e / v:.2f}x, E3 / naive {e / n:.2f}x (saturated goodput); "
                 f"optimizer {_f(doc['optimizer_ms'], '.1f')} ms per plan; forecast MAPE ARIMA "
                 f"{_f(doc['forecast_mape']['arima_mape'])} % vs naive "
                 f"{_f(doc['forecast_mape']['naive_mape'])} % over "
                 f"{doc['forecast_mape']['windows']} windows (sampling noise alone: "
                 f"{_f(doc['forecast_mape'].get('sampling_mape'))} %)")
    return "\n".join(lines)

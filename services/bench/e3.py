"""``offramp bench e3 --sim``: vanilla vs naive early exit vs E3, simulated (E3 §5.1, §5.4).

    offramp bench e3 --sim --json OUT [--model chain-cnn|minilm-topics] [--devices 16,48]
        [--device-profile FILE | --gpu-curve ID] [--batches 1,4,8,16]
        [--mixes 80/20,50/50,20/80] [--seed N] [--trace-seed N] [--requests N]
        [--slo-ms MS] [--constraint 0.01]

A simulation (``services.sim.e3_sim``), not a live run: the live half, on real pool
workers, does not exist yet (without ``--sim`` the command says so and exits 2).

Inputs (``services.bench.e3_inputs``): the model's measured CPU profile, a trace of its
workload, an exit config tuned to the accuracy constraint, device classes (the measured
CPU, and a GPU class modeled from published A40 curves, or ``--device-profile``), and the
links between stages. Per configuration (class x devices x batch x mix), the three
policies (``services.sim.e3_policies``) serve the same requests at the same arrival times:

- the stream: requests drawn from the easy and hard pools in the mix's proportions,
  seeded by ``--seed``; every configuration of a mix serves a prefix of the same stream;
- saturated run: Poisson arrivals (seeded by ``--seed``) at ``LOAD`` x the highest
  expected capacity of the three policies (vanilla and naive from their expected batch
  times, E3 from the optimizer's plan for an unbounded rate), doubled once if a policy
  still kept up. Every policy is saturated, so its goodput (answers within the SLO per
  second after the warm-up) is what it sustains, as E3 §5 compares goodputs. A run lasts
  ``DURATION_SLOS`` SLOs of arrivals, at least ``--requests`` requests (default 20,000),
  at most ``MAX_REQUESTS``;
- latency run: the three again at a common rate, ``COMMON_LOAD`` x the lowest of their
  goodputs, where none is overloaded: p50/p99 there (a saturated queue's latencies sit at
  the SLO's edge and are reported apart);
- SLO: ``--slo-ms``, else 10 x the class's batch-16 full-model time (per run in the JSON);
- E3's plan is made for the offered rate with the survival the profiler would forecast:
  ARIMA (``services.profiler.survival_forecast``) over the stream's first
  ``WARM_SAMPLES`` requests cut into ``WARM_WINDOWS`` windows.

The forecast check (``forecast_mape``): the headline run's per-window survival after every
useful ramp (``FORECAST_WINDOWS`` equal-count windows), each window forecast from the
ones before it by ARIMA and by the last value (naive), MAPE against what was observed; on
that stream and on one as long switching 80/20 -> 50/50 -> 20/80 (E3 §5.4).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from services.bench import e3_inputs as inputs
from services.bench.e3_report import clean, report_table
from services.bench.report import machine
from services.optimizer.block_costs import ModelChain, monotone_survival
from services.optimizer.splits import DeploymentPlan, DeviceClass, Problem, plan
from services.profiler.batch_profile import mape
from services.profiler.survival_forecast import (
    ArimaForecaster,
    NaiveForecaster,
    forecast_profile,
)
from services.sim import e3_policies as pol
from services.sim.e3_sim import Pipeline, exit_sites, simulate, summarize
from services.tuner.controller import DEFAULT_TUNE_SHARE

LOAD = 2.0             # offered rate: x the highest expected capacity of the three policies
MAX_DOUBLINGS = 1      # ... doubled when a policy kept up with it
COMMON_LOAD = 0.8      # latency run: x the lowest goodput of the three, for all three
DURATION_SLOS = 3.0    # a run lasts at least this many SLOs of arrivals ...
DEFAULT_REQUESTS = 20000  # ... and at least --requests requests
MAX_REQUESTS = 250_000    # ... and at most this many (or --requests if larger)
WARMUP = 0.1           # figures skip the first 10 % of a run's arrivals ...
WARMUP_SLOS = 1.0      # ... and at least its first SLO
WARM_SAMPLES = 16000   # E3's plan: ARIMA over the survival of the stream's first samples
WARM_WINDOWS = 8       # ... cut into this many windows (2,000 samples each)
FORECAST_WINDOWS = 30


@dataclass(frozen=True)
class Setup:
    """Everything a configuration is simulated with (see the module docstring)."""

    model: str
    trace: Any
    thresholds: np.ndarray          # every ramp tuned to the constraint on the trace (static)
    start: np.ndarray               # the same with the tuner's headroom: where a tuner starts
    useful: tuple[int, ...]
    ramp_after: tuple[int, ...]
    classes: tuple[inputs.ClassProfile, ...]
    bytes_per_sample: tuple[float, ...]
    easy: np.ndarray
    hard: np.ndarray
    info: dict[str, Any]


@dataclass(frozen=True)
class Stream:
    """One mix's requests (a run takes a prefix): the trace sample of each request, unit-
    rate Poisson arrivals (divided by a run's rate), and the survival forecast of the
    first ``WARM_SAMPLES`` requests that E3 plans with."""

    mix: str
    samples: np.ndarray
    unit_arrivals: np.ndarray
    survival: tuple[float, ...]


def _ints(text: str, what: str) -> tuple[int, ...]:
    try:
        vals = tuple(int(x) for x in str(text).split(",") if x.strip())
    except ValueError:
        raise ValueError(f"{what} is a comma list of integers, got {text!r}") from None
    if not vals or min(vals) < 1:
        raise ValueError(f"{what} needs positive integers, got {text!r}")
    return vals


def options(args: argparse.Namespace) -> dict[str, Any]:
    """The bench's options, checked (ValueError names the bad one)."""
    mixes = [m.strip() for m in (getattr(args, "mixes", None) or "80/20,50/50,20/80").split(",")]
    for m in mixes:
        pol.parse_mix(m)
    requests = getattr(args, "requests", None) or DEFAULT_REQUESTS
    if requests < 20:
        raise ValueError("--requests must be at least 20")
    slo = getattr(args, "slo_ms", None)
    if slo is not None and not slo > 0:
        raise ValueError("--slo-ms must be positive")
    return {"model": getattr(args, "model", None) or "chain-cnn",
            "devices": _ints(getattr(args, "devices", None) or "16,48", "--devices"),
            "batches": _ints(getattr(args, "batches", None) or "1,4,8,16", "--batches"),
            "mixes": mixes, "requests": requests, "seed": int(getattr(args, "seed", 0) or 0),
            "slo_ms": slo, "constraint": float(getattr(args, "constraint", 0.01)),
            "device_profile": getattr(args, "device_profile", None),
            "gpu_curve": getattr(args, "gpu_curve", None),
            "trace_seed": inputs.TRACE_SEED if getattr(args, "trace_seed", None) is None
            else int(args.trace_seed)}


def build_setup(opt: dict[str, Any], say: inputs.Say) -> Setup:
    """Profile, trace, exit config, classes and pools of the model (I/O, cached)."""
    from services.common import config
    from services.runtime.devices import device_class
    from services.runtime.manifest import Manifest

    model_dir = config.load().models_dir / opt["model"]
    if not (model_dir / "manifest.json").is_file():
        raise ValueError(f"{opt['model']} is not prepared under {model_dir.parent} "
                         f"(run `offramp prepare {opt['model']}`)")
    manifest = Manifest.load(model_dir)
    trace, trace_path, cached = inputs.model_trace(model_dir, manifest, say,
                                                   seed=opt["trace_seed"])
    ids = sorted(r.index for r in manifest.ramps)
    prof = inputs.measured_profile(model_dir, manifest, say)
    cpu_table, cpu_full = inputs.profile_table(prof, manifest.num_blocks, ids)
    link, bus = inputs.bus_link(say)
    cpu = inputs.ClassProfile(device_class("cpu"), cpu_table, False,
                              f"measured on this machine ({prof['how']})", link=link,
                              per_device_links=False)
    # the model's compute picks the modeled curve, unless a class or curve is given
    mmacs = (inputs.model_mmacs(model_dir, manifest)
             if not opt["device_profile"] and opt["gpu_curve"] is None else None)
    first = (inputs.file_class(Path(opt["device_profile"]), cpu_table, cpu_full)
             if opt["device_profile"] else
             inputs.gpu_class(cpu_table, cpu_full, subnet=opt["gpu_curve"], model_mmacs=mmacs))
    th, exit_info = inputs.tuned_thresholds(trace, opt["constraint"])
    # a tuner that adapts starts where its own tunes land: headroom below the constraint
    start, start_info = inputs.tuned_thresholds(trace, DEFAULT_TUNE_SHARE * opt["constraint"])
    ramp_after = tuple(manifest.ramp(r).after_block for r in ids)
    every = exit_sites(trace.ramp_score, th, tuple(range(trace.n_sites)))
    useful = pol.useful_sites(th, every)
    exits = exit_sites(trace.ramp_score, th, useful)
    frac = pol.site_cost_fraction(cpu_table, ramp_after)
    easy = pol.easy_mask(exits, frac)
    info = {"profile": {k: prof.get(k) for k in ("measured_at", "cache", "cached", "how",
                                                  "device_class", "load_avg_1m", "inputs")},
            "trace": {"path": str(trace_path), "cached": cached, "samples": trace.n_samples,
                      **{k: trace.meta.get(k) for k in ("workload", "seed", "model_version")}},
            "exit_config": {**exit_info, "useful_ramps": list(useful),
                            "exit_rates": _exit_rates(exits, trace.n_sites)},
            "adaptive_start": {k: start_info[k] for k in ("thresholds", "constraint",
                                                          "agreement_on_trace")},
            "pools": {"easy": int(easy.sum()), "hard": int((~easy).sum()),
                      "definition": "easy: exits (every useful ramp active) at a ramp whose "
                      "batch-1 block time up to it is <= 50% of the whole model's on the "
                      "measured CPU table; hard: a later ramp or the final layer",
                      "ramp_cost_fraction": [round(float(x), 4) for x in frac]}}
    info["bus"] = bus
    info["model_mmacs"] = None if mmacs is None else round(mmacs, 1)
    return Setup(opt["model"], trace, th, start, useful, ramp_after, (first, cpu),
                 inputs.activation_bytes(manifest, ids), np.flatnonzero(easy),
                 np.flatnonzero(~easy), info)


def _exit_rates(exits: np.ndarray, n_sites: int) -> dict[str, float]:
    out = {str(s): float((exits == s).mean()) for s in range(n_sites) if (exits == s).any()}
    return out | {"final": float((exits < 0).mean())}


def make_stream(setup: Setup, mix: str, n: int, seed: int) -> Stream:
    """A mix's ``n`` samples and unit-rate Poisson arrivals, and the warm-up forecast."""
    from services.workloads.arrivals import poisson

    samples = pol.mix_stream(setup.easy, setup.hard, pol.parse_mix(mix), n, seed)
    unit = poisson(1.0, n=n, seed=seed)
    warm = samples[:WARM_SAMPLES]
    exits = exit_sites(setup.trace.ramp_score[:, warm], setup.thresholds, setup.useful)
    return Stream(mix, samples, unit, warm_forecast(exits, setup))


def warm_forecast(exits: np.ndarray, setup: Setup) -> tuple[float, ...]:
    """Survival after every site as ARIMA forecasts it from the warm-up's windows
    (sites where no sample exits keep the survival of the site before)."""
    n_sites = len(setup.ramp_after)
    wins = pol.window_survival(exits, n_sites, WARM_WINDOWS)
    useful = list(setup.useful)
    fc = forecast_profile([[w[s] for w in wins] for s in useful]) if useful else ()
    out, cur = [], 1.0
    for s in range(n_sites):
        cur = fc[useful.index(s)] if s in setup.useful else cur
        out.append(cur)
    return monotone_survival(out)


def timed_plan(p: Problem, times: list[float]) -> DeploymentPlan:
    t0 = time.perf_counter()
    out = plan(p)
    times.append((time.perf_counter() - t0) * 1e3)
    return out


def pipelines(setup: Setup, cls: inputs.ClassProfile, devices: int, batch: int,
              stream: Stream, slo: float, boost: float = 1.0
              ) -> tuple[dict[str, Pipeline], float, dict[str, Any]]:
    """The three policies for one configuration, the offered rate, and the plan's report."""
    chain = ModelChain(cls.table.n_blocks, setup.ramp_after, stream.survival)
    dc = DeviceClass(cls.name, devices, cls.table, cls.cost_per_s)
    van = pol.vanilla_pipeline(cls.table, setup.ramp_after, devices, batch, cls.name,
                               cls.cost_per_s)
    naive = pol.naive_pipeline(chain, cls.table, setup.useful, devices, batch, cls.name,
                               cls.cost_per_s)
    caps = [pol.capacity_rps(van), pol.capacity_rps(naive)]
    times: list[float] = []
    transfer = cls.transfer(setup.bytes_per_sample)
    probe = timed_plan(pol.e3_problem(chain, dc, 10 * max(caps), slo, batch, transfer), times)
    rate = LOAD * max(caps + ([probe.goodput] if probe.feasible else [])) * boost
    p = pol.e3_problem(chain, dc, rate, slo, batch, transfer)
    planned = timed_plan(p, times)
    about = {"feasible": planned.feasible, "reason": planned.reason,
             "stages": [_stage_doc(s) for s in planned.stages], "cuts": list(planned.cuts),
             "expected_goodput_rps": planned.goodput, "expected_latency_ms": planned.latency_ms,
             "survival_forecast": [round(x, 4) for x in stream.survival],
             "optimizer_ms": times,
             "expected_capacity_rps": {"vanilla": caps[0], "naive_ee": caps[1],
                                       "e3": probe.goodput if probe.feasible else None}}
    return {"vanilla": van, "naive_ee": naive, "e3": pol.e3_pipeline(p, planned)}, rate, about


def _stage_doc(s) -> dict[str, Any]:
    return {"blocks": [s.first_block, s.last_block], "device_class": s.device_class,
            "replicas": s.replicas, "batch": s.batch, "active_ramps": list(s.active_ramps),
            "ms": round(s.ms, 4), "transfer_ms": round(s.transfer_ms, 4),
            "survival_in": round(s.survival_in, 4)}


def run_length(stream: Stream, rate: float, slo: float, minimum: int) -> int:
    """Requests of a run at ``rate``: ``DURATION_SLOS`` SLOs of arrivals, at least
    ``minimum``, at most the stream."""
    n = int(np.searchsorted(stream.unit_arrivals, rate * DURATION_SLOS * slo / 1e3)) + 1
    return min(max(n, minimum), stream.samples.size)


def run_config(setup: Setup, cls: inputs.ClassProfile, devices: int, batch: int,
               stream: Stream, opt: dict[str, Any]) -> dict[str, Any]:
    """One configuration: every policy on the same requests and arrivals, saturated (a
    policy that kept up, nothing dropped or late, could sustain more: the run is repeated
    at twice the rate, up to ``MAX_DOUBLINGS`` times), then all three at the common load."""
    slo = opt["slo_ms"] or pol.default_slo_ms(cls.table)
    for k in range(MAX_DOUBLINGS + 1):
        pipes, rate, about = pipelines(setup, cls, devices, batch, stream, slo, 2.0 ** k)
        n = run_length(stream, rate, slo, opt["requests"])
        out: dict[str, Any] = {"device_class": cls.name, "modeled": cls.modeled,
                               "devices": devices, "batch": batch, "mix": stream.mix,
                               "rate_rps": rate, "rate_doublings": k, "requests": n,
                               "slo_ms": slo, "plan": about}
        out |= {name: serve(setup, pipe, stream, n, rate, slo) for name, pipe in pipes.items()}
        kept_up = [p for p in pipes if out[p]["dropped"] + out[p]["late"] == 0]
        if not kept_up:
            break
    else:
        out["not_saturated"] = kept_up
    out["fusion_bound"] = pol.fusion_bound(cls.table, out["naive_ee"]["mean_batch_at_blocks"],
                                           batch)
    common = COMMON_LOAD * min(out[p]["goodput_rps"] for p in pipes)
    out["common_load_rps"] = common
    if common > 0:
        n = run_length(stream, common, slo, opt["requests"])
        for name, pipe in pipes.items():
            r = serve(setup, pipe, stream, n, common, slo)
            out[name]["at_common_load"] = {k: r[k] for k in (
                "goodput_rps", "p50_ms", "p99_ms", "dropped", "late")} | {"requests": n}
    return out


def serve(setup: Setup, pipe: Pipeline, stream: Stream, n: int, rate: float,
          slo: float) -> dict[str, Any]:
    """One policy's run over the first ``n`` requests at ``rate``, and its summary."""
    arrival = stream.unit_arrivals[:n] / rate
    tr, idx = setup.trace, stream.samples[:n]
    ex = exit_sites(tr.ramp_score[:, idx], setup.thresholds, pipe.active)
    answer = np.where(ex >= 0, tr.ramp_pred[np.maximum(ex, 0), idx], tr.final_pred[idx])
    res = simulate(pipe, arrival, ex, slo)
    span = float(arrival[-1] - arrival[0]) if n > 1 else 0.0
    warm = min(0.5, max(WARMUP, WARMUP_SLOS * slo / 1e3 / span if span > 0 else 0.0))
    s = summarize(pipe, res, arrival, answer == tr.final_pred[idx], slo, warm)
    return s.to_dict() | {
        "warmup": warm,
        "stages": [[st.first_block, st.last_block, st.replicas] for st in pipe.stages],
        "mean_batch_at_blocks": [round(float(x), 3) for x in res.mean_batch_at_blocks()]}


def forecast_check(setup: Setup, steady: np.ndarray, mix: str, seed: int) -> dict[str, Any]:
    """ARIMA vs naive one-window-ahead survival forecasts over the headline run's requests
    (``steady``) and a stream as long switching mixes (see the module docstring)."""
    out: dict[str, Any] = {"windows": FORECAST_WINDOWS, "ramps": list(setup.useful),
                           "samples": int(steady.size),
                           "what": "per-window survival after each useful ramp (equal-count "
                           "windows); each window forecast from the windows before it; MAPE "
                           "in percent (batch_profile.mape)"}
    if not setup.useful:
        return out
    third = steady.size // 3
    switching = np.concatenate([
        pol.mix_stream(setup.easy, setup.hard, pol.parse_mix(m), third, seed + k)
        for k, m in enumerate(("80/20", "50/50", "20/80"))])
    for name, samples in ((f"steady {mix}", steady),
                          ("switching 80/20 -> 50/50 -> 20/80", switching)):
        ex = exit_sites(setup.trace.ramp_score[:, samples], setup.thresholds, setup.useful)
        wins = pol.window_survival(ex, len(setup.ramp_after), FORECAST_WINDOWS)
        obs = [tuple(w[s] for s in setup.useful) for w in wins]
        res = {}
        for label, fc in (("arima", ArimaForecaster()), ("naive", NaiveForecaster())):
            preds = [forecast_profile([[o[j] for o in obs[:w]] for j in range(len(obs[0]))], fc)
                     for w in range(1, len(obs))]
            res[f"{label}_mape"] = mape(preds, obs[1:])
        out[name] = res
    return out


def headline_of(opt: dict[str, Any], setup: Setup) -> dict[str, Any]:
    """The headline configuration: the first class (modeled GPU unless --device-profile),
    the first --devices, the largest batch, the first mix."""
    return {"device_class": setup.classes[0].name, "modeled": setup.classes[0].modeled,
            "devices": opt["devices"][0], "batch": max(opt["batches"]), "mix": opt["mixes"][0]}


def headline_run(runs: list[dict[str, Any]], head: dict[str, Any]) -> dict[str, Any]:
    key = ("device_class", "devices", "batch", "mix")
    return next(r for r in runs if all(r[k] == head[k] for k in key))


def policy_doc(run: dict[str, Any], name: str) -> dict[str, Any]:
    """A policy's headline figures: goodput, agreement and cost of the saturated run,
    latencies at the common load (the saturated run's are in ``saturated``)."""
    r = run[name]
    common = r.get("at_common_load") or {}
    return {"goodput_rps": r["goodput_rps"], "p50_ms": common.get("p50_ms"),
            "p99_ms": common.get("p99_ms"), "agreement": r["agreement"], "cost": r["cost"],
            "mean_batch": r["mean_batch"], "devices": r["devices"],
            "saturated": {k: r[k] for k in ("p50_ms", "p99_ms", "dropped", "late")}}


def settings(opt: dict[str, Any], setup: Setup) -> dict[str, Any]:
    return {
        "requests_min": opt["requests"], "requests_max": max(MAX_REQUESTS, opt["requests"]),
        "seed": opt["seed"], "load": LOAD, "common_load": COMMON_LOAD,
        "duration_slos": DURATION_SLOS, "warmup": WARMUP, "warmup_slos": WARMUP_SLOS,
        "slo": "--slo-ms" if opt["slo_ms"] else "10 x the class's batch-16 full-model time",
        "arrivals": f"Poisson at {LOAD:g} x the highest expected capacity of the three policies "
                    "(every policy saturated; doubled when one kept up); a run lasts "
                    f"{DURATION_SLOS:g} SLOs of arrivals (at least requests_min requests)",
        "goodput": "answers within the SLO given from the end of the warm-up (10% of the "
                   "arrivals, at least one SLO) to the last arrival, per second",
        "latency": f"p50/p99 of all three at a common load: {COMMON_LOAD:g} x the lowest "
                   "goodput of the three, same requests and arrival times",
        "e3_plan_survival": f"ARIMA forecast over the first {WARM_SAMPLES} requests of the "
                            f"mix's stream in {WARM_WINDOWS} windows",
        "transfer": {"bytes_per_sample": list(setup.bytes_per_sample),
                     "links": {c.name: c.describe()["link"] for c in setup.classes}}}


def assemble(opt: dict[str, Any], setup: Setup, runs: list[dict[str, Any]],
             forecast: dict[str, Any]) -> dict[str, Any]:
    """The JSON document (keys in the module docstring of ``services.bench.e3_report``)."""
    head = headline_of(opt, setup)
    run = headline_run(runs, head)
    times = [t for r in runs for t in r["plan"]["optimizer_ms"]]
    steady = forecast.get(f"steady {head['mix']}") or {}
    return {
        "mode": "simulated", "model": setup.model,
        "headline": head | {k: run[k] for k in ("rate_rps", "common_load_rps", "slo_ms",
                                                "requests")},
        **{p: policy_doc(run, p) for p in pol.POLICIES},
        "e3_over_naive_ee": _ratio(run, "naive_ee"), "e3_over_vanilla": _ratio(run, "vanilla"),
        "fusion_bound": run["fusion_bound"],
        "optimizer_ms": float(np.median(times)),
        "optimizer_ms_stats": {"plans": len(times), "median": float(np.median(times)),
                               "max": float(np.max(times))},
        "plan": run["plan"], "forecast_mape": steady.get("arima_mape"), "forecast": forecast,
        "device_class": setup.classes[0].describe(),
        "device_classes": [c.describe() for c in setup.classes],
        "acceptance": acceptance(runs, head), "settings": settings(opt, setup), "runs": runs,
        **setup.info, "machine": machine()}


def _ratio(run: dict[str, Any], base: str) -> float | None:
    g = run[base]["goodput_rps"]
    return run["e3"]["goodput_rps"] / g if g > 0 else None


def acceptance(runs: list[dict[str, Any]], head: dict[str, Any]) -> dict[str, Any]:
    """The issue's targets, as measured (reported, never tuned for)."""
    run = headline_run(runs, head)
    b1 = [{"device_class": r["device_class"], "devices": r["devices"], "mix": r["mix"],
           "e3_over_best_baseline": r["e3"]["goodput_rps"] / max(
               r["vanilla"]["goodput_rps"], r["naive_ee"]["goodput_rps"], 1e-12)}
          for r in runs if r["batch"] == 1]
    return {"e3_over_naive_ee": _ratio(run, "naive_ee"), "target_over_naive_ee": 1.74,
            "e3_over_vanilla": _ratio(run, "vanilla"), "target_over_vanilla": 1.3,
            "batch_1": b1, "batch_1_worst": min((x["e3_over_best_baseline"] for x in b1),
                                                default=None),
            "target_batch_1": 0.97}


def run_e3(args: argparse.Namespace) -> int:
    if getattr(args, "accuracy", False):
        return run_e3_accuracy(args)
    if not getattr(args, "sim", False):
        return run_e3_live(args)
    say = inputs.say_stderr
    try:
        opt = options(args)
        setup = build_setup(opt, say)
        size = max(MAX_REQUESTS, opt["requests"])
        streams = {m: make_stream(setup, m, size, opt["seed"]) for m in opt["mixes"]}
    except (ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    runs = []
    for cls in setup.classes:
        for d in opt["devices"]:
            for b in opt["batches"]:
                for m in opt["mixes"]:
                    runs.append(run_config(setup, cls, d, b, streams[m], opt))
        say(f"simulated {len(runs)} configurations ...")
    head = headline_run(runs, headline_of(opt, setup))
    steady = streams[head["mix"]].samples[:head["requests"]]
    forecast = forecast_check(setup, steady, head["mix"], opt["seed"])
    doc = clean(assemble(opt, setup, runs, forecast))
    print(report_table(doc))
    Path(args.json).write_text(json.dumps(doc, indent=1) + "\n")
    return 0


def run_e3_accuracy(args: argparse.Namespace) -> int:
    """Compute mode's accuracy loop in replay (``services.bench.e3_accuracy``)."""
    from services.bench import e3_accuracy

    try:
        return e3_accuracy.run_accuracy(args)
    except (ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def run_e3_live(args: argparse.Namespace) -> int:
    """The live half (``services.bench.e3_live``)."""
    from services.bench import e3_live

    try:
        doc = clean(e3_live.run_live(args))
    except (ValueError, OSError, RuntimeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(e3_live.table(doc))
    Path(args.json).write_text(json.dumps(doc, indent=1) + "\n")
    return 0

"""The printed report of ``offramp bench e3 --sim`` and the JSON's cleaning.

JSON keys (``services.bench.e3.assemble``): ``mode`` ("simulated"), ``model``,
``headline`` (device class, devices, batch, mix, rate, SLO of the headline configuration),
``vanilla`` / ``naive_ee`` / ``e3`` (goodput_rps, agreement and cost = device-seconds per
1,000 answers within the SLO, of the saturated run; p50_ms and p99_ms at the common load;
mean_batch per stage, devices; ``saturated``: p50/p99, dropped and late of that run),
``e3_over_naive_ee``, ``e3_over_vanilla``, ``fusion_bound`` (the most E3 could gain over
naive early exit in that run: ``e3_policies.fusion_bound``), ``optimizer_ms`` (median wall time of one
``plan`` call; ``optimizer_ms_stats``), ``plan`` (the headline plan), ``forecast_mape``
(ARIMA, headline stream; ``forecast`` has ARIMA and naive on both streams),
``device_class`` (the headline class; ``modeled: true`` when it is), ``device_classes``,
``acceptance`` (the issue's targets as measured), ``runs`` (every configuration with the
three policies), ``settings``, ``profile``, ``trace``, ``exit_config``, ``pools``,
``machine``. Non-finite numbers are written as null.
"""

from __future__ import annotations

import math
from typing import Any

from services.sim.e3_policies import POLICIES


def clean(x: Any) -> Any:
    """``x`` with NaN and infinities as None (JSON has neither) and numpy scalars as floats."""
    if isinstance(x, dict):
        return {k: clean(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [clean(v) for v in x]
    if isinstance(x, bool | int | str) or x is None:
        return x
    try:
        f = float(x)
    except (TypeError, ValueError):
        return str(x)
    return f if math.isfinite(f) else None


def _f(x: Any, fmt: str = ".1f") -> str:
    return "n/a" if x is None or (isinstance(x, float) and not math.isfinite(x)) else \
        format(x, fmt)


def _inputs(doc: dict[str, Any]) -> list[str]:
    p, t, e, pools = doc["profile"], doc["trace"], doc["exit_config"], doc["pools"]
    s = doc["settings"]
    lines = [
        f"offramp bench e3: SIMULATED, {doc['model']} (seed {s['seed']})",
        f"  arrivals: {s['arrivals']}", f"  goodput: {s['goodput']}",
        f"  latency: {s['latency']}; SLO {s['slo']}",
        (f"  CPU profile {p['device_class']}: {'cached, ' if p['cached'] else ''}measured "
         f"{p['measured_at']} ({p['cache']})"),
        f"  trace: {t['samples']} {t['workload']} samples ({t['path']})",
        (f"  exit config: thresholds {e['thresholds']} tuned to {e['constraint']:.0%} loss "
         f"(agreement {e['agreement_on_trace']:.3f} on the trace, "
         f"{e['held_out_agreement']:.3f} held out); useful ramps {e['useful_ramps']}"),
        f"  pools: {pools['easy']} easy / {pools['hard']} hard ({pools['definition']})",
        f"  E3 plans with: {s['e3_plan_survival']}"]
    for c in doc["device_classes"]:
        tag = "MODELED" if c["modeled"] else "measured"
        link = c["link"]
        lines.append(f"  class {c['name']} ({tag}): full model ms by batch {c['full_ms']}; "
                     f"{c['source']}")
        lines.append(f"    link between stages: {link['fixed_ms']:.3f} ms per message + "
                     f"{link['ms_per_byte'] * 1e6:.3g} ms per MB, "
                     f"{'one per device' if link.get('per_device') else 'one channel per cut'} "
                     f"({link['source']})")
    return lines


def _headline(doc: dict[str, Any]) -> list[str]:
    h = doc["headline"]
    tag = " (MODELED)" if h["modeled"] else ""
    lines = [(f"headline: {h['devices']} x {h['device_class']}{tag}, batch {h['batch']}, mix "
              f"{h['mix']}, SLO {h['slo_ms']:.1f} ms; saturated at {h['rate_rps']:.0f} req/s "
              f"({h['requests']} requests), latency at {_f(h['common_load_rps'], '.0f')} req/s"),
             (f"  {'policy':<9} {'goodput/s':>10} {'p50 ms':>8} {'p99 ms':>8} {'agree':>6} "
              f"{'cost':>8} {'dev':>4} {'dropped':>7} {'late':>5}  mean batch per stage")]
    for name in POLICIES:
        r = doc[name]
        sat = r["saturated"]
        lines.append(f"  {name:<9} {_f(r['goodput_rps'], '.0f'):>10} {_f(r['p50_ms']):>8} "
                     f"{_f(r['p99_ms']):>8} {_f(r['agreement'], '.3f'):>6} "
                     f"{_f(r['cost'], '.3f'):>8} {r['devices']:>4} {sat['dropped']:>7} "
                     f"{sat['late']:>5}  " + " ".join(_f(b) for b in r["mean_batch"]))
    lines.append(f"  E3 / naive EE {_f(doc['e3_over_naive_ee'], '.2f')}x (paper: up to 1.74x), "
                 f"E3 / vanilla {_f(doc['e3_over_vanilla'], '.2f')}x (paper: up to 1.30x); cost "
                 "= device-seconds per 1,000 answers within the SLO; dropped/late: saturated run")
    if doc.get("fusion_bound") is not None:
        lines.append(f"  perfect fusion (naive's rows in full batches, block time only) would "
                     f"be {doc['fusion_bound']:.2f}x naive EE: the most E3 can gain here")
    return lines


def _plan(doc: dict[str, Any]) -> list[str]:
    pl, st = doc["plan"], doc["optimizer_ms_stats"]
    lines = [f"plan: {pl['reason']}"]
    for i, s in enumerate(pl["stages"]):
        lines.append(f"  stage {i}: blocks {s['blocks'][0]}-{s['blocks'][1]} on "
                     f"{s['replicas']} x {s['device_class']}, batch {s['batch']}, ramps "
                     f"{s['active_ramps']}, {s['ms']:.2f} ms a batch, transfer "
                     f"{s['transfer_ms']:.2f} ms, {s['survival_in']:.0%} of samples reach it")
    lines.append(f"optimizer: {st['median']:.1f} ms per plan (median of {st['plans']}, max "
                 f"{st['max']:.1f} ms)")
    f = doc["forecast"]
    for k, v in f.items():
        if isinstance(v, dict):
            lines.append(f"forecast MAPE, {k}: ARIMA {_f(v['arima_mape'], '.2f')}% vs naive "
                         f"{_f(v['naive_mape'], '.2f')}% ({f['windows']} windows, ramps "
                         f"{f['ramps']})")
    return lines


def _runs(doc: dict[str, Any]) -> list[str]:
    lines = [(f"{'class':<13} {'dev':>3} {'B':>2} {'mix':>5} {'rate/s':>7} {'SLO':>6} | "
              f"{'goodput vanilla':>15} {'naive':>7} {'e3':>7} | {'e3/nv':>5} {'e3/van':>6} | "
              f"{'p99 van':>7} {'naive':>7} {'e3':>7} | {'agree nv':>8} {'e3':>5} | e3 stages")]
    for r in doc["runs"]:
        v, n, e = (r[p] for p in POLICIES)
        p99 = [(x.get("at_common_load") or {}).get("p99_ms") for x in (v, n, e)]
        stages = "+".join(f"{a}-{b}x{m}" for a, b, m in e["stages"])
        cls = r["device_class"]
        cls += "-modeled" if r["modeled"] and "modeled" not in cls else ""
        lines.append(
            f"{cls:<13} {r['devices']:>3} {r['batch']:>2} {r['mix']:>5} "
            f"{r['rate_rps']:>7.0f} {r['slo_ms']:>6.0f} | {_f(v['goodput_rps'], '.0f'):>15} "
            f"{_f(n['goodput_rps'], '.0f'):>7} {_f(e['goodput_rps'], '.0f'):>7} | "
            f"{_f(_div(e, n), '.2f'):>5} {_f(_div(e, v), '.2f'):>6} | {_f(p99[0]):>7} "
            f"{_f(p99[1]):>7} {_f(p99[2]):>7} | {_f(n['agreement'], '.3f'):>8} "
            f"{_f(e['agreement'], '.3f'):>5} | {stages}"
            + ("  (not saturated: " + ",".join(r["not_saturated"]) + ")"
               if r.get("not_saturated") else ""))
    return lines


def _div(a: dict[str, Any], b: dict[str, Any]) -> float | None:
    return a["goodput_rps"] / b["goodput_rps"] if b["goodput_rps"] else None


def report_table(doc: dict[str, Any]) -> str:
    a = doc["acceptance"]
    tail = [(f"batch 1: E3 / the better baseline, worst over runs {_f(a['batch_1_worst'], '.3f')} "
             f"(target >= {a['target_batch_1']})"),
            "every figure is SIMULATED; classes marked MODELED are not measured on that device"]
    return "\n".join(_inputs(doc) + _headline(doc) + _plan(doc)
                     + ["all runs (goodput saturated, p99 at the common load):"] + _runs(doc)
                     + tail)

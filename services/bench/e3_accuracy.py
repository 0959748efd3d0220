"""``offramp bench e3 --accuracy``: does compute mode hold the accuracy constraint, and what
does its feedback cost? A replay (``services.sim.compute_feedback``), not a live run.

    offramp bench e3 --accuracy --json OUT [--model minilm-topics|chain-cnn]
        [--mixes 80/20,...] [--shadow-rate R] [--requests N] [--seed S]
        [--trace-seed T] [--serve-trace-seed U]

The stream and starting config are the E3 bench's (``services.bench.e3``'s setup: the
recorded trace of the model's workload, every useful ramp with the thresholds a tuner starts
from, tuned on the trace with its headroom, and the easy/hard pools). For each mix and
shadow rate, over ``SEEDS`` seeds (each a new stream and a new shadow sample), the tuner's
own compute-mode controller starts from those thresholds and sees only the shadow sample.
Reported per row:

- agreement with the final model over the whole stream: min / median / max over seeds, and
  how many seeds meet the constraint;
- the worst window of ``WINDOW`` requests (about a minute at 100 req/s): the transient a
  live bench phase measures;
- savings: the deployed configs' mean latency savings, % of the full model (batch-1 profile);
- shadow cost: model time the shadow work adds, % of the full model;
- static: the starting thresholds left alone, and the same thresholds scaled down to the
  tuner's savings on each stream (Apparate's claim: static thresholds at equal savings
  do not hold the constraint when the stream moves).

With ``--serve-trace-seed U`` the thresholds come from trace ``T`` as above, and the streams
are drawn from another recording of the workload, trace ``U`` (its own easy and hard pools):
inputs nobody tuned on, as a deployment meets them.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from services.bench import e3
from services.bench.e3_inputs import say_stderr
from services.bench.e3_live import shadow_rate_of
from services.exits.exit_window import ExitWindow
from services.exits.shadow import ShadowSampler
from services.sim import compute_feedback as cf
from services.sim import e3_policies as pol
from services.tuner.controller import mode_controller
from services.tuner.thresholds import evaluate

SEEDS = 8
WINDOW = 6000
DEFAULT_RATES = (0.05, 0.1, 0.2)
MIN_REQUESTS = 30000


def accuracy_options(args) -> dict[str, Any]:
    opt = e3.options(args)
    rates = (DEFAULT_RATES if getattr(args, "shadow_rate", None) is None
             else (shadow_rate_of(args),))
    serve = getattr(args, "serve_trace_seed", None)
    return {**opt, "rates": rates, "requests": max(opt["requests"], MIN_REQUESTS),
            "serve_trace_seed": None if serve is None else int(serve)}


def row_of(setup: e3.Setup, mix: str, rate: float, n: int, seed0: int, constraint: float,
           climb, served: e3.Setup | None = None) -> dict[str, Any]:
    """One mix at one shadow rate, over ``SEEDS`` streams: thresholds from ``setup``,
    streams from ``served`` (its trace and pools; default ``setup``)."""
    served = served or setup
    tr, ids = served.trace, list(setup.useful)
    pred, score, final = tr.ramp_pred[ids], tr.ramp_score[ids], tr.final_pred
    prof = tr.profile()
    start = setup.start[ids]
    runs, static, equal = [], [], []
    for seed in range(seed0, seed0 + SEEDS):
        stream = pol.mix_stream(served.easy, served.hard, pol.parse_mix(mix), n, seed)
        ctrl = mode_controller(prof, ids, start, compute=True, constraint=constraint,
                               climb=climb)
        run = cf.replay_compute(pred, score, final, ids, stream, prof, ctrl,
                                ShadowSampler(rate, seed=seed), id_prefix=f"s{seed}")
        runs.append(run)
        static.append(evaluate(ExitWindow(tuple(ids), pred[:, stream], score[:, stream],
                                          final[stream]), prof, start).agreement)
        equal.append(cf.scaled_to_savings(pred, score, final, ids, stream, prof, start,
                                           float(run.savings_ms.mean()))[1])
    full = prof.full_ms
    agree = [float(r.agree.mean()) for r in runs]
    worst = [r.worst_window(WINDOW) for r in runs]
    return {"mix": mix, "shadow_rate": rate, "seeds": SEEDS, "requests": n,
            "agreement": spread(agree), "meets": sum(a >= 1 - constraint for a in agree),
            "worst_window": spread(worst),
            "worst_window_meets": sum(a >= 1 - constraint for a in worst),
            "savings_pct": 100 * statistics.median(float(r.savings_ms.mean()) for r in runs) / full,
            "exited": statistics.median(float(r.exited.mean()) for r in runs),
            "shadow_cost_pct": 100 * statistics.median(float(r.shadow_ms.mean())
                                                       for r in runs) / full,
            "alerts": statistics.median(r.counts["alerts"] for r in runs),
            "static_agreement": spread(static),
            "static_equal_savings_agreement": spread(equal)}


def spread(xs: list[float]) -> dict[str, float]:
    return {"min": min(xs), "median": statistics.median(xs), "max": max(xs)}


def run_accuracy(args) -> int:
    from services.common import config
    from services.tuner import climb_native

    opt = accuracy_options(args)
    setup = e3.build_setup(opt, say_stderr)
    served = None
    if opt["serve_trace_seed"] not in (None, opt["trace_seed"]):
        served = e3.build_setup({**opt, "trace_seed": opt["serve_trace_seed"]}, say_stderr)
    climb = climb_native.best_climb(config.load().tuner_native)
    rows = []
    for mix in opt["mixes"]:
        for rate in opt["rates"]:
            say_stderr(f"replaying {opt['model']} {mix} at shadow rate {rate:g} "
                       f"({SEEDS} seeds x {opt['requests']} requests) ...")
            rows.append(row_of(setup, mix, rate, opt["requests"], opt["seed"],
                               opt["constraint"], climb, served))
    doc = {"mode": "replay", "model": opt["model"], "constraint": opt["constraint"],
           "window": WINDOW, "rows": rows, "setup": setup.info,
           "tuned_on_trace": opt["trace_seed"],
           "served_trace": opt["trace_seed"] if served is None else opt["serve_trace_seed"],
           "served_setup": None if served is None else served.info,
           "how": "services.sim.compute_feedback: the tuner's compute-mode controller on "
                  "the shadow sample of each stream; savings from the trace's batch-1 profile"}
    Path(args.json).write_text(json.dumps(doc, indent=2, default=float))
    print(table(doc))
    return 0


def table(doc: dict[str, Any]) -> str:
    c = 1 - doc["constraint"]

    def s(d: dict[str, float]) -> str:
        return f"{100 * d['min']:.2f}–{100 * d['max']:.2f} % (median {100 * d['median']:.2f})"

    unseen = ("" if doc.get("served_trace") == doc.get("tuned_on_trace") else
              f", thresholds tuned on trace {doc.get('tuned_on_trace')}, streams from "
              f"trace {doc.get('served_trace')}")
    lines = [(f"bench e3 --accuracy (replay, {doc['model']}, constraint "
              f"{100 * doc['constraint']:g} %: agreement >= {100 * c:g} %{unseen})"),
             (f"| mix | shadow rate | agreement over seeds | seeds meeting | worst "
              f"{doc['window']} requests | savings | shadow cost | static: as started / at "
              "equal savings |"),
             "|---|---|---|---|---|---|---|---|"]
    for r in doc["rows"]:
        lines.append(
            f"| {r['mix']} | {100 * r['shadow_rate']:g} % | {s(r['agreement'])} | "
            f"{r['meets']}/{r['seeds']} | {s(r['worst_window'])}, {r['worst_window_meets']}/"
            f"{r['seeds']} meet | {r['savings_pct']:.1f} % | {r['shadow_cost_pct']:.1f} % | "
            f"{100 * r['static_agreement']['median']:.2f} / "
            f"{100 * r['static_equal_savings_agreement']['median']:.2f} % |")
    return "\n".join(lines)

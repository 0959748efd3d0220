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
import os
import platform
import sys
from pathlib import Path
from typing import Any

import numpy as np

from services.sim.replay import MODE, POLICIES, PolicyResult
from services.tuner import climb_native

ROLL = 64  # samples in the rolling median of the latency plot


def _add(parser: argparse.ArgumentParser, *names: str, **kw: Any) -> None:
    if not any(n in parser._option_string_actions for n in names):  # shared `bench` parser
        parser.add_argument(*names, **kw)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    _add(parser, "--trace", help="apparate: replay trace (.npz) from `offramp trace record`")
    _add(parser, "--json", help="output file")
    _add(parser, "--plot", help="apparate: latency/threshold plot (.svg; .png needs matplotlib)")
    _add(parser, "--arrivals", help="apparate: arrival spec overriding the trace's, e.g. "
         "poisson:10 (default: the trace's arrival_s, else Poisson light load at "
         "LIGHT_LOAD of the full model's capacity)")
    _add(parser, "--seed", type=int, default=0, help="apparate: seed of --arrivals")
    _add(parser, "--constraint", type=float, default=0.01, help="tolerated agreement loss")
    _add(parser, "--budget", type=float, default=0.02, help="ramp budget (share of the model)")
    _add(parser, "--delay-ms", type=float, default=0.0,
         help="apparate: delay before a decided config reaches the worker")
    _add(parser, "--tune-window", type=int, help="apparate: controller tuning window (samples)")
    _add(parser, "--slack-windows", type=int, help="apparate: clean windows per savings tune")
    _add(parser, "--feedback-backlog", type=int, default=None,
         help="apparate replay: runs whose sample answered early that the worker may set "
         "aside for a sample that arrives (default 8, as OFFRAMP_FEEDBACK_BACKLOG; 0: every "
         "run goes to the end)")
    _add(parser, "--grid-rounds", type=int, default=8,
         help="apparate: tune rounds compared with grid search (0: skip)")
    _add(parser, "--live", action="store_true",
         help="apparate: run the policies live on the embedded stack (with --model and "
         "--workload) instead of replaying a trace")
    _add(parser, "--workload", choices=["video", "text"],
         help="apparate --live: the generated stream (video frames or drifting texts)")
    _add(parser, "--repeat", type=int, default=1,
         help="apparate --live: run the whole vanilla/static/offramp sequence this many "
         "times and report medians (the machine drifts between sequential runs)")
    _add(parser, "--scene-frames", metavar="MIN:MAX",
         help="apparate --live, video: scene lengths in frames (default 16:120; a fixed "
         "camera's run far longer, e.g. 600:1800)")


def _machine() -> dict[str, Any]:
    return {"cpus": os.cpu_count(), "platform": platform.platform(),
            "python": platform.python_version(), "load_avg": list(os.getloadavg())}


def _pct(x: np.ndarray | list[float], q: float) -> float | None:
    return float(np.percentile(x, q)) if len(x) else None


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
            "tuning_ms_p50": _pct(wall["tune"], 50), "tuning_ms_p95": _pct(wall["tune"], 95),
            "adjust_ms_p50": _pct(wall["adjust"], 50), "adjust_ms_p95": _pct(wall["adjust"], 95),
            "record_ms_p50": _pct(wall["record"], 50), "climb": climb_native.engine(),
            "timing_passes": off.extra.get("timing_passes", 1),
            "grid_gap": grid.get("grid_gap"), "grid": grid,
            "counts": off.extra["counts"], "tunes": len(wall["tune"]),
            "adjusts": len(wall["adjust"]),
            "active_ramps_mean": float(off.extra["n_active"].mean()),
            "offramp_timeline": [d for d in dec if d["changed"]],
        })
    out["machine"] = _machine()
    return out


def table(doc: dict[str, Any]) -> str:
    n = doc["trace_meta"].get("n_samples", "?")
    lines = [(f"offramp bench apparate: {MODE} of {doc['trace']} ({n} samples; arrivals "
             f"{doc['arrivals']}; one worker, FIFO, batch 1, feedback backlog "
             f"{doc.get('feedback_backlog', 0)}; constraint {doc['constraint']:.1%})"),
             (f"{'policy':<9} {'p25 ms':>7} {'p50 ms':>7} {'p95 ms':>7} {'mean ms':>7} "
             f"{'agreement':>9} {'worst win':>9} {'exits':>6}")]
    for name in POLICIES:
        s = doc.get(name)
        if s is not None:
            lines.append(f"{name:<9} {s['p25_ms']:>7.2f} {s['p50_ms']:>7.2f} {s['p95_ms']:>7.2f} "
                         f"{s['mean_ms']:>7.2f} {s['agreement']:>9.4f} "
                         f"{s['worst_window_agreement']:>9.3f} {s['exit_rate']:>6.2f}")
    if "vanilla" in doc and "offramp" in doc:
        v, o = doc["vanilla"], doc["offramp"]
        lines.append(f"offramp vs vanilla: p25 {o['p25_ms'] / v['p25_ms'] - 1:+.1%}, p50 "
                     f"{o['p50_ms'] / v['p50_ms'] - 1:+.1%}, p95 {o['p95_ms'] / v['p95_ms'] - 1:+.1%}"
                     f", mean {o['mean_ms'] / v['mean_ms'] - 1:+.1%}")
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


def draw(roll: dict[str, np.ndarray], th: np.ndarray, active: np.ndarray, path: Path,
         title: str) -> Path:
    """Latency (rolling medians per policy), offramp's thresholds (sites x samples, NaN where
    inactive) and its active-ramp count over the stream, to ``path`` (.svg without
    matplotlib)."""
    try:
        import matplotlib  # noqa: F401  (optional: not a dependency)
    except ImportError:
        if path.suffix.lower() != ".svg":
            raise ValueError(f"{path.suffix} plots need matplotlib (not installed): use .svg") \
                from None
        path.write_text(_svg(roll, th, active, title))
        return path
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(3, 1, figsize=(10, 8), sharex=True)
    for name, y in roll.items():
        ax[0].plot(np.arange(y.size) + ROLL - 1, y, label=name, lw=1)
    ax[0].set_ylabel(f"latency ms (rolling median {ROLL})")
    ax[0].legend()
    for s in range(th.shape[0]):
        if np.isfinite(th[s]).any():
            ax[1].plot(th[s], lw=1, label=f"ramp {s}")
    ax[1].set_ylabel("offramp threshold")
    ax[1].legend(ncol=6, fontsize=7)
    ax[2].step(np.arange(active.size), active, where="post")
    ax[2].set_ylabel("active ramps")
    ax[2].set_xlabel("sample")
    fig.suptitle(f"{title}: latency, thresholds and active ramps")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


_COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
           "#7f7f7f", "#bcbd22", "#17becf", "#393b79", "#637939")


def _svg(roll: dict[str, np.ndarray], th: np.ndarray, active: np.ndarray,
         title: str = MODE) -> str:
    """Three stacked panels as a dependency-free SVG (lines downsampled to <= 1000 points)."""
    w, h, left, top, gap = 960, 200, 70, 40, 50
    n = max([y.size + ROLL - 1 for y in roll.values()] + [active.size, 1])
    parts = [(f'<svg xmlns="http://www.w3.org/2000/svg" width="{w + left + 150}" '
             f'height="{top + 3 * (h + gap)}" font-family="sans-serif" font-size="11">'),
             (f'<text x="{left}" y="20" font-size="14">{title}: latency, thresholds, active '
             'ramps</text>')]

    def panel(i: int, title: str, series: list[tuple[str, np.ndarray, np.ndarray]],
              ymax: float) -> None:
        y0 = top + i * (h + gap)
        ymax = ymax if ymax > 0 else 1.0
        parts.append(f'<rect x="{left}" y="{y0}" width="{w}" height="{h}" fill="none" '
                     'stroke="#999"/>')
        parts.append(f'<text x="{left}" y="{y0 - 6}">{title}</text>')
        for frac in (0.0, 0.5, 1.0):
            yy = y0 + h - frac * h
            parts.append(f'<text x="{left - 6}" y="{yy + 4:.1f}" text-anchor="end">'
                         f'{frac * ymax:.3g}</text>')
        parts.append(f'<text x="{left + w}" y="{y0 + h + 14}" text-anchor="end">sample {n}</text>')
        for j, (label, xs, ys) in enumerate(series):
            color = _COLORS[j % len(_COLORS)]
            step = max(1, xs.size // 1000)
            pts, runs = [], []
            for x, y in zip(xs[::step], ys[::step]):
                if np.isfinite(y):
                    pts.append(f"{left + w * x / n:.1f},{y0 + h - h * min(y, ymax) / ymax:.1f}")
                elif pts:
                    runs.append(pts)
                    pts = []
            runs.append(pts)
            for r in (r for r in runs if r):
                parts.append(f'<polyline fill="none" stroke="{color}" stroke-width="1" '
                             f'points="{" ".join(r)}"/>')
            parts.append(f'<text x="{left + w + 10}" y="{y0 + 12 + 13 * j}" fill="{color}">'
                         f'{label}</text>')

    lat = [(k, np.arange(y.size) + ROLL - 1.0, y) for k, y in roll.items()]
    panel(0, f"latency ms, rolling median of {ROLL}", lat,
          max((float(y.max()) for _, _, y in lat), default=1.0) * 1.05)
    ths = [(f"ramp {s}", np.arange(th.shape[1], dtype=float), th[s]) for s in range(th.shape[0])
           if np.isfinite(th[s]).any()]
    panel(1, "offramp thresholds (gaps: ramp inactive)", ths,
          max((float(np.nanmax(y)) for _, _, y in ths), default=1.0) * 1.05)
    panel(2, "offramp active ramps", [("active", np.arange(active.size, dtype=float),
                                       active.astype(float))], float(max(active.max(), 1))
          if active.size else 1.0)
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


LIGHT_LOAD = 0.2  # utilisation of the default arrivals for a trace without its own


def light_load(full_ms: float) -> str:
    """A Poisson arrival spec that keeps one vanilla worker ``LIGHT_LOAD`` busy."""
    return f"poisson:{LIGHT_LOAD * 1000.0 / full_ms:.4g}"


def run(args: argparse.Namespace) -> int:
    from services.sim.replay import FEEDBACK_BACKLOG, arrivals_for, run_replay
    from services.sim.trace import Trace, TraceError

    if (getattr(args, "feedback_backlog", None) or 0) < 0:
        print("error: --feedback-backlog must be >= 0", file=sys.stderr)
        return 2
    if getattr(args, "live", False):
        from services.bench import apparate_live

        if getattr(args, "trace", None):
            print("error: bench apparate takes --trace FILE (replay) or --live (not both)",
                  file=sys.stderr)
            return 2
        args.requests = 2000 if getattr(args, "requests", None) is None else args.requests
        args.model = getattr(args, "model", None) or "efficientnet-lite0"
        return apparate_live.run(args)
    if not getattr(args, "trace", None) or not getattr(args, "json", None):
        print("error: bench apparate needs --trace FILE (replay) or --live --model M "
              "--workload W, and --json OUT", file=sys.stderr)
        return 2
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
    backlog = FEEDBACK_BACKLOG if args.feedback_backlog is None else args.feedback_backlog
    print(f"replaying {trace.n_samples} samples x {trace.n_sites} ramps ...", file=sys.stderr,
          flush=True)
    results = run_replay(trace, arrivals, constraint=args.constraint, budget=args.budget,
                         delay_s=args.delay_ms / 1e3, grid_rounds=args.grid_rounds,
                         controller=ctl, feedback_backlog=backlog)
    meta = {**trace.meta, "n_samples": trace.n_samples, "n_sites": trace.n_sites,
            "full_ms": float(trace.prefix_ms[-1])}
    params = {"constraint": args.constraint, "budget": args.budget,
              "decision_delay_ms": args.delay_ms, "worker": "single, FIFO, batch size 1",
              "feedback_backlog": backlog,
              "controller": results["offramp"].extra["params"]}
    doc = report(results, str(args.trace), meta, args.arrivals or "trace arrival_s", params)
    print(table(doc))
    Path(args.json).write_text(json.dumps(doc, indent=1, default=float) + "\n")
    if getattr(args, "plot", None):
        try:
            print(f"plot: {plot(results, trace.n_sites, Path(args.plot))}", file=sys.stderr)
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="offramp bench apparate")
    add_arguments(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())

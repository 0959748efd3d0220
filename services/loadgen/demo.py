"""The demo: start the embedded stack and stream the same video-like frames from
real photos twice — through the vanilla model (no ramps) and through offramp with the
adaptive loop on (the tuner, from the initial deployment) — then print both side by side."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from dataclasses import replace

import numpy as np

from services.common import config as config_mod
from services.exits.latency_profile import LatencyProfile
from services.launcher.exit_config import set_exit_config
from services.launcher.supervisor import prepare_state
from services.loadgen.live import adaptive_run, running_stack, stream_live
from services.runtime.manifest import Manifest
from services.workloads.answer_changes import AnswerChanges, answer_changes
from services.workloads.arrivals import light_load, stream_arrivals
from services.workloads.frames import image_input, iter_video_frames, parse_scene_frames
from services.zoo.registry import sample_inputs

# What the demo streams unless told otherwise: a fixed camera (scenes of 600-1,800 frames)
# at light load (Poisson arrivals keeping one vanilla worker LIGHT_LOAD busy), the regime
# latency mode's early answers are for. One request in flight instead (``--concurrency``)
# makes each frame wait for the previous one's remaining layers, which no exit saves.
DEMO_SCENES = "600:1800"


def demo_load(concurrency: int | None, arrivals: str | None, full_ms: float
              ) -> tuple[str | None, int]:
    """(arrival spec or None for closed loop, requests in flight) from the demo's flags:
    ``--concurrency`` alone is closed loop, else ``--arrivals`` or light load."""
    if concurrency is not None and arrivals is not None:
        raise ValueError("give --concurrency (closed loop) or --arrivals (open loop), not both")
    if concurrency is not None:
        if concurrency < 1:
            raise ValueError(f"--concurrency must be >= 1, got {concurrency}")
        return None, concurrency
    if arrivals is not None:
        return arrivals, 1
    return light_load(full_ms), 1


def run(args: argparse.Namespace) -> int:
    cfg = replace(config_mod.load(), models=(args.model,))
    say = lambda m: print(f"demo: {m}", file=sys.stderr)
    try:
        # typos fail before any waiting
        scenes = None if args.scene_frames is None else parse_scene_frames(args.scene_frames)
        demo_load(args.concurrency, args.arrivals, 1.0)
        seed = getattr(args, "seed", 1)
        if seed < 0:
            raise ValueError(f"--seed must be >= 0, got {seed}")
        if args.arrivals is not None:
            stream_arrivals(args.arrivals, 1, seed)
        prepare_state(cfg, say=say)

        manifest = Manifest.load(cfg.models_dir / args.model)
        if scenes is None and takes_images(manifest):
            scenes = parse_scene_frames(DEMO_SCENES)
        arrivals, concurrency = demo_load(args.concurrency, args.arrivals,
                                          LatencyProfile.from_manifest(manifest).full_ms)
        arrival_s = (None if arrivals is None
                     else stream_arrivals(arrivals, args.requests, seed))
        inputs = demo_inputs(cfg, args.model, args.requests, scenes, seed)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    with running_stack(cfg, args.model, say, features=False) as (_, url):
        set_exit_config(cfg, url, args.model, 0.0, [], "none", "demo: vanilla run (no ramps)")
        vanilla, answered = asyncio.run(stream_live(cfg, url, args.model, inputs, arrival_s,
                                                    "vanilla", concurrency))
    # The adaptive run starts where a fresh deployment does: evenly spaced ramps within the
    # budget, thresholds 0, prepared heads; the tuner takes it from there on live feedback,
    # refitting ramp heads from the features the workers publish.
    with running_stack(cfg, args.model, say, features=True) as (sup, url):
        adaptive, _, active = adaptive_run(cfg, sup, url, manifest, inputs, arrival_s, "demo",
                                           concurrency)
    prof = LatencyProfile.from_manifest(manifest)
    deployment = {"active": active, "ramp_budget": cfg.ramp_budget, "full_ms": prof.full_ms,
                  "cheapest_ramp_ms": float(prof.ramp_cost_ms.min()) if prof.n_sites else None,
                  "ramp_serving": manifest.meta.get("ramp_serving", "split")}
    summary = {"model": args.model, "requests": args.requests, "seed": seed,
               "concurrency": concurrency, "arrivals": arrivals,
               "scene_frames": None if scenes is None else f"{scenes[0]}:{scenes[1]}",
               "vanilla": vanilla, "offramp": adaptive,
               "answer_changes": answer_changes(
                   [o.label for o in sorted(answered, key=lambda o: o.index) if o.ok]).to_dict(),
               "deployment": deployment}
    print_summary(summary)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=2)
    return 0 if vanilla["errors"] == 0 and adaptive["errors"] == 0 else 1


def takes_images(manifest) -> bool:
    try:
        image_input(manifest.inputs)
    except ValueError:
        return False
    return True


def demo_inputs(cfg, model: str, n: int, scenes: tuple[int, int] | None = None,
                seed: int = 1) -> list[dict[str, np.ndarray]]:
    """The stream both runs send: the model's sample inputs (video frames for image models),
    or, with ``scenes`` (min, max frames per scene), video frames with those scene lengths;
    ``seed`` picks the stream (the same frames as ``offramp bench apparate --seed``)."""
    if scenes is None:
        batch = sample_inputs(model, n, seed=seed)
    else:
        name, size, dtype = image_input(Manifest.load(cfg.models_dir / model).inputs)
        frames = [f for f, _ in iter_video_frames(n, seed=seed, size=size, min_scene=scenes[0],
                                                  max_scene=scenes[1], dtype=dtype)]
        batch = {name: np.concatenate(frames) if frames else np.zeros([0, 3, size, size], dtype)}
    return [{k: v[i] for k, v in batch.items()} for i in range(n)]


def print_summary(s: dict) -> None:
    def fmt(v, spec):
        return "-" if v is None else format(v, spec)

    v, o = s["vanilla"], s["offramp"]

    def change(key):
        if v.get(key) and o.get(key) is not None:
            return f"{100 * (o[key] - v[key]) / v[key]:+.1f}%"
        return ""

    rows = [("requests (ok / errors)", f"{v['ok']} / {v['errors']}", f"{o['ok']} / {o['errors']}", ""),
            ("p25 latency", f"{fmt(v['p25_ms'], '.1f')} ms", f"{fmt(o['p25_ms'], '.1f')} ms", change("p25_ms")),
            ("p50 latency", f"{fmt(v['p50_ms'], '.1f')} ms", f"{fmt(o['p50_ms'], '.1f')} ms", change("p50_ms")),
            ("p95 latency", f"{fmt(v['p95_ms'], '.1f')} ms", f"{fmt(o['p95_ms'], '.1f')} ms", change("p95_ms")),
            ("p50 serving (router)", f"{fmt(v.get('serving_p50_ms'), '.1f')} ms",
             f"{fmt(o.get('serving_p50_ms'), '.1f')} ms", change("serving_p50_ms")),
            ("p50 / p75 way in (client -> router)",
             f"{fmt(v.get('way_in_p50_ms'), '.1f')} / {fmt(v.get('way_in_p75_ms'), '.1f')} ms",
             f"{fmt(o.get('way_in_p50_ms'), '.1f')} / {fmt(o.get('way_in_p75_ms'), '.1f')} ms", ""),
            ("p50 way back (router -> client)", f"{fmt(v.get('way_back_p50_ms'), '.1f')} ms",
             f"{fmt(o.get('way_back_p50_ms'), '.1f')} ms", ""),
            ("early-exit share", fmt(v["early_share"], ".1%"), fmt(o["early_share"], ".1%"), ""),
            ("agreement with final model", fmt(v["agreement"], ".2%"), fmt(o["agreement"], ".2%"), ""),
            ("exit configs seen", str(v["config_versions"]), str(o["config_versions"]), ""),
            ("throughput", f"{v['throughput_rps']:.1f} req/s", f"{o['throughput_rps']:.1f} req/s", "")]
    w = max(len(r[0]) for r in rows)
    scenes = f" (scenes of {s['scene_frames']} frames)" if s.get("scene_frames") else ""
    print(f"\nofframp demo: {s['model']}, {s['requests']} video-like frames per run{scenes}, "
          + (f"arrivals {s['arrivals']} (open loop, live)" if s.get("arrivals")
             else f"{s['concurrency']} in flight (live)"))
    print(f"  {'':<{w}}  {'vanilla':>14}  {'offramp':>14}  {'change':>8}")
    for k, a, b, c in rows:
        print(f"  {k:<{w}}  {a:>14}  {b:>14}  {c:>8}")
    print("  (offramp = the initial deployment + the tuner adapting thresholds and ramps and "
          "refitting ramp heads live; "
          "accuracy constraint 1%; latency: at the client, end to end; serving: the router's "
          "record, from receiving a request to learning its answer; the ways in and back: "
          "the client's times against the router's, one clock)")
    if (ch := s.get("answer_changes")) is not None:
        print(f"  stream: {AnswerChanges.from_dict(ch).describe()}, in vanilla's "
              "answers; a ramp must follow each change to exit within the constraint")
    d = s.get("deployment") or {}
    if d.get("cheapest_ramp_ms") is not None:
        cheapest = d["cheapest_ramp_ms"] / d["full_ms"]
        print(f"  initial deployment: {len(d['active'])} ramps active within the "
              f"{d['ramp_budget']:.0%} ramp budget; the cheapest ramp costs "
              f"{d['cheapest_ramp_ms']:.3f} ms to serve here ({cheapest:.2%} of the model: "
              + ("its head and tap in the stage's one call" if d.get("ramp_serving") == "tapped"
                 else "its stage splits there") + ")" + ("" if d["active"] else
              "; raise OFFRAMP_RAMP_BUDGET to trade worst-case latency for exits"))

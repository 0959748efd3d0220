"""``offramp demo``: start the embedded stack and stream the same video-like frames from
real photos twice — through the vanilla model (no ramps) and through offramp with the
adaptive loop on (the tuner, from the initial deployment) — then print both side by side."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from datetime import UTC, datetime

import numpy as np

from services.common import bus
from services.common import config as config_mod
from services.common.load import (
    Progress,
    attach_serving,
    await_config,
    drive,
    drive_open,
    percentile,
)
from services.common.supervisor import Deployment, Supervisor, prepare_state
from services.models.arrivals import make_arrivals
from services.models.workloads import image_input, parse_scene_frames

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
    from services.bench.apparate import light_load

    return light_load(full_ms), 1


def run_demo(args: argparse.Namespace) -> int:
    os.environ["OFFRAMP_MODELS"] = args.model
    cfg = config_mod.load()
    say = lambda m: print(m, file=sys.stderr)
    try:
        # typos fail before any waiting
        scenes = None if args.scene_frames is None else parse_scene_frames(args.scene_frames)
        demo_load(args.concurrency, args.arrivals, 1.0)
        seed = getattr(args, "seed", 1)
        if seed < 0:
            raise ValueError(f"--seed must be >= 0, got {seed}")
        if args.arrivals is not None:
            make_arrivals(args.arrivals, n=1, seed=(seed, 0xA7))
        prepare_state(cfg, say=say)
        from services.models.manifest import Manifest
        from services.tuner.window import LatencyProfile

        manifest = Manifest.load(cfg.models_dir / args.model)
        if scenes is None and _takes_images(manifest):
            scenes = parse_scene_frames(DEMO_SCENES)
        arrivals, concurrency = demo_load(args.concurrency, args.arrivals,
                                          LatencyProfile.from_manifest(manifest).full_ms)
        arrival_s = (None if arrivals is None
                     else make_arrivals(arrivals, n=args.requests, seed=(seed, 0xA7)))
        inputs = demo_inputs(cfg, args.model, args.requests, scenes, seed)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    sup = Supervisor(cfg, Deployment((args.model,)), log_dir=cfg.home / "logs")
    deployment: dict = {}
    try:
        url = sup.start()
        say(f"demo: NATS at {url}; service logs in {cfg.home / 'logs'}")
        sup.wait_ready()
        from services.exit_config_cli import set_exit_config

        set_exit_config(cfg, url, args.model, 0.0, [], "none", "demo: vanilla run (no ramps)")
        vanilla, _ = asyncio.run(stream_live(cfg, url, args.model, inputs, arrival_s,
                                             "vanilla", concurrency))
        # The adaptive run starts where a fresh deployment does: evenly spaced ramps within
        # the budget, thresholds 0; the tuner takes it from there on live feedback.
        adaptive, _, active = adaptive_run(cfg, sup, url, manifest, inputs, arrival_s, "demo",
                                           concurrency)
        prof = LatencyProfile.from_manifest(manifest)
        deployment = {"active": active, "ramp_budget": cfg.ramp_budget,
                      "full_ms": prof.full_ms,
                      "cheapest_ramp_ms": float(prof.ramp_cost_ms.min()) if prof.n_sites else None,
                      "ramp_serving": manifest.meta.get("ramp_serving", "split")}
    finally:
        sup.stop()
    summary = {"model": args.model, "requests": args.requests, "seed": seed,
               "concurrency": concurrency, "arrivals": arrivals,
               "scene_frames": None if scenes is None else f"{scenes[0]}:{scenes[1]}",
               "vanilla": vanilla, "offramp": adaptive,
               "deployment": deployment}
    _print_summary(summary)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=2)
    return 0 if vanilla["errors"] == 0 and adaptive["errors"] == 0 else 1


def _takes_images(manifest) -> bool:
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
        from services.models.zoo import sample_inputs

        batch = sample_inputs(model, n, seed=seed)
    else:
        from services.models.manifest import Manifest
        from services.models.workloads import iter_video_frames

        name, size, dtype = image_input(Manifest.load(cfg.models_dir / model).inputs)
        frames = [f for f, _ in iter_video_frames(n, seed=seed, size=size, min_scene=scenes[0],
                                                  max_scene=scenes[1], dtype=dtype)]
        batch = {name: np.concatenate(frames) if frames else np.zeros([0, 3, size, size], dtype)}
    return [{k: v[i] for k, v in batch.items()} for i in range(n)]


def adaptive_run(cfg, sup: Supervisor, url: str, manifest, inputs: list,
                 arrival_s: np.ndarray | None, who: str, concurrency: int = 1
                 ) -> tuple[dict, list, list[int]]:
    """offramp's run: the initial deployment (evenly spaced ramps within the budget,
    thresholds 0) with the tuner service adapting it live beside the running stack. Returns
    the run's summary and outcomes (``stream_live``) and the initial active ramps."""
    from services.exit_config_cli import set_exit_config
    from services.worker.exits import initial_ramps

    model = manifest.name
    active = initial_ramps(manifest, cfg.ramp_budget)
    set_exit_config(cfg, url, model, 0.0, [], ",".join(map(str, active)) or "none",
                    f"{who}: offramp's initial deployment")
    tuner = subprocess.Popen([sys.executable, "-m", "services.cli", "serve", "tuner"],
                             env={**sup.env}, stdout=subprocess.DEVNULL,
                             stderr=open(cfg.home / "logs" / f"{who}-tuner.log", "ab"))  # noqa: SIM115
    try:
        time.sleep(2.0)  # connected and subscribed before the first request
        summary, outcomes = asyncio.run(stream_live(cfg, url, model, inputs, arrival_s,
                                                    "offramp", concurrency))
    finally:
        tuner.terminate()
        tuner.wait(timeout=15)
    return summary, outcomes, active


async def stream_live(cfg, url: str, model: str, inputs: list, arrival_s: np.ndarray | None,
                      label: str, concurrency: int = 1) -> tuple[dict, list]:
    """Send ``inputs`` through the running stack (open loop at ``arrival_s``, else
    ``concurrency`` in flight) with a progress bar; the run's summary (agreement from the
    monitor's exit profiles) and the client's outcomes."""
    from services.store.repository import Store

    nc = await bus.connect(url, "offramp-demo")
    with Store(cfg.database_url) as store:
        latest = store.latest_exit_config(model)
    if latest is not None and inputs:  # the run starts on the config just set
        await await_config(nc, model, latest.version, inputs[0])
    since = datetime.now(UTC).replace(tzinfo=None)
    t0 = time.perf_counter()
    if arrival_s is None:
        outcomes = await drive(nc, model, inputs, concurrency,
                               on_done=Progress(len(inputs), label))
    else:
        outcomes = await drive_open(nc, model, inputs, arrival_s,
                                    on_done=Progress(len(inputs), label))
    wall = time.perf_counter() - t0
    await nc.close()
    ok = [o for o in outcomes if o.ok]
    # The monitor writes exit profiles and the router's request records from telemetry:
    # wait until they cover the stream.
    store = Store(cfg.database_url)
    agreement, served = None, 0
    for _ in range(50):
        rows = {r["ramp"]: r for r in store.exit_profile_summary(model, since)}
        if agreement is None and -1 in rows and rows[-1]["samples"] >= len(ok):
            agreement = rows[-1]["agreement"]
        if served < len(ok):
            served = attach_serving(outcomes, store.request_latencies(model, since))
        if agreement is not None and served >= len(ok):
            break
        await asyncio.sleep(0.2)
    versions = sorted({o.config_version for o in ok})
    store.close()
    lat = [o.latency_ms for o in ok]
    serving = [o.serving_ms for o in ok if o.serving_ms is not None]
    return {"requests": len(outcomes), "ok": len(ok), "errors": len(outcomes) - len(ok),
            "p25_ms": percentile(lat, 25), "p50_ms": percentile(lat, 50),
            "p95_ms": percentile(lat, 95),
            "serving_p50_ms": percentile(serving, 50), "serving_p95_ms": percentile(serving, 95),
            "early_share": sum(o.early for o in ok) / len(ok) if ok else None,
            "agreement": agreement, "throughput_rps": len(outcomes) / wall,
            "config_versions": len(versions)}, outcomes


def _print_summary(s: dict) -> None:
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
    print("  (offramp = the initial deployment + the tuner adapting thresholds and ramps live; "
          "accuracy constraint 1%; latency: at the client, end to end; serving: the router's "
          "record, from receiving a request to learning its answer)")
    d = s.get("deployment") or {}
    if d.get("cheapest_ramp_ms") is not None:
        cheapest = d["cheapest_ramp_ms"] / d["full_ms"]
        print(f"  initial deployment: {len(d['active'])} ramps active within the "
              f"{d['ramp_budget']:.0%} ramp budget; the cheapest ramp costs "
              f"{d['cheapest_ramp_ms']:.3f} ms to serve here ({cheapest:.2%} of the model: "
              + ("its head and tap in the stage's one call" if d.get("ramp_serving") == "tapped"
                 else "its stage splits there") + ")" + ("" if d["active"] else
              "; raise OFFRAMP_RAMP_BUDGET to trade worst-case latency for exits"))

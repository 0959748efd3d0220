"""``offramp demo``: start the embedded stack, stream real video-like frames, summarise."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from datetime import datetime, timezone

from services.common import bus
from services.common import config as config_mod
from services.common.load import Progress, drive, percentile
from services.common.supervisor import Deployment, Supervisor, prepare_state


def run_demo(args: argparse.Namespace) -> int:
    os.environ["OFFRAMP_MODELS"] = args.model
    cfg = config_mod.load()
    say = lambda m: print(m, file=sys.stderr)  # noqa: E731
    prepare_state(cfg, say=say)
    sup = Supervisor(cfg, Deployment((args.model,)), log_dir=cfg.home / "logs")
    try:
        url = sup.start()
        say(f"demo: NATS at {url}; service logs in {cfg.home / 'logs'}")
        sup.wait_ready()
        from services.exit_config_cli import set_exit_config
        set_exit_config(cfg, url, args.model, args.threshold, [], None,
                        f"demo: static threshold {args.threshold} on every ramp")
        summary = asyncio.run(_stream(cfg, url, args))
    finally:
        sup.stop()
    _print_summary(summary)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=2)
    return 0 if summary["errors"] == 0 else 1


async def _stream(cfg, url: str, args: argparse.Namespace) -> dict:
    from services.models.zoo import sample_inputs
    from services.store.repository import Store

    batch = sample_inputs(args.model, args.requests, seed=1)
    inputs = [{k: v[i] for k, v in batch.items()} for i in range(args.requests)]
    since = datetime.now(timezone.utc).replace(tzinfo=None)
    nc = await bus.connect(url, "offramp-demo")
    await asyncio.sleep(0.5)  # let workers swap in the demo's exit config
    t0 = time.perf_counter()
    outcomes = await drive(nc, args.model, inputs, args.concurrency,
                           on_done=Progress(len(inputs), "demo"))
    wall = time.perf_counter() - t0
    await nc.close()
    ok = [o for o in outcomes if o.ok]
    # The monitor writes exit profiles from telemetry: wait until they cover the stream.
    store = Store(cfg.database_url)
    agreement = None
    for _ in range(50):
        rows = {r["ramp"]: r for r in store.exit_profile_summary(args.model, since)}
        if -1 in rows and rows[-1]["samples"] >= len(ok):
            agreement = rows[-1]["agreement"]
            break
        await asyncio.sleep(0.2)
    store.close()
    lat = [o.latency_ms for o in ok]
    return {"model": args.model, "requests": len(outcomes), "ok": len(ok),
            "errors": len(outcomes) - len(ok), "threshold": args.threshold,
            "p50_ms": percentile(lat, 50), "p95_ms": percentile(lat, 95),
            "early_share": sum(o.early for o in ok) / len(ok) if ok else None,
            "agreement": agreement, "throughput_rps": len(outcomes) / wall}


def _print_summary(s: dict) -> None:
    def fmt(v, spec):
        return "-" if v is None else format(v, spec)

    rows = [("model", s["model"]), ("requests", s["requests"]), ("ok / errors", f"{s['ok']} / {s['errors']}"),
            ("p50 latency", f"{fmt(s['p50_ms'], '.1f')} ms"), ("p95 latency", f"{fmt(s['p95_ms'], '.1f')} ms"),
            ("early-exit share", fmt(s["early_share"], ".1%")),
            ("agreement with final model", fmt(s["agreement"], ".1%")),
            ("throughput", f"{s['throughput_rps']:.1f} req/s"),
            ("exit threshold (static)", s["threshold"])]
    width = max(len(k) for k, _ in rows)
    print("\nofframp demo summary")
    for k, v in rows:
        print(f"  {k:<{width}}  {v}")

"""``offramp bench overhead``: in-process ONNX Runtime vs the full pipeline, side by side.

1. Light load: the same inputs alternate between an in-process run of the model's
   stage (the very code a worker runs: every block and ramp, ONNX Runtime) and one
   request through NATS -> router -> worker -> router -> client. Overhead = the
   difference of medians.
2. Sustained: a closed loop with many requests in flight on a trivial model through
   router + one worker; requests/s and p99.
Always a live run on this machine (no simulation).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from dataclasses import replace

import numpy as np
import uvloop

from schemas.codec import pack
from services.bench.echo import RELAY
from services.common import bus
from services.common import config as config_mod
from services.common.client import infer
from services.common.credentials import login_for
from services.common.hotpath import requester
from services.common.stats import percentile
from services.exits.initial import initial_config, initial_ramps
from services.launcher.supervisor import Deployment, Supervisor, prepare_state
from services.loadgen.drive import drive
from services.runtime.manifest import Manifest
from services.runtime.stage import StageRuntime, spin_for
from services.worker.stage_exec import execute
from services.zoo.registry import sample_inputs


def _inprocess(cfg, model: str):
    manifest = Manifest.load(cfg.models_dir / model)
    runtime = StageRuntime(cfg.models_dir / model, manifest, 0, len(manifest.blocks),
                           device=cfg.device, threads=cfg.ort_threads,
                           spin=spin_for(cfg.ort_spin, None))
    config = initial_config(model, initial_ramps(manifest, cfg.ramp_budget))

    def run(inputs: dict[str, np.ndarray]) -> float:
        batch = {k: v[None] for k, v in inputs.items()}
        t0 = time.perf_counter()
        execute(runtime, manifest.ramps, 0, len(manifest.blocks), batch,
                np.full(1, -1, np.int32), config)
        return (time.perf_counter() - t0) * 1e3

    return run


async def _light_load(nc, cfg, model: str, requests: int) -> dict:
    """Alternate, one at a time on the same inputs: an in-process run, a request through
    the pipeline, and the same request through the bare transport path (relay + echo, see
    ``services.bench.echo``), so the overhead can be split into transport and the rest."""
    run_local = _inprocess(cfg, model)
    floor_path = await requester(nc)  # the request path offramp's client uses
    batch = sample_inputs(model, min(requests, 64), seed=3)
    samples = [{k: v[i] for k, v in batch.items()} for i in range(len(next(iter(batch.values()))))]
    framed = [pack({"v": 1, "id": f"floor-{i}", "model": model, "inputs": s})
              for i, s in enumerate(samples)]
    for i, s in enumerate(samples[:10]):  # warm every path
        run_local(s)
        await infer(nc, model, s, timeout=10)
        await floor_path.request(RELAY, framed[i], timeout=10)
    local, piped, floor = [], [], []
    for i in range(requests):
        s = samples[i % len(samples)]
        local.append(run_local(s))
        t0 = time.perf_counter()
        await infer(nc, model, s, timeout=10)
        t1 = time.perf_counter()
        await floor_path.request(RELAY, framed[i % len(samples)], timeout=10)
        piped.append((t1 - t0) * 1e3)
        floor.append((time.perf_counter() - t1) * 1e3)
        if (i + 1) % max(1, requests // 5) == 0:
            print(f"light load {model} {i + 1}/{requests}", file=sys.stderr, flush=True)
    inp50, pip50, fl50 = percentile(local, 50), percentile(piped, 50), percentile(floor, 50)
    input_bytes = sum(v.nbytes for v in samples[0].values())
    return {"model": model, "input_bytes": input_bytes, "inprocess_p50_ms": inp50,
            "inprocess_p99_ms": percentile(local, 99), "pipeline_p50_ms": pip50,
            "pipeline_p99_ms": percentile(piped, 99), "overhead_p50_ms": pip50 - inp50,
            "transport_floor_p50_ms": fl50, "transport_floor_p99_ms": percentile(floor, 99),
            "overhead_beyond_transport_p50_ms": pip50 - inp50 - fl50}


def _start_floor(url: str, reply_bytes: int) -> list[subprocess.Popen]:
    """The relay and echo processes of the transport floor, started and ready."""
    procs = []
    for role in ("echo", "relay"):
        p = subprocess.Popen([sys.executable, "-m", "services.bench.echo", role, url,
                              str(reply_bytes)], stdout=subprocess.PIPE, text=True)
        if p.stdout is None or p.stdout.readline().strip() != "ready":
            raise RuntimeError(f"bench {role} process did not start")
        procs.append(p)
    return procs


async def _measure(cfg, url: str, args: argparse.Namespace) -> dict:
    nc = await bus.connect(url, "offramp-bench", login=login_for(cfg, "bench"))
    light = {m: await _light_load(nc, cfg, m, args.requests)
             for m in dict.fromkeys([args.model, args.trivial_model])}
    tiny = sample_inputs(args.trivial_model, 256, seed=4)
    tiny_inputs = [{k: v[i] for k, v in tiny.items()} for i in range(256)]
    await drive(nc, args.trivial_model, tiny_inputs, args.concurrency, duration_s=1.0)  # warm-up
    print(f"sustained load: {args.concurrency} in flight for {args.duration:.0f}s ...",
          file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    outs = await drive(nc, args.trivial_model, tiny_inputs, args.concurrency,
                       duration_s=args.duration)
    wall = time.perf_counter() - t0
    await nc.close()
    ok = [o.latency_ms for o in outs if o.ok]
    main = light[args.model]
    return {
        "mode": "live", "model": args.model, "trivial_model": args.trivial_model,
        "requests": args.requests,
        **{k: main[k] for k in ("inprocess_p50_ms", "inprocess_p99_ms", "pipeline_p50_ms",
                                "pipeline_p99_ms", "overhead_p50_ms", "transport_floor_p50_ms",
                                "overhead_beyond_transport_p50_ms")},
        "light_load": light,
        "sustained_rps": len(ok) / wall, "sustained_p50_ms": percentile(ok, 50),
        "sustained_p99_ms": percentile(ok, 99), "sustained_errors": len(outs) - len(ok),
        "sustained_concurrency": args.concurrency, "sustained_duration_s": wall,
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                    "python": platform.python_version()},
    }


def run_overhead(args: argparse.Namespace) -> int:
    cfg = replace(config_mod.load(),
                  models=tuple(dict.fromkeys([args.model, args.trivial_model])))
    prepare_state(cfg, say=lambda m: print(m, file=sys.stderr))
    sup = Supervisor(cfg, Deployment(cfg.models), log_dir=cfg.home / "logs")
    cfg = replace(cfg, ort_spin=sup.ort_spin())  # the in-process runs spin as the workers do
    try:
        url = sup.start()
        sup.wait_ready()
        floor = _start_floor(url, 4 * 1024)  # a reply the size of 1000 float32 logits
        try:
            # The client side on uvloop, as the services are.
            result = uvloop.run(_measure(cfg, url, args))
        finally:
            for p in floor:
                p.terminate()
                p.wait(timeout=10)
    finally:
        sup.stop()
    with open(args.json, "w") as f:
        json.dump(result, f, indent=2)
    print(f"\nofframp bench overhead (live; {os.cpu_count()} cores)")
    print(f"  {'model':<20} {'input':>9} {'in-process p50/p99':>20} {'pipeline p50/p99':>18} "
          f"{'added p50':>10} {'transport p50':>14} {'beyond':>8}")
    for m, r in result["light_load"].items():
        print(f"  {m:<20} {r['input_bytes']:>8}B {r['inprocess_p50_ms']:>9.2f} /{r['inprocess_p99_ms']:>7.2f} ms "
              f"{r['pipeline_p50_ms']:>7.2f} /{r['pipeline_p99_ms']:>6.2f} ms {r['overhead_p50_ms']:>7.2f} ms "
              f"{r['transport_floor_p50_ms']:>11.2f} ms {r['overhead_beyond_transport_p50_ms']:>5.2f} ms")
    print("  (transport: the same request through a bare relay -> echo path, no work; "
          "beyond = added - transport)")
    print(f"  sustained ({args.trivial_model}, router + 1 worker, {args.concurrency} in flight): "
          f"{result['sustained_rps']:.0f} req/s, p50 {result['sustained_p50_ms']:.1f} ms, "
          f"p99 {result['sustained_p99_ms']:.1f} ms, errors {result['sustained_errors']}")
    print(f"  JSON written to {args.json}")
    return 0

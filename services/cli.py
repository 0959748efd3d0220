"""``offramp`` command line: up | serve | prepare | infer | status | demo | bench | db | exit-config."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import os
import signal
import sys
import time
from pathlib import Path

from services.common import config as config_mod
from services.common import logs
from services.common.memory import keep_large_buffers

SERVICES = ("router", "worker", "monitor", "profiler", "tuner")


def _parse_cuts(values: list[str]) -> dict[str, list[int]]:
    out = {}
    for v in values or []:
        model, _, cuts = v.partition("=")
        if not model or not _:
            raise SystemExit(f"--split takes MODEL=CUT[,CUT...], got {v!r}")
        out[model] = [int(c) for c in cuts.split(",") if c.strip()]
    return out


def cmd_up(args: argparse.Namespace) -> int:
    from services.common.supervisor import Deployment, Supervisor, prepare_state

    cfg = _cfg_with_models(args.models)
    if args.adapt:
        cfg = dataclasses.replace(cfg, adapt=True)
    logs.setup("up", cfg.log_level)
    prepare_state(cfg, say=lambda m: print(m, file=sys.stderr))
    sup = Supervisor(cfg, Deployment(cfg.models, _parse_cuts(args.split), args.replicas),
                     log_dir=Path(args.log_dir) if args.log_dir else None)
    stop = {"now": False}

    def on_signal(signum, frame):
        stop["now"] = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    try:
        url = sup.start()
        print(f"offramp up: NATS at {url} (state in {cfg.home})", flush=True)
        sup.wait_ready(args.ready_timeout)
        print(f"offramp up: ready models={','.join(cfg.models)} "
              f"pids={json.dumps(sup.pids())}", flush=True)
        while not stop["now"]:
            sup.poll()
            time.sleep(0.2)
        print("offramp up: stopping", flush=True)
    finally:
        sup.stop()
    return 0


def _cfg_with_models(models: str | None) -> config_mod.Config:
    import os

    if models:
        os.environ["OFFRAMP_MODELS"] = models
    return config_mod.load()


def cmd_serve(args: argparse.Namespace) -> int:
    from services.common.runtime import run_service

    cfg = config_mod.load()
    if args.service == "router":
        from services.router.service import serve
        run_service(lambda stop: serve(cfg, stop))
    elif args.service == "monitor":
        from services.monitor.service import serve
        run_service(lambda stop: serve(cfg, stop))
    elif args.service == "tuner":
        from services.tuner.service import serve
        run_service(lambda stop: serve(cfg, stop))
    elif args.service == "profiler":
        from services.profiler.service import serve_profiler
        os.nice(10)  # measuring must never take CPU from serving on a small machine
        run_service(lambda stop: serve_profiler(cfg, stop))
    else:
        from services.worker.service import serve
        if not args.model:
            raise SystemExit("serve worker needs --model")
        cuts = [int(c) for c in args.cuts.split(",") if c.strip()] if args.cuts else []
        run_service(lambda stop: serve(cfg, stop, args.model, args.stage, cuts))
    return 0


def cmd_prepare(args: argparse.Namespace) -> int:
    import json

    from services.common.supervisor import register_prepared
    from services.models.manifest import Manifest
    from services.models.prepare import SiteChoice, prepare, sites_json
    from services.store.migrate import upgrade
    from services.store.repository import Store

    cfg = config_mod.load()
    choice = SiteChoice(tuple(s.strip() for s in (args.sites or "").split(",") if s.strip()),
                        args.max_ramps)
    say = (lambda m: None) if args.quiet else (lambda m: print(m, file=sys.stderr, flush=True))
    try:
        path = prepare(args.model, Path(args.models_dir) if args.models_dir else cfg.models_dir,
                       force=args.force, log=say, progress=say,
                       data=Path(args.data) if args.data else None, name=args.name,
                       bootstrap_n=args.bootstrap_n, device=cfg.device, threads=cfg.ort_threads,
                       choice=choice, mask_input=args.mask_input,
                       ramp_targets=args.ramp_targets)
    except ValueError as exc:  # SourceError and unknown zoo names
        print(f"error: {exc}", file=sys.stderr)
        return 2
    manifest = Manifest.load(path)
    report = sites_json(manifest)
    if not args.quiet:
        print(_ramp_table(manifest, report), file=sys.stderr)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
    if not args.no_store:
        cfg.home.mkdir(parents=True, exist_ok=True)
        upgrade(cfg.database_url)
        store = Store(cfg.database_url)
        try:
            register_prepared(store, path, cfg.ramp_budget)
        finally:
            store.close()
    print(path)
    return 0


def _ramp_table(manifest, report: dict) -> str:
    lines = [(f"{manifest.name}: {len(report['sites'])} feasible ramp sites, "
              f"{len(manifest.ramps)} ramps; full model {manifest.full_ms:.3f} ms at batch 1, "
              f"{manifest.base_params:,} params"),
             (f"  {'ramp':>4} {'site':>4}  {'tensor':<44} {'agreement':>9} {'cost ms':>8} "
              f"{'% blocks':>8} {'% unsplit':>9} {'% @b16':>7} {'params %':>8} {'serve ms':>8} "
              f"{'% unspl':>7}")]
    for r in report["ramps"]:
        lines.append(f"  {r['ramp']:>4} {r['site']:>4}  {r['tensor'][-44:]:<44} "
                     f"{r['agreement']:>9.3f} {r['cost_ms']:>8.4f} "
                     f"{100 * (r['cost_share'] or 0):>7.2f}% "
                     f"{100 * (r['cost_share_unsplit'] or 0):>8.2f}% "
                     f"{100 * (r['cost_share_unsplit_b16'] or 0):>6.2f}% "
                     f"{100 * (r['params_share'] or 0):>7.2f}% "
                     f"{r.get('serve_ms') or 0:>8.3f} "
                     f"{100 * (r.get('serve_share_unsplit') or 0):>6.2f}%")
    lines.append("  (cost: the ramp head, fused into its block; % blocks: of the chained blocks at "
                 "batch 1; % unsplit: of the unsplit model at batch 1; % @b16: the same at batch "
                 "16; serve: what activating the ramp adds to a worker's stage at batch 1 - "
                 "its share of what every tapped head adds to the one tapped call, in proportion "
                 "to its cost, or the split there plus the head where taps are unavailable - "
                 "and its share of the unsplit model)")
    return "\n".join(lines)


def cmd_infer(args: argparse.Namespace) -> int:
    import numpy as np

    from services.common import bus
    from services.common.client import InferError, infer

    cfg = config_mod.load()
    labels: list[str] | None = None
    if args.input:
        arr = np.load(args.input)
        inputs = dict(arr) if hasattr(arr, "files") else {args.input_name or "x": arr}
        if args.input_name is None and not hasattr(arr, "files"):
            from services.models.manifest import Manifest
            inputs = {Manifest.load(cfg.models_dir / args.model).inputs[0].name: arr}
    elif args.text is not None:
        if args.model != "minilm-topics":
            raise SystemExit("--text needs a text model (minilm-topics)")
        from services.models.minilm_topics import CATEGORIES, encode_texts
        inputs = {k: v[0] for k, v in encode_texts([args.text]).items()}
        labels = list(CATEGORIES)
    else:
        from services.models.zoo import sample_inputs
        inputs = {k: v[0] for k, v in sample_inputs(args.model, 1, seed=args.seed).items()}

    async def run() -> int:
        nc = await bus.connect(_nats_url(cfg), "offramp-cli")
        try:
            reply = await infer(nc, args.model, inputs, args.slo_ms, timeout=cfg.request_timeout_s)
        except InferError as exc:
            print(json.dumps({"error": {"code": exc.code, "message": exc.message}}))
            return 1
        finally:
            await nc.close()
        reply.pop("outputs", None)
        if labels is not None:
            reply["label_name"] = labels[reply["label"]]
        print(json.dumps(reply))
        return 0

    return asyncio.run(run())


def _nats_url(cfg: config_mod.Config) -> str:
    return cfg.nats_url or "nats://127.0.0.1:4222"


def cmd_status(args: argparse.Namespace) -> int:
    from services.status import collect, render

    cfg = config_mod.load()
    status = asyncio.run(collect(cfg, _nats_url(cfg)))
    print(json.dumps(status, indent=2, default=str) if args.json else render(status))
    return 0


def cmd_db(args: argparse.Namespace) -> int:
    from services.store import migrate

    cfg = config_mod.load()
    url = args.url or cfg.database_url
    if args.action == "upgrade":
        migrate.upgrade(url, args.revision or "head")
    elif args.action == "downgrade":
        migrate.downgrade(url, args.revision or "-1")
    print(migrate.current(url) or "(empty)")
    return 0


def cmd_exit_config(args: argparse.Namespace) -> int:
    from services.exit_config_cli import set_exit_config

    cfg = config_mod.load()
    return set_exit_config(cfg, _nats_url(cfg), args.model, args.threshold, args.set,
                           args.active, args.reason)


def cmd_demo(args: argparse.Namespace) -> int:
    from services.demo import run_demo

    return run_demo(args)


def cmd_bench(args: argparse.Namespace) -> int:
    if args.which == "overhead":
        from services.bench.overhead import run_overhead
        args.requests = 300 if args.requests is None else args.requests
        return run_overhead(args)
    if args.which == "apparate":
        from services.bench.apparate import run
        return run(args)
    raise SystemExit(f"unknown benchmark {args.which!r}")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="offramp", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)

    up = sub.add_parser("up", help="embedded NATS + store + every service; Ctrl-C stops all")
    up.add_argument("--models", help="comma list (default: $OFFRAMP_MODELS)")
    up.add_argument("--split", action="append", help="MODEL=CUT[,CUT...]: stage cut points")
    up.add_argument("--replicas", type=int, default=1, help="workers per stage")
    up.add_argument("--log-dir", help="write each service's log here instead of the terminal")
    up.add_argument("--adapt", action="store_true",
                    help="also run the tuner: continual exit adaptation (or OFFRAMP_ADAPT=1)")
    up.add_argument("--ready-timeout", type=float, default=180.0)
    up.set_defaults(fn=cmd_up)

    serve = sub.add_parser("serve", help="run one service (what `up` and docker-compose start)")
    serve.add_argument("service", choices=SERVICES)
    serve.add_argument("--model")
    serve.add_argument("--stage", type=int, default=0)
    serve.add_argument("--cuts", default="", help="comma list of block indices where stages split")
    serve.set_defaults(fn=cmd_serve)

    prep = sub.add_parser("prepare", help="turn a zoo model, an ONNX file or a torch model into "
                          "an early-exit model (ramp sites, ramp training, block export)")
    prep.add_argument("model", help="zoo name, or a path: model.onnx, a TorchScript / pickled "
                      "torch module file, or a Hugging Face model folder")
    prep.add_argument("--data", help="bootstrap inputs: .npz with one array per input name "
                      "(first axis = samples), or .npy for a single input")
    prep.add_argument("--name", help="name to serve a user's model under (default: file stem)")
    prep.add_argument("--json", help="write the sites found and the trained ramps to this file")
    prep.add_argument("--sites", help="restrict ramps to these feasible sites: comma list of "
                      "tensor names or site ordinals")
    prep.add_argument("--max-ramps", type=int, default=0,
                      help="most ramps to train (evenly spaced over the sites); default per model")
    prep.add_argument("--bootstrap-n", type=int, help="bootstrap samples (default per model)")
    prep.add_argument("--mask-input", help="text models: the input whose real tokens ramps "
                      "average over (default: an integer input named *mask* beside the ids); "
                      "none = plain mean over every position")
    prep.add_argument("--ramp-targets",
                      help="what ramps learn of the final model: top1, or softmax "
                      "(distillation, sharpened at temperature 0.5); default per model "
                      "(minilm-topics: softmax, others: top1)")
    prep.add_argument("--force", action="store_true", help="rebuild even if an intact copy exists")
    prep.add_argument("--models-dir")
    prep.add_argument("--no-store", action="store_true", help="do not record it in the store")
    prep.add_argument("--quiet", action="store_true")
    prep.set_defaults(fn=cmd_prepare)

    inf = sub.add_parser("infer", help="send one request (a real client of the wire contract)")
    inf.add_argument("model")
    inf.add_argument("--input", help=".npy (one sample) or .npz (one array per input name)")
    inf.add_argument("--input-name")
    inf.add_argument("--text", help="a text for minilm-topics (tokenised client-side)")
    inf.add_argument("--seed", type=int, default=0, help="sample input seed when --input is absent")
    inf.add_argument("--slo-ms", type=float)
    inf.set_defaults(fn=cmd_infer)

    st = sub.add_parser("status", help="workers, queues, exit configs, recent latency")
    st.add_argument("--json", action="store_true")
    st.set_defaults(fn=cmd_status)

    demo = sub.add_parser("demo", help="start the stack, stream real images through vanilla "
                          "and through offramp's adaptive loop, print both side by side")
    demo.add_argument("--model", default="efficientnet-lite0")
    demo.add_argument("--requests", type=int, default=2000, help="frames per run")
    demo.add_argument("--concurrency", type=int,
                      help="closed loop: this many requests in flight instead of open-loop "
                      "arrivals (with 1, each frame waits for the previous one's remaining "
                      "layers, which no early exit saves)")
    demo.add_argument("--arrivals", metavar="SPEC",
                      help="open loop: send frames at these arrival times, e.g. poisson:20 "
                      "(requests/s; see services/models/arrivals.py); default: Poisson at "
                      "light load (a vanilla worker 20%% busy), where latency mode's early "
                      "answers pay")
    demo.add_argument("--scene-frames", metavar="MIN:MAX",
                      help="video models: scene lengths in frames (default 600:1800, a fixed "
                      "camera; 16:120 cuts far more often)")
    demo.add_argument("--seed", type=int, default=1,
                      help="which stream: its photos, scene cuts and arrival times (default 1; "
                      "`offramp bench apparate --seed S` streams the same frames)")
    demo.add_argument("--json", help="write the summary here too")
    demo.set_defaults(fn=cmd_demo)

    bench = sub.add_parser("bench", help="benchmarks: print a table, write JSON")
    bench.add_argument("which", choices=["overhead", "apparate"])
    bench.add_argument("--json", required=True, help="output file")
    bench.add_argument("--model", default="efficientnet-lite0")
    bench.add_argument("--trivial-model", default="tiny")
    bench.add_argument("--requests", type=int,
                       help="overhead: requests per light-load run (default 300); apparate "
                       "--live: samples of the stream per policy (default 2000)")
    bench.add_argument("--duration", type=float, default=8.0, help="seconds of sustained load")
    bench.add_argument("--concurrency", type=int, default=64,
                       help="requests in flight during the sustained phase")
    from services.bench import apparate as bench_apparate
    bench_apparate.add_arguments(bench)  # --trace, --plot, ... (--json is shared)
    bench.set_defaults(fn=cmd_bench)

    from services.sim import trace_cli
    tr = sub.add_parser("trace", help="record replay traces: offramp trace record ...")
    trace_cli.add_arguments(tr)
    tr.set_defaults(fn=trace_cli.run)

    db = sub.add_parser("db", help="store migrations")
    db.add_argument("action", choices=["upgrade", "downgrade", "current"])
    db.add_argument("--revision")
    db.add_argument("--url", help="database URL (default: $OFFRAMP_DATABASE_URL)")
    db.set_defaults(fn=cmd_db)

    ec = sub.add_parser("exit-config", help="store and publish a new exit config version")
    ec.add_argument("model")
    ec.add_argument("--threshold", type=float, help="one threshold for every active ramp")
    ec.add_argument("--set", action="append", default=[], help="RAMP=THRESHOLD")
    ec.add_argument("--active", help="comma list of active ramps (default: all; none = vanilla)")
    ec.add_argument("--reason", default="set by hand (offramp exit-config)")
    ec.set_defaults(fn=cmd_exit_config)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    keep_large_buffers()  # every command moves or builds large buffers (services/common/memory.py)
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("alembic").setLevel(logging.WARNING)
    try:
        return int(args.fn(args) or 0)
    except config_mod.ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

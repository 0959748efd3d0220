"""``offramp serve SERVICE``: run one service (what ``offramp up`` and docker compose start)."""

from __future__ import annotations

import argparse
import os

from services.common import config as config_mod

SERVICES = ("router", "worker", "monitor", "profiler", "tuner", "optimizer", "helios")


def register(sub: argparse._SubParsersAction) -> None:
    serve = sub.add_parser("serve", help="run one service (what `up` and docker-compose start)")
    serve.add_argument("service", choices=SERVICES)
    serve.add_argument("--model", help="worker: the model it serves")
    serve.add_argument("--stage", type=int, default=0, help="worker: its stage (0 = first)")
    serve.add_argument("--cuts", default="", help="comma list of block indices where stages split")
    serve.add_argument("--pool", action="store_true",
                       help="worker: no fixed stage; take one from the deployment plan in force")
    serve.set_defaults(fn=run)


def run(args: argparse.Namespace) -> int:
    from services.common import metrics
    from services.common.service_loop import run_service

    cfg = config_mod.load()
    metrics.serve(cfg.metrics_port, cfg.metrics_bind)  # OFFRAMP_METRICS_PORT unset: off
    if args.service == "router":
        from services.router.service import serve
        run_service(lambda stop: serve(cfg, stop))
    elif args.service == "monitor":
        from services.monitor.service import serve
        run_service(lambda stop: serve(cfg, stop))
    elif args.service == "tuner":
        from services.tuner.service import serve
        run_service(lambda stop: serve(cfg, stop))
    elif args.service == "optimizer":
        from services.optimizer.service import serve
        run_service(lambda stop: serve(cfg, stop))
    elif args.service == "helios":  # the optimizer's model and depth selection for LLMs
        from services.optimizer.helios_service import serve
        run_service(lambda stop: serve(cfg, stop))
    elif args.service == "profiler":
        from services.profiler.service import serve_profiler
        os.nice(10)  # measuring must never take CPU from serving on a small machine
        run_service(lambda stop: serve_profiler(cfg, stop))
    elif args.pool:
        from services.worker.pool import serve_pool
        run_service(lambda stop: serve_pool(cfg, stop))
    else:
        from services.worker.service import serve
        if not args.model:
            raise SystemExit("serve worker needs --model (or --pool)")
        cuts = [int(c) for c in args.cuts.split(",") if c.strip()] if args.cuts else []
        run_service(lambda stop: serve(cfg, stop, args.model, args.stage, cuts))
    return 0

"""``offramp up``: the embedded NATS server, the store and every service as child processes;
Ctrl-C stops them all."""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from dataclasses import replace
from pathlib import Path

from services.cli.options import config_with_models
from services.common import logs


def register(sub: argparse._SubParsersAction) -> None:
    up = sub.add_parser("up", help="embedded NATS + store + every service; Ctrl-C stops all")
    up.add_argument("--models", help="comma list (default: $OFFRAMP_MODELS)")
    up.add_argument("--split", action="append", help="MODEL=CUT[,CUT...]: stage cut points")
    up.add_argument("--replicas", type=int, default=1, help="workers per stage")
    up.add_argument("--routers", type=int, default=1,
                    help="routers sharing the intake (a request goes to one of them)")
    up.add_argument("--workers", type=int, default=0,
                    help="with --plan auto: this many pool workers, whose stages the optimizer "
                    "plans (E3 compute mode)")
    up.add_argument("--plan", choices=("auto",),
                    help="auto: the optimizer splits and replicates the model over the pool "
                    "workers and re-plans as load, exits and workers change")
    up.add_argument("--log-dir", help="write each service's log here instead of the terminal")
    up.add_argument("--adapt", action="store_true",
                    help="also run the tuner: continual exit adaptation (or OFFRAMP_ADAPT=1)")
    up.add_argument("--ready-timeout", type=float, default=180.0, metavar="S",
                    help="seconds to wait for every service to be ready (default 180)")
    up.set_defaults(fn=run)


def parse_cuts(values: list[str] | None) -> dict[str, list[int]]:
    """``--split MODEL=CUT[,CUT...]`` options as {model: cuts}."""
    out = {}
    for v in values or []:
        model, _, cuts = v.partition("=")
        if not model or not _:
            raise SystemExit(f"--split takes MODEL=CUT[,CUT...], got {v!r}")
        try:
            out[model] = [int(c) for c in cuts.split(",") if c.strip()]
        except ValueError:
            raise SystemExit(f"--split takes MODEL=CUT[,CUT...] with block indices as "
                             f"cuts, got {v!r}") from None
    return out


def check_cuts(cuts: dict[str, list[int]], models: tuple[str, ...], models_dir: Path) -> None:
    """A clear error for ``--split`` cuts no worker could serve (checked once the models are
    prepared, before any worker starts and fails on them)."""
    from services.runtime.manifest import Manifest, manifest_kind

    for model, cs in cuts.items():
        if model not in models:
            raise SystemExit(f"--split {model}=...: {model} is not served (models: "
                             f"{', '.join(models)})")
        if manifest_kind(models_dir / model) == "llm":
            raise SystemExit(f"--split {model}=...: a generative model is not split")
        n = len(Manifest.load(models_dir / model).blocks)
        if len(set(cs)) != len(cs) or any(not 0 < c < n for c in cs):
            raise SystemExit(f"--split {model}={','.join(map(str, cs))}: cuts must be distinct "
                             f"block indices from 1 to {n - 1} ({model} has {n} blocks)")


def check_plan_options(args: argparse.Namespace, models: tuple[str, ...]) -> int:
    """The number of pool workers ``--workers N --plan auto`` asks for (0: a fixed layout),
    or a clear error for a combination that cannot work."""
    if args.plan is None:
        if args.workers:
            raise SystemExit("--workers N needs --plan auto (a fixed layout: --split, --replicas)")
        return 0
    if args.workers < 1:
        raise SystemExit("--plan auto needs --workers N (N >= 1 pool workers)")
    if args.split or args.replicas != 1:
        raise SystemExit("--plan auto plans the split and replicas itself: drop --split and "
                         "--replicas")
    if len(models) != 1:
        raise SystemExit(f"--plan auto serves one model (a pool worker takes one role), got "
                         f"{', '.join(models)}")
    return args.workers


def run(args: argparse.Namespace) -> int:
    from services.launcher.supervisor import Deployment, Supervisor, prepare_state

    cfg = config_with_models(args.models)
    if args.adapt:
        cfg = replace(cfg, adapt=True)
    if args.routers < 1:
        raise SystemExit("--routers must be at least 1")
    if args.replicas < 1:
        raise SystemExit("--replicas must be at least 1 (workers per stage)")
    logs.setup("up", cfg.log_level)
    pool = check_plan_options(args, cfg.models)
    cuts = parse_cuts(args.split)
    sup = Supervisor(cfg, Deployment(cfg.models, cuts, args.replicas,
                                     args.routers, pool),
                     log_dir=Path(args.log_dir) if args.log_dir else None)
    sup.claim_home()
    prepare_state(cfg, say=lambda m: print(m, file=sys.stderr))
    check_cuts(cuts, cfg.models, cfg.models_dir)
    if pool:
        from services.store.repository import Store

        with Store(cfg.database_url) as store:
            store.ensure_exit_mode(cfg.models[0], "compute", "compute mode: offramp up --plan auto")
    stop = {"now": False}

    def on_signal(signum, frame):
        stop["now"] = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    try:
        url = sup.start()
        print(f"offramp up: NATS at {url} (state in {cfg.home})", flush=True)
        if sup.client_url():
            print(f"offramp up: client URL {sup.client_url()} (other roles: `offramp "
                  f"credentials ROLE`)", flush=True)
        if not sup.wait_ready(args.ready_timeout, stopped=lambda: stop["now"]):
            print("offramp up: stopping before ready", flush=True)
            return 0
        print(f"offramp up: ready models={','.join(cfg.models)} "
              f"pids={json.dumps(sup.pids())}", flush=True)
        while not stop["now"]:
            sup.poll()
            time.sleep(0.2)
        print("offramp up: stopping", flush=True)
    except RuntimeError as exc:  # e.g. the embedded nats-server died and cannot come back
        print(f"offramp up: {exc}", file=sys.stderr, flush=True)
        return 1
    finally:
        sup.stop()
    return 0

"""``offramp bench chaos``: failures and hostile input under load, against a private stack.

The bench starts its own stack (a fresh ``OFFRAMP_HOME`` in a temporary folder, its own
embedded nats-server with per-role logins, two routers and two workers of the model), keeps
it alive (``services.bench.stack_keeper``) and runs each scenario of
``services.bench.chaos_scenarios`` with request ids of its own. Every request has its own
reply subject (``services.bench.tracked_load``), so the bench counts what a client sees:
answers per code, silent losses, duplicate replies; then it sets them against the rows the
monitor stored (``services.bench.chaos_tally``). Every figure is measured live.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import uvloop

from schemas.roles import inbox_prefix
from services.bench.chaos_scenarios import (
    CALM_SLO_MS,
    GRACE_S,
    SCENARIOS,
    SLO_MS,
    Chaos,
    Staged,
)
from services.bench.chaos_tally import tally
from services.bench.report import machine
from services.bench.stack_keeper import Keeper
from services.common import bus
from services.common import config as config_mod
from services.common.client import InferError, infer
from services.common.client import models as list_models
from services.common.config import Config
from services.common.credentials import login_for
from services.launcher.supervisor import Deployment, Supervisor, prepare_state
from services.monitor.service import ACK_WAIT_S
from services.store.repository import Store
from services.zoo.registry import sample_inputs

ROUTERS = 2   # a router can die while the other serves
REPLICAS = 2  # likewise a worker
REDELIVERY_S = ACK_WAIT_S + 5.0  # unacked telemetry of a killed monitor is redelivered by then
ROW_FIGURES = ("rows_missing", "rows_mismatched", "extra_rows")


def private_config(base: Config, home: Path, model: str) -> Config:
    """The user's settings, but state, store and NATS of the bench's own (nothing of a
    running ``offramp up`` is touched); prepared models are read from where they are."""
    return replace(base, home=home, database_url=f"sqlite:///{home / 'offramp.db'}",
                   nats_url=None, nats_credentials=None, models=(model,), adapt=False)


def scenario_names(spec: str | None) -> list[str]:
    names = list(SCENARIOS) if not spec else [s.strip() for s in spec.split(",") if s.strip()]
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        raise SystemExit(f"unknown scenario(s) {', '.join(unknown)}; "
                         f"choose from {', '.join(SCENARIOS)}")
    return names


def run_chaos(args: argparse.Namespace) -> int:
    names = scenario_names(args.scenarios)
    args.slo_ms = getattr(args, "slo_ms", None) or SLO_MS
    if getattr(args, "resend_after", None) is None:  # the contract's rule: SLO plus a margin
        args.resend_after = args.slo_ms / 1e3 + 1.0
    # children inherit the environment: a user's credentials file would override the logins
    # the private server was given
    os.environ.pop("OFFRAMP_NATS_CREDENTIALS", None)
    home = Path(tempfile.mkdtemp(prefix="offramp-chaos-"))
    try:
        result = run_on_private_stack(args, names, home)
    finally:
        if args.keep_state:
            print(f"private state (logs, store) kept in {home}", file=sys.stderr)
        else:
            shutil.rmtree(home, ignore_errors=True)
    with open(args.json, "w") as f:
        json.dump(result, f, indent=2)
    print_table(result)
    print(f"  JSON written to {args.json}")
    return 0


def run_on_private_stack(args: argparse.Namespace, names: list[str], home: Path) -> dict:
    cfg = private_config(config_mod.load(), home, args.model)
    say = functools.partial(print, file=sys.stderr, flush=True)
    prepare_state(cfg, say=say)
    sup = Supervisor(cfg, Deployment((args.model,), replicas=REPLICAS, routers=ROUTERS),
                     log_dir=home / "logs")
    keeper = None
    try:
        url = sup.start()
        say(f"chaos: private stack at {url} (state in {home})")
        sup.wait_ready()
        keeper = Keeper(sup)
        keeper.start()
        scenarios = uvloop.run(run_scenarios(cfg, keeper, url, args, names))
    finally:
        if keeper is not None:
            keeper.stop()
        sup.stop()
    return {"bench": "chaos", "mode": "live", "model": args.model, "quick": args.quick,
            "date": datetime.now(UTC).isoformat(timespec="seconds"), "machine": machine(),
            "deployment": {"routers": ROUTERS, "workers": REPLICAS, "slo_ms": args.slo_ms,
                           "attacks_and_fuzz_followup_slo_ms": CALM_SLO_MS,
                           "resend_after_s": args.resend_after,
                           "silent_after_s": args.slo_ms / 1e3 + GRACE_S},
            "scenarios": scenarios}


async def run_scenarios(cfg: Config, keeper: Keeper, url: str, args: argparse.Namespace,
                        names: list[str]) -> dict:
    login = login_for(cfg, "client")
    nc = await bus.connect(url, "offramp-chaos", login=login)
    batch = sample_inputs(args.model, 64, seed=5)
    inputs = [{k: v[i] for k, v in batch.items()} for i in range(64)]
    c = Chaos(cfg, keeper, nc, url, inbox_prefix(login.user if login else "client"),
              args.model, inputs, args.quick, args.resend_after, args.seed,
              getattr(args, "burst", None), args.slo_ms, args.slo_ms / 1e3 + GRACE_S)
    out: dict[str, dict] = {}
    ended: dict[str, tuple[Staged, float]] = {}
    store = Store(cfg.database_url)
    try:
        for name in names:
            await healthy(c)
            c.say(f"chaos: {name} ...")
            t0 = time.monotonic()
            try:
                staged = await SCENARIOS[name](c)
                ended[name] = staged, time.monotonic()
                out[name] = await account(store, staged)
            except Exception as exc:  # noqa: BLE001 - reported; the other scenarios still run
                c.say(f"chaos: {name} failed: {exc!r}")
                out[name] = {"failed": repr(exc)}
            out[name]["seconds"] = round(time.monotonic() - t0, 1)
            c.say("chaos: " + table_row(name, out[name]))
        await recheck_rows(c, store, out, ended)
    finally:
        store.close()
        await nc.close()
    return out


async def recheck_rows(c: Chaos, store: Store, out: dict[str, dict],
                       ended: dict[str, tuple[Staged, float]]) -> None:
    """Count every scenario's rows again at the end: rows can come after a scenario's had
    settled. Telemetry a killed monitor had fetched but not acked is redelivered only after
    the monitor's ack wait, which a full run waits out when rows were missing (a quick run
    counts again at its end, however late). A scenario whose rows changed keeps its first
    count as ``rows_at_settle``."""
    missing = [n for n, r in out.items() if r.get("rows_missing") and n in ended]
    wait = max((ended[n][1] for n in missing), default=0.0) + REDELIVERY_S - time.monotonic()
    if missing and not c.quick and wait > 0:
        c.say(f"chaos: rows missing in {', '.join(missing)}; waiting {wait:.0f} s for telemetry "
              "redelivered after the monitor's ack wait ...")
        await asyncio.sleep(wait)
    for name, (staged, t_end) in ended.items():
        first = out[name]
        again = await account(store, staged, quiet_s=0.0, stall_s=0.0)
        if all(again[k] == first[k] for k in ROW_FIGURES):
            continue
        out[name] = {**again, "rows_at_settle": {k: first[k] for k in ROW_FIGURES},
                     "rows_settled_s": first["rows_settled_s"],
                     "rows_rechecked_after_s": round(time.monotonic() - t_end, 1),
                     "seconds": first["seconds"]}
        c.say("chaos: recheck " + table_row(name, out[name]))


async def healthy(c: Chaos, timeout_s: float = 90.0) -> None:
    """Every service running, the model ready and one request answered ok: each scenario
    starts on a whole stack, not on the last one's wreckage."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if c.keeper.all_running():
            try:
                ready = await list_models(c.nc, timeout=1.0)
                if ready and all(m["ready"] for m in ready):
                    await infer(c.nc, c.model, c.inputs[0], timeout=5.0)
                    return
            except (TimeoutError, InferError, OSError):
                pass
        await asyncio.sleep(0.2)
    raise RuntimeError(f"the private stack did not become whole again within {timeout_s:.0f} s")


async def account(store: Store, staged: Staged, quiet_s: float = 2.0,
                  stall_s: float = 8.0) -> dict:
    """The scenario's tally once the monitor's rows for it have settled."""
    due = tally(staged.load.requests, [], staged.by_reply_id)["rows_due"]
    ids = ([r.rid for q in staged.load.requests for r in q.replies if r.rid]
           if staged.by_reply_id else [])
    rows, waited = await settle_rows(store, f"{staged.tag}-", ids, due, quiet_s, stall_s)
    return {**tally(staged.load.requests, rows, staged.by_reply_id),
            "rows_settled_s": round(waited, 1), "facts": staged.facts}


async def settle_rows(store: Store, prefix: str, ids: list[str], due: int,
                      quiet_s: float = 2.0, stall_s: float = 8.0,
                      limit_s: float = 90.0) -> tuple[list[tuple[str, str]], float]:
    """The rows for ``prefix``/``ids`` once their count has stopped changing: for
    ``quiet_s`` once at least ``due`` are in, else for ``stall_s`` (rows that never come)."""
    t0 = last_change = time.monotonic()
    count = -1
    while True:
        rows = await asyncio.to_thread(store.request_statuses, prefix, ids)
        now = time.monotonic()
        if len(rows) != count:
            count, last_change = len(rows), now
        quiet = now - last_change
        if (count >= due and quiet >= quiet_s) or quiet >= stall_s or now - t0 >= limit_s:
            return rows, now - t0
        await asyncio.sleep(0.25)


def _s(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f} s"


def headline(name: str, r: dict) -> str:
    """The one fact of each scenario worth a column."""
    f = r.get("facts", {})
    if name in ("worker-kill", "router-kill"):
        extra = (f", {f['unanswered_at_kill']} unanswered at kill, {f['first_attempt_lost']} first "
                 f"attempts lost, sent {f['send_rate_rps']:.0f}/s" if name == "router-kill" else "")
        return f"{f['killed']} back after {_s(f['service_back_s'])}{extra}"
    if name == "monitor-kill":
        return f"{f['kills']} kills, {f['monitor_restarts']} restarts"
    if name == "nats-restart":
        return (f"serving again {_s(f['recovery_s'])} after the kill "
                f"(server back {_s(f['nats_back_s'])})")
    if name == "burst":
        hint = f.get("retry_hint")
        return f"{f['burst']} sent in {f['sent_in_s']:.2f} s" + (
            f"; retry hint / drain p50 {hint['ratio_p50']:.2f} (p5-p95 {hint['ratio_p5']:.2f}-"
            f"{hint['ratio_p95']:.2f}, {hint['within_2x']:.0%} within 2x)" if hint else "")
    if name == "fuzz":
        up = f["followup"]
        return f"follow-up {up['ok']}/{up['requests']} ok, restarts {f['services_restarted'] or 0}"
    if name == "attacks":
        return (f"{sum(f['refused'].values())}/{len(f['refused'])} refused, config "
                f"v{f['config_version_before']}->v{f['config_version_after']}, stream "
                f"{'kept' if f['stream_kept'] else 'CHANGED'}, forged rows {f['forged_rows']}")
    return ""


def table_row(name: str, r: dict) -> str:
    if "failed" in r:
        return f"{name:<13} FAILED: {r['failed']}"
    errors = ", ".join(f"{c} {n}" for c, n in r["errors"].items()) or "-"
    first = r.get("rows_at_settle")
    late = (f" (first {first['rows_missing']}/{first['rows_mismatched']}/{first['extra_rows']})"
            if first else "")
    rows = f"{r['rows_missing']}/{r['rows_mismatched']}/{r['extra_rows']}{late}"
    return (f"{name:<13} {r['requests']:>6} {r['ok']:>6}  {errors:<34} {r['silent_losses']:>6} "
            f"{r['duplicate_replies']:>4} {r['answered_twice']:>5} {r['resent']:>6} "
            f"{rows:>20}  {headline(name, r)}")


def print_table(result: dict) -> None:
    cpus = result["machine"]["cpus"]
    d = result["deployment"]
    print(f"\nofframp bench chaos (live; {result['model']}; {cpus} cores; {d['routers']} routers, "
          f"{d['workers']} workers{'; quick' if result['quick'] else ''})")
    print(f"{'scenario':<13} {'sent':>6} {'ok':>6}  {'errors':<34} {'silent':>6} {'dup':>4} "
          f"{'twice':>5} {'resent':>6} {'rows miss/mism/extra':>20}  facts")
    for name, r in result["scenarios"].items():
        print(table_row(name, r))
    print("  (silent: no reply within SLO + 10 s of the last attempt; dup: extra replies on one "
          "reply subject; twice: answered on two attempts; rows: the store's request rows, "
          "matched by id, counted again at the end of the run; first: the count when they had "
          "first stopped changing)")

"""``offramp status``: what the router, the monitor and the store say right now."""

from __future__ import annotations

import argparse
import asyncio
import json
from typing import Any

from schemas import subjects
from schemas.codec import unpack
from services.common import bus
from services.common import config as config_mod
from services.common.client import InferError, request_raw
from services.common.config import Config
from services.common.credentials import login_for, server_url
from services.launcher import metrics_ports


async def collect(cfg: Config, url: str) -> dict[str, Any]:
    nc = await bus.connect(url, "offramp-status", connect_timeout=3,
                           login=login_for(cfg, "admin"))
    out: dict[str, Any] = {"nats": url}
    try:
        routers = await gather(nc, subjects.STATUS_ROUTER)
        out["router"] = routers[0] if routers else {"error": "no router answered"}
        out["routers"] = [r.get("router") for r in routers]
        try:
            out["monitor"] = await request_raw(nc, subjects.STATUS_MONITOR, b"", timeout=2.0)
        except InferError as exc:
            out["monitor"] = {"error": exc.message}
    finally:
        await nc.close()
    return out


async def gather(nc, subject: str, first_s: float = 2.0, rest_s: float = 0.3) -> list[dict]:
    """Every answer to one status request: each router answers (no queue group)."""
    inbox = nc.new_inbox()
    got: list[dict] = []
    arrived = asyncio.Event()

    async def on_reply(msg) -> None:
        if bus.is_no_responders(msg):  # not an answer
            return
        got.append(unpack(msg.data))
        arrived.set()

    sub = await nc.subscribe(inbox, cb=on_reply)
    await nc.publish(subject, b"", reply=inbox)
    try:
        await asyncio.wait_for(arrived.wait(), first_s)
        await asyncio.sleep(rest_s)  # the others answer within the same moment
    except TimeoutError:
        pass
    await sub.unsubscribe()
    return got


def stored_status(cfg: Config, served: list[str]) -> dict[str, Any]:
    """What the store adds, in one visit (nothing without a store): the newest exit config
    version of each served model, and ``helios_status``."""
    from services.store.db import missing_sqlite_file
    from services.store.repository import Store

    if missing_sqlite_file(cfg.database_url) is not None:
        return {}  # no store here yet
    with Store(cfg.database_url) as store:
        rows = {m: store.latest_exit_config(m) for m in served}
        return {"exit_configs": {m: r.version for m, r in rows.items() if r is not None},
                "helios": helios_status(store, cfg.models)}


def helios_status(store, models) -> dict[str, Any]:
    """Per generative model with streams or decisions: HELIOS's decision in force, the heads'
    tuned thresholds, and its streams' totals (token-level feedback included)."""
    out: dict[str, Any] = {}
    totals = store.generation_totals()
    for model in sorted(set(totals) | set(models)):
        decision = store.latest_helios_decision(model)
        if decision is None and model not in totals:
            continue
        config = store.latest_exit_config(model)
        out[model] = {"decision": decision, "streams": totals.get(model, {}),
                      "thresholds": dict(config.thresholds)
                      if config is not None and config.mode == "generation" else {}}
    return out


def _helios_lines(helios: dict[str, Any], served: bool) -> list[str]:
    """One line per generative model; with no router answering, what the store holds is
    history, and said to be."""
    lines = []
    tag = "" if served else " (stored history; no router answered)"
    for model, h in helios.items():
        d, g = h["decision"], h["streams"]
        serving = "no decision" if d is None else (
            f"{d['candidate']}@{d['depth']} ({d['kind']}, assessment {d['assessment']}, "
            f"since {d['at']:%H:%M:%S})")
        heads = ",".join(f"{k}:{t:.3f}" for k, t in sorted(h["thresholds"].items())) or "-"
        checked = g.get("checked", 0)
        agree = f"{g['agreed'] / checked:.1%} of {checked}" if checked else "none checked"
        lines.append(f"helios {model}{tag}: {serving}; head thresholds {heads}; "
                     f"{g.get('streams', 0)} streams, {g.get('tokens', 0)} tokens, early "
                     f"tokens agreeing {agree}")
    return lines


def render(status: dict[str, Any]) -> str:
    lines = [f"NATS {status['nats']}"]
    router = status.get("router", {})
    if "error" in router:
        lines.append(f"router: {router['error']}")
    if len(status.get("routers", [])) > 1:
        lines.append(f"routers: {', '.join(status['routers'])} (queues and workers of "
                     f"{router.get('router')} below)")
    for name, m in sorted(router.get("models", {}).items()):
        p50 = "-" if m["p50_ms"] is None else f"{m['p50_ms']:.1f}"
        p95 = "-" if m["p95_ms"] is None else f"{m['p95_ms']:.1f}"
        lines.append(f"model {name}: ready={m['ready']} queue={m['queue']} served={m['served']} "
                     f"errors={m['errors']} early={m['early']} p50={p50}ms p95={p95}ms")
        stored = (status.get("exit_configs") or {}).get(name)
        for w in m["workers"]:
            # a worker reports the config of its last batch: a newer stored one is pending
            pending = (f" (v{stored} pending: taken at its next batch)"
                       if stored is not None and w["config_version"] < stored else "")
            lines.append(f"  worker {w['id']} stage={w['stage']} pid={w['pid']} credit={w['credit']} "
                         f"exit_config=v{w['config_version']}{pending} "
                         f"gave_way={w.get('gave_way', 0)} "
                         f"set_aside={w.get('set_aside', 0)} late={w.get('late', 0)}")
    monitor = status.get("monitor", {})
    if "error" in monitor:
        lines.append(f"monitor: {monitor['error']}")
    else:
        for name, w in sorted(monitor.get("models", {}).items()):
            lines.append(f"monitor {name}: config v{w['config_version']} last window "
                         f"{w['samples']} samples agreement={w['agreement']:.3f} "
                         f"exit_rate={w['exit_rate']:.3f}")
        lines.append(f"monitor stored: {monitor.get('requests_stored', 0)} request rows, "
                     f"{monitor.get('windows_stored', 0)} windows, "
                     f"{monitor.get('generations_stored', 0)} generation streams")
    if "store_error" in status:
        lines.append(f"store: unreadable ({status['store_error']})")
    lines += _helios_lines(status.get("helios") or {}, served="error" not in router)
    metrics = status.get("metrics") or {}
    for name, port in sorted(metrics.get("ports", {}).items()):
        lines.append(f"metrics {name}: {metrics_ports.url(metrics['bind'], port)}")
    return "\n".join(lines)


def register(sub: argparse._SubParsersAction) -> None:
    st = sub.add_parser("status", help="workers, queues, exit configs, recent latency, "
                        "metrics ports; exits 0 when a router answers, 1 when none does "
                        "(scripts can wait on it)")
    st.add_argument("--json", action="store_true", help="everything as one JSON document")
    st.set_defaults(fn=run)


def run(args: argparse.Namespace) -> int:
    cfg = config_mod.load()
    status = asyncio.run(collect(cfg, server_url(cfg)))
    try:
        status.update(stored_status(cfg, sorted(status.get("router", {}).get("models", {}))))
    except Exception as exc:  # noqa: BLE001 - a store problem must not hide the bus's status
        status["store_error"] = repr(exc)
    if (ports := metrics_ports.read(cfg.home)) is not None:  # a live `offramp up` here
        status["metrics"] = ports
    print(json.dumps(status, indent=2, default=str) if args.json else render(status))
    return 1 if "error" in status.get("router", {}) else 0

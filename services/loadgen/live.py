"""Stream inputs through a running deployment and summarise what came back: the live runs
that ``offramp demo`` and ``offramp bench apparate --live`` put side by side."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from datetime import UTC, datetime

import numpy as np

from services.common import bus
from services.common.credentials import login_for
from services.common.readiness import READY_FILE_ENV, await_ready, ready_file
from services.common.stats import percentile
from services.exits.initial import initial_ramps
from services.launcher.exit_config import set_exit_config
from services.launcher.supervisor import Deployment, Supervisor
from services.loadgen.drive import (
    Progress,
    attach_hops,
    attach_serving,
    await_config,
    drive,
    drive_open,
    way_back_ms,
)
from services.store.repository import Store

TUNER_READY_S = 60.0


@contextmanager
def running_stack(cfg, model: str, say, features: bool) -> Iterator[tuple[Supervisor, str]]:
    """The embedded stack serving ``model`` (its NATS URL with it); ``features``: workers
    publish ramp features for refits at the configured rate, else none, so a baseline does
    not pay for what only the learning loop uses."""
    if not features:
        cfg = replace(cfg, ramp_feature_rate=0.0)
    sup = Supervisor(cfg, Deployment((model,)), log_dir=cfg.home / "logs")
    try:
        url = sup.start()
        say(f"NATS at {url}; service logs in {cfg.home / 'logs'}"
            + ("" if features else " (no ramp features)"))
        sup.wait_ready()
        yield sup, url
    finally:
        sup.stop()


def adaptive_run(cfg, sup: Supervisor, url: str, manifest, inputs: list,
                 arrival_s: np.ndarray | None, who: str, concurrency: int = 1,
                 refit: bool = True, label: str = "offramp") -> tuple[dict, list, list[int]]:
    """offramp's run: the initial deployment (evenly spaced ramps within the budget,
    thresholds 0, every ramp on its prepared head) with the tuner service adapting it live
    beside the running stack, refitting ramp heads when ``refit``. Returns the run's summary
    and outcomes (``stream_live``) and the initial active ramps."""
    model = manifest.name
    active = initial_ramps(manifest, cfg.ramp_budget)
    set_exit_config(cfg, url, model, 0.0, [], ",".join(map(str, active)) or "none",
                    f"{who}: {label}'s initial deployment",
                    [f"{r.index}=0" for r in manifest.ramps])
    ready = ready_file(cfg.home, f"{who}-tuner")
    tuner = subprocess.Popen([sys.executable, "-m", "services.cli", "serve", "tuner"],
                             env={**sup.env, "OFFRAMP_REFIT": "1" if refit else "0",
                                  READY_FILE_ENV: str(ready)},
                             stdout=subprocess.DEVNULL,
                             stderr=open(cfg.home / "logs" / f"{who}-tuner.log", "ab"))  # noqa: SIM115
    try:
        # subscribed before the first request: it takes telemetry on plain NATS
        await_ready(ready, tuner, TUNER_READY_S)
        summary, outcomes = asyncio.run(stream_live(cfg, url, model, inputs, arrival_s,
                                                    label, concurrency))
    finally:
        tuner.terminate()
        tuner.wait(timeout=15)
    return summary, outcomes, active


async def stream_live(cfg, url: str, model: str, inputs: list, arrival_s: np.ndarray | None,
                      label: str, concurrency: int = 1) -> tuple[dict, list]:
    """Send ``inputs`` through the running stack (open loop at ``arrival_s``, else
    ``concurrency`` in flight) with a progress bar; the run's summary (agreement from the
    monitor's exit profiles) and the client's outcomes."""
    nc = await bus.connect(url, "offramp-demo", login=login_for(cfg, "client"))
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
    attach_hops(outcomes, store.request_arrivals(model, since))
    versions = sorted({o.config_version for o in ok})
    store.close()
    lat = [o.latency_ms for o in ok]
    serving = [o.serving_ms for o in ok if o.serving_ms is not None]
    way_in = [o.way_in_ms for o in ok if o.way_in_ms is not None]
    way_back = [b for o in ok if (b := way_back_ms(o)) is not None]
    return {"requests": len(outcomes), "ok": len(ok), "errors": len(outcomes) - len(ok),
            "p25_ms": percentile(lat, 25), "p50_ms": percentile(lat, 50),
            "p95_ms": percentile(lat, 95),
            "serving_p50_ms": percentile(serving, 50), "serving_p95_ms": percentile(serving, 95),
            "way_in_p50_ms": percentile(way_in, 50), "way_in_p75_ms": percentile(way_in, 75),
            "way_back_p50_ms": percentile(way_back, 50),
            "early_share": sum(o.early for o in ok) / len(ok) if ok else None,
            "agreement": agreement, "throughput_rps": len(outcomes) / wall,
            "config_versions": len(versions)}, outcomes

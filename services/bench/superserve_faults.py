"""Workers killed mid-trace in the live SuperServe bench (SuperServe §6.4, fig. 12): a
bursty trace during which each worker is SIGKILLed in turn and comes back (the stack's
supervisor restarts it, as ``offramp up`` does), with SLO attainment, mean serving accuracy
and the variants used per second, so the move to cheaper variants while capacity is gone
shows."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from services.bench.stack_keeper import Keeper

TRACE = "faults"
KILL_AT = (0.25, 0.5)  # fractions of the trace: worker r0, then worker r1
BUCKET_S = 1.0


def kill_plan(model: str, workers: int, seconds: float) -> list[tuple[float, str]]:
    """(seconds into the trace, worker child) of each kill: one worker at a time."""
    return [(f * seconds, f"worker-{model}-s0-r{k % workers}") for k, f in enumerate(KILL_AT)]


def over_time(outs: list, times: np.ndarray, score: Callable[[Any], float], slo_ms: float,
              bucket_s: float = BUCKET_S) -> dict[str, list]:
    """Per ``bucket_s`` of arrival time: requests, SLO attainment, mean accuracy of the
    attained answers (None: none) and the variant most used."""
    edges = np.arange(0.0, float(times.max()) + bucket_s, bucket_s) if len(times) else []
    out: dict[str, list] = {"t": [], "requests": [], "attainment": [], "accuracy": [],
                            "top_variant": []}
    for lo in edges:
        mine = [o for o in outs if lo <= times[o.index] < lo + bucket_s]
        if not mine:
            continue
        ok = [o for o in mine if o.ok and o.latency_ms <= slo_ms]
        used = Counter(o.variant for o in ok)
        out["t"].append(float(lo))
        out["requests"].append(len(mine))
        out["attainment"].append(len(ok) / len(mine))
        out["accuracy"].append(float(np.mean([score(o) for o in ok])) if ok else None)
        out["top_variant"].append(used.most_common(1)[0][0] if used else None)
    return out


def run_faults(sup, send: Callable[[np.ndarray], list], times: np.ndarray, model: str,
               workers: int, seconds: float, say) -> tuple[list, dict[str, Any]]:
    """Serve ``times`` through ``send`` while the kill plan runs; the outcomes and what
    happened to the workers (kills, seconds until each was back)."""
    keeper = Keeper(sup)
    keeper.start()
    kills: list[dict[str, Any]] = []

    def kill(name: str) -> None:
        done = keeper.kill(name)
        kills.append({"worker": name, "t_s": time.monotonic() - t0,
                      "pid": done[0] if done else None, "at": done[1] if done else None})
        say(f"killed {name} (pid {done[0] if done else '-'})")

    timers = [threading.Timer(at, kill, (name,)) for at, name in
              kill_plan(model, workers, seconds)]
    t0 = time.monotonic()
    for t in timers:
        t.start()
    try:
        outs = send(times)
    finally:
        for t in timers:
            t.cancel()
        keeper.stop()
    for k in kills:
        back = keeper.back_after(k["worker"], k.pop("at")) if k["pid"] else None
        k["back_after_s"] = back
    return outs, {"kills": kills}


def plot(doc: dict[str, Any], path: Path) -> Path:
    """Attainment and accuracy per second of the faults trace, one line per policy."""
    from services.bench.plot import svg_panels

    def series(key: str) -> list[tuple[str, np.ndarray, np.ndarray]]:
        out = []
        for policy, per in doc["results"].items():
            tl = (per.get(TRACE) or {}).get("timeline")
            if tl:
                ys = np.array([np.nan if v is None else v for v in tl[key]], float)
                out.append((policy, np.array(tl["t"], float), ys))
        return out

    x_max = max((float(s[1].max()) for s in series("attainment") if s[1].size), default=1.0)
    first = next(((per.get(TRACE) or {}).get("kills") for per in doc["results"].values()), [])
    kills = ", ".join(f"{k['worker']} at {k['t_s']:.1f} s" for k in first or [])
    path.write_text(svg_panels(
        f"live, {doc['model']}: workers killed mid-trace ({kills}; first policy's times)",
        [("SLO attainment per second", series("attainment"), 1.0),
         ("mean serving accuracy per second", series("accuracy"), (0.0, 1.0))],
        "trace seconds", x_max))
    return path

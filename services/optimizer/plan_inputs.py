"""What the optimizer plans from, assembled from what the store holds (pure): the model's
geometry from its manifest, the survival forecast from the batch profiles, one latency
table per device class from the latency profiles, the pool inventory from the workers,
the rate from the request history; and the plan turned into the wire message, with each
stage's replicas taken by named pool workers.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from schemas.plans import Plan, StageRole
from services.optimizer.block_costs import LatencyTable, ModelChain, monotone_survival
from services.optimizer.splits import DeploymentPlan, DeviceClass, Problem, Transfer

# The bus between two stage workers when nothing better is known: a documented constant
# (1 GB/s effective, 0.05 ms per message), the fallback of `offramp bench e3` too.
MS_PER_BYTE = 1e-6
FIXED_MS = 0.05
DYNAMIC_DIM = 128  # a variable activation axis (text: tokens) counts this long
POOL = "pool"      # the status a pool worker writes for itself in the workers table


@dataclass(frozen=True)
class ModelGeometry:
    """Blocks and ramp sites of a model; ``ramp_ids[s]`` is the ramp at site ``s``."""

    n_blocks: int
    ramp_ids: tuple[int, ...]
    ramp_after: tuple[int, ...]
    bytes_per_sample: tuple[float, ...]  # activation at each site, float32


def geometry(manifest: Mapping[str, Any]) -> ModelGeometry:
    blocks = sorted(manifest.get("blocks", []), key=lambda b: int(b["index"]))
    ramps = sorted(manifest.get("ramps", []), key=lambda r: int(r["after_block"]))
    shapes = {int(b["index"]): b.get("output_shape") or [] for b in blocks}

    def size(shape: Sequence[int]) -> float:
        return 4.0 * math.prod(DYNAMIC_DIM if int(d) < 0 else int(d) for d in shape)

    return ModelGeometry(len(blocks), tuple(int(r["index"]) for r in ramps),
                         tuple(int(r["after_block"]) for r in ramps),
                         tuple(size(shapes.get(int(r["after_block"]), [])) for r in ramps))


def latest_forecast(rows: Iterable[Mapping[str, Any]]) -> dict[int, float]:
    """Per ramp, the forecast of the newest window that has one (batch-profile rows)."""
    out: dict[int, tuple[datetime, float]] = {}
    for r in rows:
        if r.get("forecast") is None:
            continue
        if r["ramp"] not in out or r["window_start"] >= out[r["ramp"]][0]:
            out[r["ramp"]] = (r["window_start"], float(r["forecast"]))
    return {k: v for k, (_, v) in out.items()}


def current_ramps(rows: Iterable[Mapping[str, Any]]) -> frozenset[int]:
    """The ramps forecast in the newest window that has a forecast: the ones running now."""
    rows = [r for r in rows if r.get("forecast") is not None]
    if not rows:
        return frozenset()
    newest = max(r["window_start"] for r in rows)
    return frozenset(int(r["ramp"]) for r in rows if r["window_start"] == newest)


def survival(geo: ModelGeometry, forecast: Mapping[int, float],
             current: Collection[int] | None = None) -> tuple[float, ...]:
    """Survival after each site: the forecast where there is one, else what survived the
    site before (no forecast: the ramp is not known to exit anything).

    ``current``: the ramps the newest window measured. Any other ramp's forecast is older:
    the ramp was switched off since, and the thresholds may have moved. It is kept only
    within what the current ramps around it allow (at most the survival after the current
    ramp before it, at least that after the next one). Otherwise a stale low figure would
    take the exits of the running ramp after it, the exit wrapper would switch that ramp
    off, and the plans would swap ramp sets back and forth."""
    vals = {r: float(v) for r, v in forecast.items()}
    if current is not None:
        now = [(i, vals[r]) for i, r in enumerate(geo.ramp_ids) if r in current and r in vals]
        for i, r in enumerate(geo.ramp_ids):
            if r in vals and r not in current:
                hi = min((v for j, v in now if j < i), default=1.0)
                lo = max((v for j, v in now if j > i), default=0.0)
                vals[r] = min(max(vals[r], lo), hi)
    out, last = [], 1.0
    for r in geo.ramp_ids:
        last = vals.get(r, last)
        out.append(last)
    return monotone_survival(out)


def latency_table(rows: Iterable[Mapping[str, Any]], geo: ModelGeometry) -> LatencyTable | None:
    """The profile rows of one device class as a table, over the batch sizes where every
    block and head was measured; None when no batch size is complete."""
    ms = {(r["kind"], int(r["idx"]), int(r["batch_size"])): float(r["ms"]) for r in rows}
    sizes = sorted({b for _k, _i, b in ms})
    need = [("block", k) for k in range(geo.n_blocks)] + [("ramp", r) for r in geo.ramp_ids]
    sizes = [b for b in sizes if all((k, i, b) in ms for k, i in need)]
    if not sizes:
        return None
    return LatencyTable.build(sizes, [[ms[("block", k, b)] for b in sizes]
                                      for k in range(geo.n_blocks)],
                              [[ms[("ramp", r, b)] for b in sizes] for r in geo.ramp_ids])


def pool_inventory(rows: Iterable[Mapping[str, Any]], now: datetime,
                   fresh_s: float) -> dict[str, tuple[str, ...]]:
    """Live pool workers by device class, stragglers left out: ``{device: (ids...)}``."""
    out: dict[str, list[str]] = {}
    for w in rows:
        if (w.get("status") == POOL and w.get("device") and w.get("straggler_since") is None
                and w["last_seen"] >= now - timedelta(seconds=fresh_s)):
            out.setdefault(w["device"], []).append(w["worker_id"])
    return {d: tuple(sorted(ids)) for d, ids in sorted(out.items())}


# A plan is sized for this many times the measured rate. Plans that meet the rate tie on
# goodput and the cheapest wins, so without headroom a plan runs its devices at 100 % of
# what the profile promises: a load step, or a profile taken on an idle machine (live, a
# stage also shares cores with the router and the bus), leaves it short at once.
HEADROOM = 1.25


@dataclass(frozen=True)
class Targets:
    slo_ms: float
    batch: int
    slack: float = 0.2
    alpha: float = 1.0
    ms_per_byte: float = MS_PER_BYTE
    fixed_ms: float = FIXED_MS
    headroom: float = HEADROOM


def problem(geo: ModelGeometry, forecast: Mapping[int, float],
            tables: Mapping[str, LatencyTable], inventory: Mapping[str, Sequence[str]],
            rate: float, t: Targets, current: Collection[int] | None = None) -> Problem:
    """The planning problem, sized for ``rate`` x the headroom; device classes without a
    latency table cannot be planned and are left out (the caller says so). ``current``:
    the ramps measured in the newest window (see ``survival``)."""
    chain = ModelChain(geo.n_blocks, geo.ramp_after, survival(geo, forecast, current))
    classes = tuple(DeviceClass(d, len(ids), tables[d]) for d, ids in inventory.items()
                    if d in tables)
    if math.isinf(rate):  # not measured yet (``replan.UNMEASURED``): the most the pool serves
        rate = pool_bound(classes, t.batch)
    return Problem(chain, classes, rate=max(rate * t.headroom, 1e-3), slo_ms=t.slo_ms,
                   batch=t.batch,
                   slack=t.slack, alpha=t.alpha,
                   transfer=Transfer(geo.bytes_per_sample, t.ms_per_byte, t.fixed_ms))


def pool_bound(classes: Sequence[DeviceClass], batch: int) -> float:
    """Requests per second no plan on ``classes`` can exceed: every device running only
    the first block on full batches (every request passes it). Planning for it yields the
    plan with the most goodput the pool has."""
    return sum(c.count * 1000.0 * batch / max(float(c.latency.blocks_at(batch)[0]), 1e-9)
               for c in classes) or 1e-3


def assign(plan: DeploymentPlan, inventory: Mapping[str, Sequence[str]],
           current: Mapping[str, tuple[int, int]]) -> list[tuple[str, ...]]:
    """Which pool workers take each stage's replicas. A worker keeps its block range when
    the new plan has a stage with the same range on its class (no reload, no drain);
    the others fill the rest in id order."""
    free = {d: list(ids) for d, ids in inventory.items()}
    picked: list[list[str]] = [[] for _ in plan.stages]
    for k, s in enumerate(plan.stages):  # first pass: keep roles that did not change
        span = (s.first_block, s.last_block + 1)
        for w in list(free.get(s.device_class, [])):
            if len(picked[k]) < s.replicas and current.get(w) == span:
                picked[k].append(w)
                free[s.device_class].remove(w)
    for k, s in enumerate(plan.stages):
        while len(picked[k]) < s.replicas and free.get(s.device_class):
            picked[k].append(free[s.device_class].pop(0))
    return [tuple(sorted(p)) for p in picked]


def to_message(model: str, version: int, reason: str, geo: ModelGeometry,
               plan: DeploymentPlan, workers: Sequence[Sequence[str]], hold_ms: float,
               t: float, extra: Mapping[str, Any] | None = None,
               probe: Iterable[int] = ()) -> Plan:
    """The wire plan: stage ranges end-exclusive, ramps named by index, not site.

    ``probe``: ramps without a forecast. Each runs in its stage although the plan cannot
    tell whether it pays: a ramp that never runs never exits, so it would never get the
    forecast that could switch it on (its survival is taken as "exits nothing")."""
    probing = set(probe)

    def ramps(s: Any) -> tuple[int, ...]:
        chosen = {geo.ramp_ids[i] for i in s.active_ramps}
        chosen |= {r for r, a in zip(geo.ramp_ids, geo.ramp_after, strict=True)
                   if r in probing and s.first_block <= a <= s.last_block}
        return tuple(sorted(chosen, key=geo.ramp_ids.index))

    stages = tuple(StageRole(k, s.first_block, s.last_block + 1, s.device_class, s.batch,
                             hold_ms, ramps(s), tuple(workers[k]))
                   for k, s in enumerate(plan.stages)) if plan.feasible else ()
    return Plan(model, version, reason, plan.feasible, geo.n_blocks, stages, plan.goodput,
                plan.latency_ms, plan.cost, t=t, extra=dict(extra or {}))

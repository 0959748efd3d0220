"""Hysteresis for the exit wrapper (pure): a stage keeps the ramps it runs unless the new
choice makes it clearly faster.

The exit wrapper (:mod:`services.optimizer.exit_wrapper`) picks each stage's ramps from
forecast survival. A ramp whose exits barely pay for its head sits on the edge, and a few
points of window noise move it in or out. Every change of the running set also moves the
survival the profiler measures, starts a new forecast series and makes the tuner re-tune
the ramps it runs (compute mode tunes the ramps the plan runs), so flapping costs more than
the edge ramp is worth. A stage the plan in force already has (same blocks, same device
class) therefore keeps its running ramps unless the new set's fused-batch time is at least
``STICKY`` lower.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from services.optimizer.block_costs import stage_ms
from services.optimizer.splits import DeploymentPlan, Problem

STICKY = 0.05  # a new running set must make its stage this much faster to replace the old

StageKey = tuple[int, int, str]  # first block, last block (inclusive), device class


def keep_running(plan: DeploymentPlan, p: Problem,
                 running: Mapping[StageKey, Sequence[int]],
                 sticky: float = STICKY) -> DeploymentPlan:
    """``plan`` with each stage found in ``running`` (its ramp sites in the plan in force)
    back on those ramps when they are within ``sticky`` of the new choice's time; its time,
    capacity and the plan's goodput are re-estimated for them."""
    if not plan.feasible or not running:
        return plan
    tables = {c.name: c.latency for c in p.classes}
    stages, changed = [], False
    for s in plan.stages:
        old = running.get((s.first_block, s.last_block, s.device_class))
        if old is None or tuple(old) == s.active_ramps:
            stages.append(s)
            continue
        ms = stage_ms(p.chain, tables[s.device_class], s.first_block, s.last_block, s.batch, old)
        if ms > s.ms * (1.0 + sticky):
            stages.append(s)
            continue
        capacity = s.capacity * s.ms / ms if ms > 0 else s.capacity
        stages.append(dataclasses.replace(s, active_ramps=tuple(old), ms=ms, capacity=capacity))
        changed = True
    if not changed:
        return plan
    goodput = min(plan.goodput, *(s.capacity for s in stages))
    return dataclasses.replace(
        plan, stages=tuple(stages), goodput=goodput,
        active_ramps=tuple(r for s in stages for r in s.active_ramps),
        cost=plan.cost * plan.goodput / goodput if goodput > 0 else plan.cost)


def running_sites(stages: Sequence[tuple[int, int, str, Sequence[int]]],
                  ramp_ids: Sequence[int]) -> dict[StageKey, tuple[int, ...]]:
    """The plan in force's stages as ``{(first, last inclusive, class): sites}`` from
    ``(first, end exclusive, class, ramp ids)``; ramps the model no longer has are dropped."""
    out = {}
    for first, end, device, ramps in stages:
        sites = sorted(ramp_ids.index(r) for r in ramps if r in ramp_ids)
        out[(int(first), int(end) - 1, str(device))] = tuple(sites)
    return out

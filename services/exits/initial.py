"""The initial deployment of a freshly prepared model (Apparate §3.1): as many ramps as
the ramp budget allows, evenly spaced over the candidate sites, every threshold 0 so
nothing exits until the tuner has feedback. Only trained ramps are candidates."""

from __future__ import annotations

import itertools

from schemas.messages import ExitConfig
from services.exits.latency_profile import LatencyProfile

DEFAULT_BUDGET = 0.02  # worst-case latency ramps may add, as a share of the full model


def evenly_spaced(ids: list[int], k: int) -> list[int]:
    """``k`` of ``ids`` spread evenly: the centre of each of ``k`` equal slices."""
    n = len(ids)
    if k >= n:
        return list(ids)
    return [ids[int((j + 0.5) * n / k)] for j in range(k)]


def slices(ids: list[int], centres: list[int]) -> list[list[int]]:
    """``ids`` cut into contiguous slices, one around each centre (boundaries midway)."""
    pos = [ids.index(c) for c in centres]
    bounds = [0] + [(a + b) // 2 + 1 for a, b in itertools.pairwise(pos)] + [len(ids)]
    return [ids[lo:hi] for lo, hi in itertools.pairwise(bounds)]


def initial_active(costs: dict[int, float], full_ms: float,
                   budget: float = DEFAULT_BUDGET) -> list[int]:
    """The most ramps, evenly spread, whose summed cost stays within ``budget * full_ms``.

    For ``k`` ramps the :func:`evenly_spaced` sites themselves when they fit; else each of
    them stands for the slice of sites nearest to it, and the slice contributes its
    cheapest ramp (ties: the one nearest the centre): when a centre ramp is too costly, a
    cheaper neighbour can still be deployed. Centres first, because measured costs of
    similar heads differ by noise: on one 2-core machine EfficientNet's centres 3 and 9
    fitted, yet the cheapest of their slices were 6 and 10, a third of the model later.

    ``costs`` maps ramp index -> measured batch-1 cost (ms). Unknown costs (0 or a model
    without a latency) are taken at face value, so such a model starts with every ramp.
    """
    ids = sorted(costs)
    limit = budget * full_ms if full_ms > 0 else float("inf")
    for k in range(len(ids), 0, -1):
        centres = evenly_spaced(ids, k)
        if sum(costs[i] for i in centres) <= limit:
            return centres
        pick = [min(part, key=lambda r: (costs[r], abs(ids.index(r) - ids.index(centre))))
                for part, centre in zip(slices(ids, centres), centres, strict=True)]
        if sum(costs[i] for i in pick) <= limit:
            return pick
    return []


def initial_config(model: str, ramp_ids: list[int]) -> ExitConfig:
    """Version 0 with ``ramp_ids`` active and nothing exiting (what a worker runs before any
    config exists); see :func:`initial_ramps` for which ramps start active."""
    return ExitConfig(model=model, version=0, thresholds={r: 0.0 for r in ramp_ids},
                      active=list(ramp_ids))


def initial_ramps(manifest, budget: float = DEFAULT_BUDGET) -> list[int]:
    """The initial deployment's active ramps: evenly spaced within the ramp budget, costed
    as a worker pays them (``LatencyProfile.from_manifest``). Untrained ramps (``offramp
    prepare --no-bootstrap``) are never among them: their placeholder heads only say
    something once a live refit has trained them."""
    prof = LatencyProfile.from_manifest(manifest)
    ids = sorted(r.index for r in manifest.ramps)
    trained = {r.index for r in manifest.ramps if getattr(r, "trained", True)}
    return initial_active({r: float(prof.ramp_cost_ms[k]) for k, r in enumerate(ids)
                           if r in trained}, prof.full_ms, budget)

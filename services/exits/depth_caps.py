"""Exit depth as a variant (pure): SuperServe's accuracy-for-throughput lever for every
early-exit model, where a batch's **depth cap** plays the part of a subnet.

A batch the router sends with variant ``depth<=R`` answers every sample at the first
active ramp (in site order) whose threshold it passes, or at the deepest active ramp at or
before ramp ``R``'s site, whichever comes first; in compute mode the batch then stops
there. ``depth<=final`` is the model as its exit config serves it. Caps name *active*
ramps: those are the ramps whose feedback the monitor holds, so a cap's accuracy is a
measured figure, and the worker already splits its stage at them (no new session).

A cap's profile:
- accuracy: the agreement with the final layer of answering at the cap (samples that
  exit before it keep their exit's answer), measured on the feedback windows
  (:func:`cap_agreement`), or before any feedback the cap ramp's held-out agreement;
- latency per batch size: the blocks up to the cap's site and the heads of the active
  ramps up to it (:func:`cap_latency_ms`), as if no sample left earlier. In compute mode
  earlier exits shrink the batch, so this bounds the time from above, and the router's
  live slowdown factor (measured over profiled time) takes up the difference.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from schemas.messages import ExitConfig

PREFIX = "depth<="
FINAL = f"{PREFIX}final"
SOURCE_PREPARED = "prepare"    # subnet_profiles rows from the manifest (before feedback)
SOURCE_MEASURED = "profiler"   # ... from the latency profile and the monitor's windows


def cap_key(ramp: int | None) -> str:
    """The variant key of a cap at ``ramp`` (None: no cap)."""
    return FINAL if ramp is None else f"{PREFIX}{int(ramp)}"


def is_cap(variant: str | None) -> bool:
    return variant is not None and variant.startswith(PREFIX)


def cap_ramp(variant: str) -> int | None:
    """The ramp a cap key names (None: ``depth<=final``); ValueError for a malformed key."""
    tail = variant[len(PREFIX):] if is_cap(variant) else ""
    if tail == "final":
        return None
    if not tail.isdigit():
        raise ValueError(f"variant {variant!r} is not a depth cap ({PREFIX}RAMP or {FINAL})")
    return int(tail)


def capped_config(config: ExitConfig, site_order: Sequence[int], cap: int | None) -> ExitConfig:
    """``config`` as a batch capped at ramp ``cap`` runs it: the deepest active ramp at or
    before ``cap``'s site answers every sample still unanswered there (an infinite
    threshold). ``site_order``: the model's ramps in site order. With no cap, or no
    active ramp that early, the config is unchanged (the batch runs as the model does).
    ValueError when ``cap`` is not a ramp of the model."""
    if cap is None:
        return config
    pos = {r: i for i, r in enumerate(site_order)}
    if cap not in pos:
        raise ValueError(f"depth cap at ramp {cap}: the model's ramps are {sorted(pos)}")
    early = [r for r in config.active if r in pos and pos[r] <= pos[cap]]
    if not early:
        return config
    stop = max(early, key=pos.__getitem__)
    return dataclasses.replace(config, thresholds={**config.thresholds, stop: math.inf})


def cap_answers(ramp_ids: Sequence[int], ramp_pred: np.ndarray, exit_at: np.ndarray,
                cap: int) -> np.ndarray:
    """Each sample's answer under a cap at ``cap`` (one of ``ramp_ids``, which are in site
    order as the worker evaluates them): its exit's answer if it exited at or before the
    cap, else the cap ramp's prediction."""
    row = list(ramp_ids).index(cap)
    out = np.asarray(ramp_pred[row]).copy()
    for k, r in enumerate(ramp_ids[:row]):
        mask = exit_at == r
        out[mask] = ramp_pred[k][mask]
    return out


def cap_agreement(ramp_ids: Sequence[int], ramp_pred: np.ndarray, exit_at: np.ndarray,
                  final_pred: np.ndarray) -> dict[int, int]:
    """Per ramp of the records, how many samples a cap there answers as the final layer
    does (feedback records: every sample has every listed ramp's prediction)."""
    return {int(r): int((cap_answers(ramp_ids, ramp_pred, exit_at, r) == final_pred).sum())
            for r in ramp_ids}


def cap_latency_ms(block_ms: np.ndarray, head_ms: np.ndarray, ramp_after: Sequence[int],
                   active_sites: Sequence[int], cap_site: int | None) -> np.ndarray:
    """Time per batch size of a batch capped at site ``cap_site`` (None: the whole model),
    no sample leaving earlier: blocks up to the site, plus the heads of the active sites
    up to it. ``block_ms[k]`` / ``head_ms[s]``: block ``k`` / site ``s`` per batch size."""
    last = len(block_ms) - 1 if cap_site is None else ramp_after[cap_site]
    heads = [s for s in active_sites if cap_site is None or s <= cap_site]
    total = np.asarray(block_ms[:last + 1]).sum(axis=0)
    return total + (np.asarray(head_ms)[heads].sum(axis=0) if heads else 0.0)


def cap_rows(batch_sizes: Sequence[int], block_ms: np.ndarray, head_ms: np.ndarray,
             ramp_ids: Sequence[int], ramp_after: Sequence[int], active: Sequence[int],
             accuracy: Mapping[int | None, float]) -> list[dict]:
    """``subnet_profiles`` rows of a model's depth caps: one per active ramp that has an
    accuracy, and ``depth<=final`` (accuracy key None). ``ramp_ids``/``ramp_after``: the
    ramps in site order and the block each follows. The pareto flag marks the caps no
    other cap beats in accuracy without being slower at some batch size."""
    sites = [s for s, r in enumerate(ramp_ids) if r in set(active)]
    rows = []
    for cap in [*(ramp_ids[s] for s in sites), None]:
        if cap not in accuracy:
            continue
        site = None if cap is None else list(ramp_ids).index(cap)
        ms = cap_latency_ms(block_ms, head_ms, ramp_after, sites, site)
        rows.append({"variant": cap_key(cap), "accuracy": float(accuracy[cap]),
                     "labelled_accuracy": None,
                     "latency_ms": {int(b): float(t) for b, t in zip(batch_sizes, ms)}})
    for r in rows:
        r["pareto"] = not any(o is not r and o["accuracy"] >= r["accuracy"]
                              and all(o["latency_ms"][b] <= r["latency_ms"][b]
                                      for b in r["latency_ms"])
                              and (o["accuracy"] > r["accuracy"]
                                   or o["latency_ms"] != r["latency_ms"]) for o in rows)
    return rows


def lever_caps(manifest: Mapping, count: int = 3, batch: int = 16) -> list[int]:
    """The ramps to serve as depth caps when the caps are SuperServe's lever (a compute-mode
    model under a variant policy), rather than Apparate's latency-mode exits within the
    ramp budget. A cap's worth there is the throughput range it opens: the fastest cap
    bounds the load the workers can take in a burst, or when one of them dies. So: among
    the trained ramps no other beats on held-out agreement at no more cost (the cost at
    batch ``batch``: the blocks up to the ramp's site), the cheapest, then the ones
    nearest to ``count - 1`` evenly spaced costs between it and the whole model; fewer
    when they coincide. Ramp indices in site order; [] for a model without trained ramps."""
    blocks = sorted(manifest.get("blocks", []), key=lambda b: int(b["index"]))

    def block_ms(b: Mapping) -> float:
        return float((b.get("cost_by_batch") or {}).get(str(batch), b.get("cost_ms", 0.0)))

    upto = np.cumsum([block_ms(b) for b in blocks]) if blocks else np.zeros(0)
    ramps = [(float(upto[int(r["after_block"])]), -float(r["agreement"]), int(r["index"]))
             for r in manifest.get("ramps", [])
             if r.get("trained", True) and r.get("agreement") is not None
             and int(r["after_block"]) < len(upto)]
    front, best = [], -math.inf
    for cost, neg_agree, index in sorted(ramps):
        if -neg_agree > best:
            front.append((cost, index))
            best = -neg_agree
    if not front or count < 1:
        return []
    lo, hi = front[0][0], float(upto[-1])
    chosen = [front[0][1]]
    for j in range(1, count):
        target = lo + j * (hi - lo) / count
        near = min(front, key=lambda c: abs(c[0] - target))[1]
        if near not in chosen:
            chosen.append(near)
    order = {int(r["index"]): (int(r["after_block"]), int(r["index"]))
             for r in manifest.get("ramps", [])}
    return sorted(chosen, key=order.__getitem__)


def cap_accuracy(manifest: Mapping, feedback: Mapping[int | None, float]) -> dict[int | None, float]:
    """Each cap's accuracy: the monitor's measure (``feedback``: ramp, or None for the
    final cap, -> agreement) where it has one, else the ramp's held-out agreement from
    preparation (every sample answering there, as with thresholds 0) and 1.0 for the
    final cap (the model's own answers)."""
    out: dict[int | None, float] = {int(r["index"]): float(r["agreement"])
                                    for r in manifest.get("ramps", [])
                                    if r.get("trained", True) and r.get("agreement") is not None}
    out[None] = 1.0
    out.update({k: float(v) for k, v in feedback.items()})
    return out


def cap_profile(manifest: Mapping, latency_rows: Iterable[Mapping], active: Sequence[int],
                accuracy: Mapping[int | None, float]) -> list[dict]:
    """:func:`cap_rows` of a model from its manifest (as a dict) and latency-profile rows
    (``kind``, ``idx``, ``batch_size``, ``ms``), over the batch sizes where every block
    and ramp head was measured; [] when none was."""
    blocks = sorted(int(b["index"]) for b in manifest.get("blocks", []))
    ramps = sorted(manifest.get("ramps", []), key=lambda r: (int(r["after_block"]),
                                                              int(r["index"])))
    ms = {(r["kind"], int(r["idx"]), int(r["batch_size"])): float(r["ms"]) for r in latency_rows}
    need = [("block", k) for k in blocks] + [("ramp", int(r["index"])) for r in ramps]
    sizes = sorted(b for b in {b for _k, _i, b in ms} if all((k, i, b) in ms for k, i in need))
    if not sizes or not blocks:
        return []
    block_ms = np.array([[ms["block", k, b] for b in sizes] for k in blocks])
    head_ms = np.array([[ms["ramp", int(r["index"]), b] for b in sizes] for r in ramps])
    return cap_rows(sizes, block_ms, head_ms.reshape(len(ramps), len(sizes)),
                    [int(r["index"]) for r in ramps], [int(r["after_block"]) for r in ramps],
                    active, accuracy)

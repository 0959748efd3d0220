"""Discrete-event replay of variant serving (SuperServe §5, §6): a global EDF queue in front
of ``workers`` identical workers, and a variant policy (``services.router.variant_policies``,
the very objects the router runs) choosing (variant, batch) whenever a worker is free and
requests wait.

- Every request has the same SLO; its deadline is its arrival plus the SLO.
- A free worker asks the policy at once when requests wait (work-conserving, as
  SuperServe's router), else it takes the next arrival the moment it comes.
- A request still queued at its deadline is dropped: it has missed (as the router refuses
  what is past its deadline).
- A batch takes its variant's profiled time at its size; every request in it attains its
  SLO if the batch ends by its deadline, and is served at the variant's accuracy.
- Worker faults: ``faults`` lists (time, workers alive from then on); a worker beyond the
  count finishes the batch it runs and takes no more until the count allows it again.

Metrics as SuperServe §6.1 defines them: SLO attainment (answered within the SLO over all
requests) and mean serving accuracy (the variant's profiled accuracy, averaged over the
requests that attained the SLO).

Pure: numpy and heapq, no I/O, no clock.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from services.router.policy import Policy, QueueView
from services.router.variant_table import VariantProfile


@dataclass(frozen=True)
class ServeLog:
    """Per request and per batch, what happened."""

    arrival: np.ndarray       # s
    finish: np.ndarray        # s; NaN: dropped at its deadline, never served
    attained: np.ndarray      # bool
    accuracy: np.ndarray      # the serving variant's accuracy; NaN if never served
    batch_start: np.ndarray   # s, one per batch
    batch_size: np.ndarray
    batch_variant: list[str]

    @property
    def attainment(self) -> float:
        return float(self.attained.mean()) if self.attained.size else 1.0

    @property
    def mean_accuracy(self) -> float | None:
        ok = self.accuracy[self.attained]
        return float(ok.mean()) if ok.size else None


def alive_at(faults: Sequence[tuple[float, int]], workers: int, t: float) -> int:
    """Workers alive at ``t`` under the fault schedule (all of them before any fault)."""
    alive = workers
    for when, count in faults:
        if when <= t:
            alive = count
    return max(0, min(workers, alive))


def simulate(policy: Policy, variants: Mapping[str, VariantProfile], arrivals: np.ndarray,
             slo_ms: float, workers: int,
             faults: Sequence[tuple[float, int]] = ()) -> ServeLog:
    n = len(arrivals)
    arrival = np.asarray(arrivals, dtype=np.float64)
    deadline = arrival + slo_ms / 1e3
    finish = np.full(n, np.nan)
    acc = np.full(n, np.nan)
    queue: list[tuple[float, int]] = []
    free = [(0.0, w) for w in range(workers)]
    starts, sizes, names = [], [], []
    nxt, faults, clock = 0, sorted(faults), 0.0
    view_batch = getattr(policy, "max_batch", 16)
    while free and (nxt < n or queue):
        t, w = heapq.heappop(free)
        t = max(t, clock)   # an idle worker acts no earlier than what already happened
        if w >= alive_at(faults, workers, t):
            back = next((when for when, c in faults if when > t and c > w), None)
            if back is not None:
                heapq.heappush(free, (back, w))
            continue
        if not queue:
            if nxt >= n:
                break
            t = max(t, arrival[nxt])
        clock = t
        while nxt < n and arrival[nxt] <= t:
            heapq.heappush(queue, (deadline[nxt], nxt))
            nxt += 1
        while queue and queue[0][0] <= t:
            heapq.heappop(queue)            # missed: its deadline passed in the queue
        if not queue:
            heapq.heappush(free, (t, w))
            continue
        head = queue[0][0]
        left_ms = (head - t) * 1e3
        urgent = tuple((d - t) * 1e3 for d, _ in heapq.nsmallest(view_batch, queue))
        d = policy.decide(QueueView(len(queue), 0.0, left_ms, left_ms,
                                    workers=max(1, alive_at(faults, workers, t)),
                                    deadlines_ms=urgent))
        take = [heapq.heappop(queue)[1] for _ in range(min(max(1, d.batch_size), len(queue)))]
        v = variants[d.variant] if d.variant is not None else next(iter(variants.values()))
        end = t + v.latency(len(take)) / 1e3
        finish[take] = end
        acc[take] = v.accuracy
        starts.append(t)
        sizes.append(len(take))
        names.append(v.key)
        heapq.heappush(free, (end, w))
    attained = np.nan_to_num(finish, nan=np.inf) <= deadline + 1e-12
    return ServeLog(arrival, finish, attained, acc, np.asarray(starts), np.asarray(sizes),
                    names)


def timeline(log: ServeLog, step_s: float = 1.0) -> dict[str, list[float | None]]:
    """Per ``step_s`` bin of arrival time: offered rate, attainment, mean serving accuracy
    (attained requests) and mean batch size (of batches started in the bin)."""
    if log.arrival.size == 0:
        return {"t": [], "rate": [], "attainment": [], "accuracy": [], "batch": []}
    edges = np.arange(0.0, float(log.arrival.max()) + 1e-9, step_s)
    idx = np.clip(np.searchsorted(edges, log.arrival, side="right") - 1, 0, len(edges) - 1)
    bidx = np.clip(np.searchsorted(edges, log.batch_start, side="right") - 1, 0,
                   len(edges) - 1)
    out: dict[str, list[float | None]] = {"t": [], "rate": [], "attainment": [],
                                          "accuracy": [], "batch": []}
    for k, start in enumerate(edges):
        sel = idx == k
        ok = sel & log.attained
        bs = log.batch_size[bidx == k]
        out["t"].append(float(start))
        out["rate"].append(float(sel.sum() / step_s))
        out["attainment"].append(float(log.attained[sel].mean()) if sel.any() else None)
        out["accuracy"].append(float(log.accuracy[ok].mean()) if ok.any() else None)
        out["batch"].append(float(bs.mean()) if bs.size else None)
    return out

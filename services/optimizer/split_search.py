"""The search behind :mod:`services.optimizer.splits`: tables over (boundary, devices used
per class), one per target goodput; pure numpy, no model knowledge.

A plan is a path of stage options from boundary 0 (the model input) to boundary ``end``
(the model output), each option a stage ``u → v`` on one device class (a grid ``axis``).
``per_replica`` is the goodput (samples entering the model per second) one replica of the
stage sustains, ``link`` the goodput its outgoing link sustains, ``latency_ms`` what the
stage adds to a sample's worst-case latency (fill + batch + transfer; independent of its
replicas). At a target goodput ``G`` an option needs ``ceil(G / per_replica)`` replicas.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

EPS = 1e-9  # relative tolerance of capacity, latency and cost comparisons


@dataclass(frozen=True)
class StageOption:
    u: int
    v: int
    axis: int
    latency_ms: float
    per_replica: float
    link: float


Cell = tuple[int, ...]


class Search:
    """Tables for one problem; ``sweep(g)`` is memoised per target goodput."""

    def __init__(self, options: Sequence[StageOption], counts: Sequence[int],
                 costs: Sequence[float], end: int, budget_ms: float) -> None:
        self.counts, self.costs, self.end = tuple(counts), tuple(costs), end
        self.dims = tuple(c + 1 for c in counts)
        self.budget = budget_ms * (1 + EPS)
        self.options = self._on_time(sorted(options, key=lambda o: (o.v, o.u, o.axis)))
        grids = np.indices(self.dims)
        self.rates = sum((g * c for g, c in zip(grids, costs)), start=np.zeros(self.dims))
        self.per = np.array([o.per_replica for o in self.options])
        self.link = np.array([o.link for o in self.options])
        self.lat = np.array([o.latency_ms for o in self.options])
        self.cap = np.array([counts[o.axis] for o in self.options])
        self.memo: dict[float, np.ndarray] = {}
        self.slices: dict[tuple[int, int], tuple[tuple, tuple]] = {}

    def _on_time(self, options: list[StageOption]) -> list[StageOption]:
        """The options (sorted by end boundary) that lie on some plan within the latency
        budget, inventory aside: the fastest way to reach them plus the fastest way on."""
        to = [0.0] + [math.inf] * self.end
        for o in options:
            to[o.v] = min(to[o.v], to[o.u] + o.latency_ms)
        on = [math.inf] * self.end + [0.0]
        for o in reversed(options):
            on[o.u] = min(on[o.u], o.latency_ms + on[o.v])
        self.fastest_ms = to[self.end]
        return [o for o in options if to[o.u] + o.latency_ms + on[o.v] <= self.budget]

    def fastest(self) -> float:
        """Least worst-case latency of any plan, inventory aside."""
        return self.fastest_ms

    def rate_floor(self, g: float) -> float:
        """A cheap lower bound of :meth:`least_rate`: the least Σ replicas × cost over
        paths, stage by stage, ignoring the latency sum and sharing of the inventory."""
        m, ok = self.usable(g)
        best = [0.0] + [math.inf] * self.end
        for i in np.flatnonzero(ok):
            o = self.options[i]
            best[o.v] = min(best[o.v], best[o.u] + int(m[i]) * self.costs[o.axis])
        return best[self.end]

    def cheapest_per_answer(self) -> float:
        """Least Σ cost / per_replica over plans: at any goodput G every stage needs at least
        G / per_replica replicas, so a plan costs at least this per answer."""
        best = [0.0] + [math.inf] * self.end
        for o in self.options:
            w = self.costs[o.axis] / o.per_replica if math.isfinite(o.per_replica) else 0.0
            best[o.v] = min(best[o.v], best[o.u] + w)
        return best[self.end]

    def targets(self, rate: float) -> np.ndarray:
        """Every goodput a plan can have, descending: R, and each m × per_replica (m within
        the class) and link capacity below R."""
        vals = [rate]
        for o in self.options:
            if math.isfinite(o.per_replica):
                vals.extend(m * o.per_replica for m in range(1, self.counts[o.axis] + 1)
                            if m * o.per_replica < rate)
            if o.link < rate:
                vals.append(o.link)
        return np.unique(np.array(vals))[::-1]

    def usable(self, g: float) -> tuple[np.ndarray, np.ndarray]:
        """Replicas of every option at target ``g`` and which options can take part."""
        with np.errstate(divide="ignore"):
            m = np.maximum(np.ceil(g / self.per - EPS), 1).astype(np.int64)
        ok = (m <= self.cap) & (self.link >= g * (1 - EPS)) & (self.lat <= self.budget)
        return m, ok

    def shift(self, axis: int, m: int) -> tuple[tuple, tuple]:
        """(destination, source) slices that add ``m`` devices on ``axis``."""
        key = (axis, m)
        if key not in self.slices:
            n = len(self.dims)
            dst = tuple(slice(m, None) if i == axis else slice(None) for i in range(n))
            src = tuple(slice(None, -m) if i == axis else slice(None) for i in range(n))
            self.slices[key] = (dst, src)
        return self.slices[key]

    def start(self) -> np.ndarray:
        t = np.full(self.dims, math.inf)
        t[(0,) * len(self.dims)] = 0.0
        return t

    def sweep(self, g: float) -> np.ndarray:
        """Least latency of a whole plan per devices-used cell at target goodput ``g``."""
        if g in self.memo:
            return self.memo[g]
        m, ok = self.usable(g)
        best: list[np.ndarray | None] = [None] * (self.end + 1)
        best[0] = self.start()
        for i in np.flatnonzero(ok):
            o = self.options[i]
            src = best[o.u]
            if src is None:
                continue
            if best[o.v] is None:
                best[o.v] = np.full(self.dims, math.inf)
            dst_sl, src_sl = self.shift(o.axis, int(m[i]))
            view = best[o.v][dst_sl]
            np.minimum(view, src[src_sl] + self.lat[i], out=view)
        end = best[self.end]
        self.memo[g] = np.full(self.dims, math.inf) if end is None else end
        return self.memo[g]

    def feasible(self, g: float) -> np.ndarray:
        """Cells holding a plan within the latency budget at target ``g``."""
        return self.sweep(g) <= self.budget

    def highest(self, targets: np.ndarray) -> int | None:
        """Index of the largest target with a plan within latency and inventory (binary
        search: lowering the goodput only removes replicas)."""
        if self.feasible(float(targets[0])).any():
            return 0  # the common case: the whole rate
        if not self.feasible(float(targets[-1])).any():
            return None
        lo, hi = 1, len(targets) - 1
        while lo < hi:
            mid = (lo + hi) // 2
            if self.feasible(float(targets[mid])).any():
                hi = mid
            else:
                lo = mid + 1
        return lo

    def least_rate(self, g: float) -> float:
        """Least cost rate (Σ replicas × cost per second) of a plan within the latency budget
        and the inventory at target ``g``; inf when there is none."""
        ok = self.feasible(g)
        return float(self.rates[ok].min()) if ok.any() else math.inf

    def first_within(self, targets: np.ndarray, a: int, b: int, cap: float) -> int | None:
        """The first index in ``a..b`` whose table holds a plan costing at most ``cap`` per
        1,000 answers at that target (cost rate ≤ cap × g / 1000). Not monotone in the
        target (a replica less can make a lower goodput cheaper per answer), so ranges are
        pruned instead: over ``a..b`` the least rate is at least that at ``b`` (lower
        targets never need more replicas) and the allowance at most that at ``a``. Ranges
        split at the geometric middle of their goodputs, higher goodputs first."""
        allowance = cap * float(targets[a]) / 1000.0 * (1 + EPS)
        g_a, g_b = float(targets[a]), float(targets[b])
        if self.rate_floor(g_a) <= allowance and self.least_rate(g_a) <= allowance:
            return a
        if a == b or self.rate_floor(g_b) > allowance or self.least_rate(g_b) > allowance:
            return None
        middle = math.sqrt(float(targets[a]) * float(targets[b]))
        mid = int(np.searchsorted(-targets, -middle, side="right")) - 1
        mid = min(max(mid, a), b - 1)
        first = self.first_within(targets, a, mid, cap)
        return first if first is not None else self.first_within(targets, mid + 1, b, cap)

    def cheapest_seen(self) -> float:
        """Least cost per 1,000 answers over the targets swept so far."""
        return min((1000.0 * self.least_rate(g) / g for g in self.memo), default=math.inf)

    def fewest_stages(self, g: float, wanted: np.ndarray) -> list[tuple[StageOption, int]]:
        """(option, replicas) of each stage of the plan with the fewest stages (then the
        least latency) ending in a ``wanted`` cell within the budget at target ``g``."""
        m, ok = self.usable(g)
        idx = np.flatnonzero(ok)
        layers: list[dict[int, np.ndarray]] = [{0: self.start()}]
        for _ in range(self.end):
            layers.append(self._layer(layers[-1], idx, m))
            last = layers[-1].get(self.end)
            if last is not None:
                hit = np.where(wanted & (last <= self.budget), last, math.inf)
                if np.isfinite(hit).any():
                    cell = np.unravel_index(int(np.argmin(hit)), hit.shape)
                    return self._trace(layers, tuple(int(c) for c in cell), idx, m)
        raise ValueError("no wanted cell is reachable at this goodput")

    def _layer(self, layer: dict[int, np.ndarray], idx: np.ndarray,
               m: np.ndarray) -> dict[int, np.ndarray]:
        """Least latency of plans with one stage more, per boundary and cell."""
        nxt: dict[int, np.ndarray] = {}
        for i in idx:
            o = self.options[i]
            if o.u not in layer:
                continue
            if o.v not in nxt:
                nxt[o.v] = np.full(self.dims, math.inf)
            dst_sl, src_sl = self.shift(o.axis, int(m[i]))
            view = nxt[o.v][dst_sl]
            np.minimum(view, layer[o.u][src_sl] + self.lat[i], out=view)
        return nxt

    def _trace(self, layers: list[dict[int, np.ndarray]], cell: Cell, idx: np.ndarray,
               m: np.ndarray) -> list[tuple[StageOption, int]]:
        """Walk back through the layers: at each, a stage whose sum gives the value held."""
        out, v, x = [], self.end, cell
        for k in range(len(layers) - 1, 0, -1):
            held = float(layers[k][v][x])
            for i in idx:
                o, n = self.options[i], int(m[i])
                prev = layers[k - 1].get(o.u)
                if o.v != v or prev is None or x[o.axis] < n:
                    continue
                before = x[:o.axis] + (x[o.axis] - n,) + x[o.axis + 1:]
                if abs(float(prev[before]) + self.lat[i] - held) <= EPS * max(1.0, held):
                    out.append((o, n))
                    v, x = o.u, before
                    break
        return out[::-1]

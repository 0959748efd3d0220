"""The exit wrapper (E3 §3.4, evaluated in §5.8.6): inside one stage, ramps that do not pay
for themselves are switched off; the ramp that ends a stage (its cut) always runs, since the
survivors leave the stage there.

A ramp pays when the compute its exits save downstream inside the stage exceeds its head's
cost at the batch that reaches it. What it saves runs up to the next running ramp (after
that the batch is the same either way, survival being cumulative, see
:mod:`services.optimizer.block_costs`) and beyond the cut nothing changes, since the next
stage fuses its input back to the full batch. So whether a ramp pays depends on which
others run; the rule is applied as a whole: the running set is the one that minimises the
stage's time, found exactly as a shortest path over the stage's ramp sites (entry → running
ramps in order → end). Every ramp kept in that set pays strictly (ties go to the smaller
set), and every ramp it drops would not pay given the others; a greedy "drop the worst,
repeat" only reaches a local fixpoint of the same rule.

Without the wrapper (``keep_all``, the paper's default evaluation) every ramp of the stage
runs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from services.optimizer.block_costs import LatencyTable, ModelChain, relative

TOL = 1e-9  # relative: stage times closer than this are a tie (the smaller set wins)
_MANY = np.iinfo(np.int64).max


@dataclass(frozen=True)
class RampChoice:
    """One stage's ramps: ``active`` run (the cut last, when the stage ends at one),
    ``disabled`` are the stage's other sites; ``stage_ms`` is a fused batch's time."""

    first_block: int
    last_block: int
    active: tuple[int, ...]
    disabled: tuple[int, ...]
    stage_ms: float


def _pick(t: np.ndarray, n: np.ndarray) -> int:
    """Index of the least time; among times within TOL of it, the fewest running ramps."""
    lo = float(t.min())
    near = t <= lo + TOL * max(1.0, abs(lo))
    return int(np.argmin(np.where(near, n, _MANY)))


def best_chain(seg: np.ndarray, head: np.ndarray,
               keep_all: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Shortest paths over positions 0 (the stage entry) and 1..n (ramp sites in order).

    ``seg[a, b]`` (``a < b``): ms of the blocks after position ``a`` up to position ``b``'s
    block, at the batch left after ``a``; ``head[a, b]``: ``b``'s head at that batch.
    Returns ``best[p]``, the least ms from the entry through ``p`` with its ramp running
    (head included), ``parent[p]``, the running position before it (-1: none), and
    ``count[p]``, the ramps running on that path. ``keep_all``: every ramp runs.
    """
    n = seg.shape[0] - 1
    best = np.full(n + 1, math.inf)
    best[0] = 0.0
    parent = np.full(n + 1, -1, dtype=np.int64)
    count = np.zeros(n + 1, dtype=np.int64)
    for b in range(1, n + 1):
        lo = b - 1 if keep_all else 0
        t = best[lo:b] + seg[lo:b, b] + head[lo:b, b]
        a = lo + _pick(t, count[lo:b])
        best[b], parent[b], count[b] = best[a] + seg[a, b] + head[a, b], a, count[a] + 1
    return best, parent, count


def path(parent: np.ndarray, p: int) -> list[int]:
    """Running positions from the entry to ``p`` (entry excluded), in order."""
    out = []
    while p > 0:
        out.append(p)
        p = int(parent[p])
    return out[::-1]


def stage_choices(chain: ModelChain, table: LatencyTable, first_block: int, batch: int,
                  keep_all: bool = False) -> dict[int, RampChoice]:
    """The ramp choice of every stage that starts at ``first_block``, keyed by its last
    block: the block of each later cut site, and the model's last block."""
    chain.check_table(table)
    s_in = chain.survival_in(first_block)
    sites = [s for s, a in enumerate(chain.ramp_after) if a >= first_block]
    n, last = len(sites), chain.n_blocks - 1
    rel = np.array([1.0] + [relative(chain.survival[s], s_in) for s in sites])
    # row p: cumulative ms of blocks (and each head) at the batch left after position p
    cum = np.hstack([np.zeros((n + 1, 1)), np.cumsum(table.blocks_at(batch * rel).T, axis=1)])
    heads = table.heads_at(batch * rel).T
    start = np.array([first_block] + [chain.ramp_after[s] + 1 for s in sites])
    end = np.array([first_block - 1] + [chain.ramp_after[s] for s in sites])
    from_start = cum[np.arange(n + 1), start]
    seg = cum[:, end + 1] - from_start[:, None]
    head = np.hstack([np.zeros((n + 1, 1)), heads[:, sites]])
    best, parent, count = best_chain(seg, head, keep_all)

    def choice(last_block: int, running: list[int], ms: float) -> RampChoice:
        inside = [s for s in sites if chain.ramp_after[s] <= last_block]
        active = tuple(sites[p - 1] for p in running)
        return RampChoice(first_block, last_block, active,
                          tuple(s for s in inside if s not in active), float(ms))

    out = {int(end[p]): choice(int(end[p]), path(parent, p), best[p])
           for p in range(1, n + 1) if end[p] < last}
    lo = n if keep_all else 0
    tail = best[lo:] + cum[lo:, last + 1] - from_start[lo:]
    a = lo + _pick(tail, count[lo:])
    out[last] = choice(last, path(parent, a), tail[a - lo])
    return out


def stage_ramps(chain: ModelChain, table: LatencyTable, first_block: int, last_block: int,
                batch: int, keep_all: bool = False) -> RampChoice:
    """Which ramps run in the stage ``first_block..last_block`` at fused batch ``batch``."""
    choices = stage_choices(chain, table, first_block, batch, keep_all)
    if last_block not in choices:
        raise ValueError(f"a stage ends at a ramp site or at the model's last block, "
                         f"not after block {last_block}")
    return choices[last_block]

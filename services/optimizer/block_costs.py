"""What blocks and ramp heads cost on one device class, and what one pipeline stage costs.

The model is a chain of ``n_blocks`` blocks; ramp site ``s`` sits after block
``ramp_after[s]`` (strictly increasing). ``survival[s]`` is the forecast fraction of the
samples entering the model still alive after the ramp at site ``s`` (non-increasing, in
[0, 1]). Survival is read as cumulative: a sample that an earlier, disabled ramp would have
let out leaves at the next active ramp instead, so survival into block ``k`` is the
survival after the last *active* ramp before ``k`` (1 before any).

Latency at a batch size that was not measured (choices, kept simple and monotone):

- between two measured sizes: linear interpolation;
- below the smallest measured size: linear from the origin (``b / b_0`` of the smallest
  batch's time). Inside a stage the batch shrinks as samples exit, so the forecast batch is
  a real number; at a fractional batch the time is the expected cost of the samples there;
- beyond the largest: the marginal time per sample of the last two measured sizes, floored
  at zero so that a larger batch never takes less time (one measured size: proportional);
- a table whose time falls as the batch grows (timing noise) is raised to its running
  maximum along the batch axis.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise

import numpy as np


def interpolate(batch_sizes: np.ndarray, ms: np.ndarray, batch: float | np.ndarray) -> np.ndarray:
    """Time of each row of ``ms`` (shape ``(rows, len(batch_sizes))``, non-decreasing along
    a row) at ``batch``: shape ``(rows,)``, or ``(rows, M)`` for ``M`` batch sizes."""
    xs = batch_sizes
    b = np.asarray(batch, dtype=np.float64)
    first = ms[:, 0] if b.ndim == 0 else ms[:, :1]
    below = first * (b / xs[0])  # the origin to the smallest size; one size: everywhere
    if xs.size == 1:
        return below
    i = np.clip(np.searchsorted(xs, b, side="right") - 1, 0, xs.size - 2)
    w = (b - xs[i]) / (xs[i + 1] - xs[i])  # > 1 beyond the largest: the last two points' line
    line = ms[:, i] * (1.0 - w) + ms[:, i + 1] * w  # rows are non-decreasing: so is the line
    return np.where(b < xs[0], below, line)


def _table(values: object, cols: int, what: str) -> np.ndarray:
    arr = np.array(values, dtype=np.float64)
    if arr.size == 0:
        arr = np.zeros((0, cols))
    if arr.ndim != 2 or arr.shape[1] != cols:
        raise ValueError(f"{what} needs one column per measured batch size ({cols})")
    if not np.all(np.isfinite(arr)) or np.any(arr < 0):
        raise ValueError(f"{what} entries must be finite and non-negative")
    arr = np.maximum.accumulate(arr, axis=1)  # a bigger batch never takes less time
    arr.flags.writeable = False
    return arr


@dataclass(frozen=True, eq=False)
class LatencyTable:
    """Measured ms of every block and every ramp head on one device class.

    ``block_ms[k][i]`` is block ``k`` at batch ``batch_sizes[i]``; ``head_ms[s][i]`` is the
    head of the ramp at site ``s`` (run on the output of its block) at that batch.
    """

    batch_sizes: tuple[int, ...]
    block_ms: np.ndarray
    head_ms: np.ndarray

    def __post_init__(self) -> None:
        sizes = tuple(int(b) for b in self.batch_sizes)
        if not sizes or sizes[0] < 1 or any(b >= c for b, c in pairwise(sizes)):
            raise ValueError(f"batch_sizes must be positive and increasing, got {sizes}")
        blocks = _table(self.block_ms, len(sizes), "block_ms")
        if blocks.shape[0] == 0:
            raise ValueError("block_ms needs one row per block")
        object.__setattr__(self, "batch_sizes", sizes)
        object.__setattr__(self, "block_ms", blocks)
        object.__setattr__(self, "head_ms", _table(self.head_ms, len(sizes), "head_ms"))
        object.__setattr__(self, "_xs", np.array(sizes, dtype=np.float64))

    @classmethod
    def build(cls, batch_sizes: Sequence[int], block_ms: Sequence[Sequence[float]],
              head_ms: Sequence[Sequence[float]]) -> LatencyTable:
        return cls(tuple(batch_sizes), np.asarray(block_ms, dtype=np.float64),
                   np.asarray(head_ms, dtype=np.float64))

    @property
    def n_blocks(self) -> int:
        return int(self.block_ms.shape[0])

    @property
    def n_sites(self) -> int:
        return int(self.head_ms.shape[0])

    def blocks_at(self, batch: float | np.ndarray) -> np.ndarray:
        """ms of every block at ``batch``: ``(n_blocks,)``, or ``(n_blocks, M)`` for M sizes."""
        return interpolate(self._xs, self.block_ms, batch)

    def heads_at(self, batch: float | np.ndarray) -> np.ndarray:
        """ms of every ramp head at ``batch``: ``(n_sites,)``, or ``(n_sites, M)``."""
        return interpolate(self._xs, self.head_ms, batch)


@dataclass(frozen=True)
class ModelChain:
    """The geometry of an early-exit model and the forecast of how its batch shrinks."""

    n_blocks: int
    ramp_after: tuple[int, ...]
    survival: tuple[float, ...]

    def __post_init__(self) -> None:
        after = tuple(int(a) for a in self.ramp_after)
        surv = tuple(float(s) for s in self.survival)
        if self.n_blocks < 1:
            raise ValueError("a model has at least one block")
        if any(not 0 <= a < self.n_blocks for a in after) or \
                any(a >= b for a, b in pairwise(after)):
            raise ValueError(f"ramp_after must increase inside [0, {self.n_blocks - 1}]: {after}")
        if len(surv) != len(after):
            raise ValueError(f"survival needs {len(after)} entries (one per site), got {len(surv)}")
        if any(not 0.0 <= s <= 1.0 for s in surv) or any(a < b for a, b in pairwise(surv)):
            raise ValueError(f"survival must be non-increasing inside [0, 1]: {surv}")
        object.__setattr__(self, "ramp_after", after)
        object.__setattr__(self, "survival", surv)

    def check_table(self, table: LatencyTable) -> None:
        if table.n_blocks != self.n_blocks or table.n_sites != len(self.ramp_after):
            raise ValueError(f"latency table is {table.n_blocks} blocks x {table.n_sites} heads, "
                             f"the model {self.n_blocks} x {len(self.ramp_after)}")

    def site_after(self, block: int) -> int | None:
        """The ramp site right after ``block``, if there is one."""
        return next((s for s, a in enumerate(self.ramp_after) if a == block), None)

    def survival_in(self, first_block: int) -> float:
        """Survival into a stage that starts at ``first_block`` (its previous cut is active)."""
        if first_block == 0:
            return 1.0
        s = self.site_after(first_block - 1)
        if s is None:
            raise ValueError(f"a stage starts after a ramp site; block {first_block - 1} has none")
        return self.survival[s]


def monotone_survival(values: Sequence[float]) -> tuple[float, ...]:
    """A forecast made valid for :class:`ModelChain`: clipped to [0, 1], running minimum."""
    clipped = np.clip(np.nan_to_num(np.asarray(values, dtype=np.float64), nan=1.0), 0.0, 1.0)
    return tuple(float(v) for v in np.minimum.accumulate(clipped)) if clipped.size else ()


def relative(survival: float, survival_in: float) -> float:
    """Fraction of a stage's fused batch still alive: 1 when the stage sees no sample at all
    (a batch that does arrive runs full)."""
    return survival / survival_in if survival_in > 0 else 1.0


def stage_ms(chain: ModelChain, table: LatencyTable, first_block: int, last_block: int,
             batch: int, active: Sequence[int]) -> float:
    """Time of one fused batch of ``batch`` through blocks ``first_block..last_block`` with
    the ramps at sites ``active`` running (the paper's T(i→j) = Σ_k P(k, B_k)): every block
    and head runs at the batch left after the last active ramp before it."""
    chain.check_table(table)
    s_in = chain.survival_in(first_block)
    on = set(active)
    rel, total = 1.0, 0.0
    for k in range(first_block, last_block + 1):
        total += float(table.blocks_at(batch * rel)[k])
        s = chain.site_after(k)
        if s is not None and s in on:
            total += float(table.heads_at(batch * rel)[s])
            rel = relative(chain.survival[s], s_in)
    return total

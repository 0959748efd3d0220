"""Subnets of a weight-shared supernet (SuperServe §2.2, §3): the control tuple
(D, W) that picks one architecture out of the supernet, and the space it is drawn from.

A conv supernet has stages of repeated blocks. ``depths[m]`` is how many of stage m's
blocks run (LayerSelect keeps the first ``depths[m]``); ``widths[m]`` is the fraction of
the channels inside each of stage m's blocks that run (WeightSlice keeps the first
``ceil(widths[m] * C)``). Widths are per stage, not per block as the paper allows: on a
small supernet that keeps the space a few thousand subnets, all of which can be
calibrated and profiled, instead of one that only sampling could cover.

A subnet's key (``D=1,2,2,1;W=0.5,1,0.75,0.25``) names it on the bus, in the store and in
the per-subnet normalization statistics. Pure: no torch, no I/O.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class Subnet:
    depths: tuple[int, ...]     # blocks run per stage
    widths: tuple[float, ...]   # fraction of each block's inner channels, per stage

    @property
    def key(self) -> str:
        return (f"D={','.join(str(d) for d in self.depths)};"
                f"W={','.join(_num(w) for w in self.widths)}")

    def __str__(self) -> str:
        return self.key


def _num(w: float) -> str:
    return f"{w:g}"


def parse_subnet(key: str) -> Subnet:
    """The subnet a key names; ``ValueError`` saying what is wrong otherwise."""
    parts = dict(p.split("=", 1) for p in key.strip().split(";") if "=" in p)
    if set(parts) != {"D", "W"}:
        raise ValueError(f"a subnet key reads 'D=d1,d2,...;W=w1,w2,...', got {key!r}")
    try:
        depths = tuple(int(x) for x in parts["D"].split(","))
        widths = tuple(float(x) for x in parts["W"].split(","))
    except ValueError:
        raise ValueError(f"subnet key {key!r}: depths are integers, widths numbers") from None
    return Subnet(depths, widths)


def active_channels(width: float, channels: int) -> int:
    """Channels WeightSlice keeps: the first ``ceil(width * channels)``, at least one."""
    return max(1, math.ceil(width * channels - 1e-9))


@dataclass(frozen=True)
class SubnetSpace:
    """Every (D, W) a supernet offers: per stage a depth in ``1..max_depths[m]`` and a
    width in ``width_choices`` (the same choices for every stage)."""

    max_depths: tuple[int, ...]
    width_choices: tuple[float, ...] = (0.25, 0.5, 0.75, 1.0)

    def __post_init__(self) -> None:
        if not self.max_depths or min(self.max_depths) < 1:
            raise ValueError(f"every stage needs a depth >= 1, got {self.max_depths}")
        if not self.width_choices or not all(0 < w <= 1 for w in self.width_choices):
            raise ValueError(f"widths are fractions in (0, 1], got {self.width_choices}")
        object.__setattr__(self, "width_choices", tuple(sorted(set(self.width_choices))))

    @property
    def stages(self) -> int:
        return len(self.max_depths)

    @property
    def largest(self) -> Subnet:
        return Subnet(self.max_depths, (self.width_choices[-1],) * self.stages)

    @property
    def smallest(self) -> Subnet:
        return Subnet((1,) * self.stages, (self.width_choices[0],) * self.stages)

    def size(self) -> int:
        return math.prod(self.max_depths) * len(self.width_choices) ** self.stages

    def check(self, subnet: Subnet) -> Subnet:
        """``subnet`` if it belongs to this space; ``ValueError`` naming the mismatch."""
        if len(subnet.depths) != self.stages or len(subnet.widths) != self.stages:
            raise ValueError(f"subnet {subnet.key} has {len(subnet.depths)} depths and "
                             f"{len(subnet.widths)} widths; this supernet has {self.stages} "
                             "stages")
        for m, (d, w) in enumerate(zip(subnet.depths, subnet.widths, strict=True)):
            if not 1 <= d <= self.max_depths[m]:
                raise ValueError(f"subnet {subnet.key}: stage {m} depth {d} is outside "
                                 f"1..{self.max_depths[m]}")
            if not any(math.isclose(w, c) for c in self.width_choices):
                raise ValueError(f"subnet {subnet.key}: stage {m} width {w:g} is not one "
                                 f"of {', '.join(_num(c) for c in self.width_choices)}")
        return subnet

    def all(self) -> Iterator[Subnet]:
        """Every subnet, smallest depths and widths first."""
        depth_sets = itertools.product(*(range(1, d + 1) for d in self.max_depths))
        for depths in depth_sets:
            for widths in itertools.product(self.width_choices, repeat=self.stages):
                yield Subnet(tuple(depths), tuple(widths))

    def sample(self, rng: np.random.Generator) -> Subnet:
        """One subnet drawn uniformly (each stage's depth and width independently)."""
        return Subnet(tuple(int(rng.integers(1, d + 1)) for d in self.max_depths),
                      tuple(float(self.width_choices[rng.integers(len(self.width_choices))])
                            for _ in range(self.stages)))

    def sandwich(self, rng: np.random.Generator, middle: int = 2) -> list[Subnet]:
        """The subnets one training step runs under the sandwich rule (Yu & Huang,
        slimmable networks; as OFA and DynaBERT train): the largest, the smallest and
        ``middle`` random ones."""
        return [self.largest, self.smallest, *(self.sample(rng) for _ in range(middle))]


def subnets_of(keys: Sequence[str], space: SubnetSpace) -> list[Subnet]:
    return [space.check(parse_subnet(k)) for k in keys]

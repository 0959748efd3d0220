"""Subnets of a transformer (BERT) supernet (SuperServe §3.1, transformer case): the
control tuple that picks one architecture, and the space it is drawn from.

A transformer supernet has a single stage of ``layers`` stacked encoder layers. A subnet
is ``(depth, heads, ffn)``:

- ``depth``: how many layers run, chosen by the every-other rule (LayerSelect; see
  :func:`kept_layers`);
- ``heads``: the fraction of each layer's attention heads that run (WeightSlice keeps the
  first ``ceil(heads * H)``; the supernet orders heads by importance, so those are the
  most important ones);
- ``ffn``: the fraction of each layer's feed-forward neurons that run (the first
  ``ceil(ffn * F)``, also ordered by importance).

Widths are the same for every layer, as DynaBERT's width multiplier is: a few dozen
subnets, all of which can be scored, instead of a space only sampling could cover.

A key (``L=4;H=0.5;F=0.75``) names the subnet on the bus and in the store; like the conv
keys (:mod:`services.supernet.subnet`) it is opaque to the router. Pure: no torch, no I/O.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from services.supernet.subnet import active_channels


@dataclass(frozen=True, slots=True)
class BertSubnet:
    depth: int     # encoder layers run
    heads: float   # fraction of each layer's attention heads
    ffn: float     # fraction of each layer's feed-forward neurons

    @property
    def key(self) -> str:
        return f"L={self.depth};H={self.heads:g};F={self.ffn:g}"

    def __str__(self) -> str:
        return self.key


def parse_bert_subnet(key: str) -> BertSubnet:
    """The subnet a key names; ``ValueError`` saying what is wrong otherwise."""
    parts = dict(p.split("=", 1) for p in key.strip().split(";") if "=" in p)
    if set(parts) != {"L", "H", "F"}:
        raise ValueError(f"a transformer subnet key reads 'L=depth;H=heads;F=ffn', got {key!r}")
    try:
        return BertSubnet(int(parts["L"]), float(parts["H"]), float(parts["F"]))
    except ValueError:
        raise ValueError(f"subnet key {key!r}: L is an integer, H and F numbers") from None


def kept_layers(layers: int, depth: int) -> tuple[int, ...]:
    """The layers (0-based) a subnet of ``depth`` runs: the every-other rule of SuperServe
    §3.1 / LayerDrop / DynaBERT. Where ``p = layers / (layers - depth)`` is an integer it
    drops every p-th layer (1-based ``n`` with ``n mod p == 0``), as §3.1 states; in
    general it keeps ``floor(i * layers / depth)`` for ``i < depth`` (DynaBERT's code),
    which is the same set there and spreads the dropped layers evenly otherwise."""
    if not 1 <= depth <= layers:
        raise ValueError(f"depth {depth} is outside 1..{layers}")
    return tuple(i * layers // depth for i in range(depth))


def width_count(fraction: float, total: int) -> int:
    """Heads or neurons WeightSlice keeps: the first ``ceil(fraction * total)``."""
    return active_channels(fraction, total)


@dataclass(frozen=True)
class BertSubnetSpace:
    """Every (depth, heads, ffn): a depth in ``depths`` and widths in the choices."""

    layers: int
    head_choices: tuple[float, ...] = (0.25, 0.5, 0.75, 1.0)
    ffn_choices: tuple[float, ...] = (0.25, 0.5, 0.75, 1.0)
    min_depth: int = 1

    def __post_init__(self) -> None:
        if not 1 <= self.min_depth <= self.layers:
            raise ValueError(f"depths {self.min_depth}..{self.layers} are empty")
        for name in ("head_choices", "ffn_choices"):
            got = getattr(self, name)
            if not got or not all(0 < w <= 1 for w in got):
                raise ValueError(f"{name} are fractions in (0, 1], got {got}")
            object.__setattr__(self, name, tuple(sorted(set(got))))

    @property
    def depths(self) -> tuple[int, ...]:
        return tuple(range(self.min_depth, self.layers + 1))

    @property
    def largest(self) -> BertSubnet:
        return BertSubnet(self.layers, self.head_choices[-1], self.ffn_choices[-1])

    @property
    def smallest(self) -> BertSubnet:
        return BertSubnet(self.min_depth, self.head_choices[0], self.ffn_choices[0])

    def size(self) -> int:
        return len(self.depths) * len(self.head_choices) * len(self.ffn_choices)

    def check(self, subnet: BertSubnet) -> BertSubnet:
        """``subnet`` if it belongs to this space; ``ValueError`` naming the mismatch."""
        if not isinstance(subnet, BertSubnet):
            raise TypeError(f"subnet {subnet} is not a transformer subnet (L=..;H=..;F=..)")
        if subnet.depth not in self.depths:
            raise ValueError(f"subnet {subnet.key}: depth {subnet.depth} is outside "
                             f"{self.min_depth}..{self.layers}")
        for what, w, choices in (("heads", subnet.heads, self.head_choices),
                                 ("ffn", subnet.ffn, self.ffn_choices)):
            if not any(math.isclose(w, c) for c in choices):
                raise ValueError(f"subnet {subnet.key}: {what} width {w:g} is not one of "
                                 f"{', '.join(f'{c:g}' for c in choices)}")
        return subnet

    def all(self) -> Iterator[BertSubnet]:
        """Every subnet, smallest first."""
        for d, h, f in itertools.product(self.depths, self.head_choices, self.ffn_choices):
            yield BertSubnet(d, h, f)

    def sample(self, rng: np.random.Generator) -> BertSubnet:
        """One subnet drawn uniformly (depth and both widths independently)."""
        return BertSubnet(int(rng.choice(self.depths)), float(rng.choice(self.head_choices)),
                          float(rng.choice(self.ffn_choices)))

    def sandwich(self, rng: np.random.Generator, middle: int = 2) -> list[BertSubnet]:
        """The subnets one training step runs under the sandwich rule: the largest, the
        smallest and ``middle`` random ones."""
        return [self.largest, self.smallest, *(self.sample(rng) for _ in range(middle))]

    def mutate(self, subnet: BertSubnet, rng: np.random.Generator) -> BertSubnet:
        """``subnet`` with its depth or one width moved to another allowed value."""
        which = int(rng.integers(3))
        if which == 0 and len(self.depths) > 1:
            depth = int(rng.choice([d for d in self.depths if d != subnet.depth]))
            return BertSubnet(depth, subnet.heads, subnet.ffn)
        if which == 1 and len(self.head_choices) > 1:
            heads = float(rng.choice([w for w in self.head_choices if w != subnet.heads]))
            return BertSubnet(subnet.depth, heads, subnet.ffn)
        if len(self.ffn_choices) > 1:
            ffn = float(rng.choice([w for w in self.ffn_choices if w != subnet.ffn]))
            return BertSubnet(subnet.depth, subnet.heads, ffn)
        return subnet
